"""Reward sources of the local GRPO trainer: the agent's own environment module, sandboxed.

The trainer (:func:`metarl.learning.grpo.train`) takes an optional *batch reward function*:
``reward_fn(batch) -> rewards``, where ``batch`` is a list of ``(prompt, completion, answer)``
rollouts of one step (the dataset item's prompt, the decoded completion as sampled, the item's
reference answer) and ``rewards`` has one number per rollout. Without one it uses its built-in
graders (:class:`metarl.learning.grpo.RewardComponentWeights`), exactly as before.

This module holds

- the pure contract every reward function is held to (:func:`checked_rewards`: the right count of
  rewards, each judged by :mod:`metarl.reward_rule`, the one rule the probe and the prime-rl
  environment apply too: finite numbers, rejected beyond ``RewardBounds.reject_above``, clamped to
  ``RewardBounds.clip``), and :func:`failed_job_status`, which turns a failure into the inner
  job's final status;
- :class:`SandboxRewardSource`, the reward function of a local inner job: the agent's
  ``reward(prompt, completion, answer)`` run by :mod:`metarl.sandbox.parent` with the probe's isolation
  (bubblewrap and seccomp, the workspace copy at ``/workspace``, rlimits, empty environment, the
  audit hook; see :mod:`metarl.sandbox.isolation`). In ``persistent``
  mode (the default) one sandboxed process is started per job and answers one request per step
  (:class:`metarl.sandbox.parent.SandboxSession`); in ``per_step`` mode each step starts a fresh process
  (:func:`metarl.sandbox.parent.run_calls_in_sandbox`). Measured on a shared, loaded 2-core box (niced):
  starting a sandbox and importing the module costs ~90-120 ms (70-240 ms per step inside a
  training run), a persistent request for 64 rollouts ~2 ms in a tight loop (256: ~10 ms; 1-15 ms
  per step inside a training run). A small job's step takes ~30-150 ms on an idle 2-core box
  (BENCHMARKS.md, "Inner jobs (local backends)"), so a start-up per step would cost far more than 20% of it; the persistent
  process costs a few percent.

Any failure of the module (it raises, returns NaN, infinity or a non-number, hangs past the step
deadline, runs out of memory or CPU, does something forbidden, or its process dies) raises
:class:`RewardFunctionError` with a message naming the step, the rollout and the fix; the trainer
lets it end the job, and the job writes it as its failed status. The sandbox's environment is
empty, so nothing of the trainer's environment (secrets included) can reach the module or come
back in its messages.

Semantics: the module's ``reward`` is the training reward. The job.toml weights of
``[reward.components]`` are expressed by the module itself (the local agent's rendered module
sums its ``COMPONENTS`` with those weights inside ``reward``); it is the same function the probe
checked (the correct answer must beat wrong ones).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from metarl.learning.reward_checks import (
    REWARD_FUNCTION,
    RewardBounds,
    RewardFunctionError,
    Rollout,
    describe_rollout,
)
from metarl.sandbox.isolation import IsolationLevel

if TYPE_CHECKING:
    from metarl.sandbox.parent import SandboxCall, SandboxResult, SandboxSession
    from metarl.sandbox.results import SandboxError


MAX_MESSAGE_CHARS = 1500
SIMPLE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"


class RewardStats(BaseModel):
    """How much the reward source cost over a job (written into the job's status)."""

    mode: str = Field(max_length=32, description="persistent, per_step or builtin.")
    steps: int = Field(default=0, ge=0, description="Batches scored.")
    rollouts: int = Field(default=0, ge=0, description="Rollouts scored.")
    startup_seconds: float = Field(default=0.0, ge=0.0, description="Starting the sandboxed process and importing the module.")
    seconds: float = Field(default=0.0, ge=0.0, description="Seconds spent scoring batches (start-ups included in per_step mode).")
    max_step_seconds: float = Field(default=0.0, ge=0.0, description="Slowest batch.")

    @property
    def seconds_per_step(self) -> float:
        """Mean seconds per scored batch."""
        return self.seconds / self.steps if self.steps else 0.0


class EnvironmentRewardSpec(BaseModel):
    """The ``reward`` section of a local inner job's job.json: score rollouts with the agent's module."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["environment"] = Field(default="environment", description="The agent's environment module.")
    workspace: str = Field(default="workspace", pattern=SIMPLE_NAME, description="Folder, inside the job folder, holding the copy of the agent's workspace.")
    module: str = Field(default="environment.py", pattern=SIMPLE_NAME, description="The module file inside that folder.")
    mode: Literal["persistent", "per_step"] = Field(default="persistent", description="One sandboxed process per job, or a fresh one per step.")
    step_wall_seconds: float = Field(default=20.0, gt=0.0, le=3600.0, description="Deadline for scoring one step's rollouts.")
    startup_wall_seconds: float = Field(default=15.0, gt=0.0, le=3600.0, description="Deadline for starting the sandbox and importing the module.")
    cpu_seconds: int = Field(default=600, ge=1, le=3600, description="CPU seconds of the reward process: over the whole job (persistent), per step (per_step).")
    memory_bytes: int = Field(default=512 * 1024**2, ge=64 * 1024**2, le=64 * 1024**3, description="Address-space limit of the reward process.")
    bounds: RewardBounds = Field(default_factory=RewardBounds, description="Checks and clamping of the returned rewards.")
    min_isolation: IsolationLevel = Field(
        default="full", description="Least isolation of the reward process the run accepts (the run config's [sandbox] min_isolation)."
    )


def sandbox_error_message(error: SandboxError, during: str) -> str:
    """A job-failure message from a sandbox error (kind, message, line, fix)."""
    where = f" at line {error.line}" if error.line else ""
    kind = f"{error.exception_type}: " if error.exception_type else ""
    return _cap(f"the environment module failed in the sandbox while {during} ({error.kind}){where}: {kind}{error.message}. Fix: {error.fix}")


def values_from_result(result: SandboxResult, batch: Sequence[Rollout]) -> list[Any]:
    """The raw per-rollout values of a sandboxed batch; :class:`RewardFunctionError` on any failure.

    A failure of the whole run (timeout, memory, crash of the process, forbidden, bad output)
    or of any single call (the function raised, returned something that is not JSON, NaN...)
    fails the batch; the message names the first failing rollout.
    """
    if result.error is not None:
        raise RewardFunctionError(sandbox_error_message(result.error, f"scoring {len(batch)} rollouts"))
    if len(result.calls) != len(batch):
        raise RewardFunctionError(f"the sandbox answered {len(result.calls)} of {len(batch)} rollouts")
    failures = [(index, outcome) for index, outcome in enumerate(result.calls) if not outcome.ok]
    if failures:
        index, outcome = failures[0]
        error = outcome.error
        where = f" (line {error.line})" if error is not None and error.line else ""
        kind = f"{error.exception_type}: " if error is not None and error.exception_type else ""
        detail = f"{kind}{error.message}{where}" if error is not None else "failed"
        raise RewardFunctionError(
            _cap(f"{REWARD_FUNCTION}() failed on {len(failures)} of {len(batch)} rollouts; first, rollout {index} ({describe_rollout(batch[index])}): {detail}")
        )
    return [outcome.value for outcome in result.calls]


def failed_job_status(error: RewardFunctionError, steps_completed: int, train_seconds: float, stats: RewardStats | None) -> dict[str, object]:
    """The final ``status.json`` of an inner job ended by its reward module (a clear, recorded failure)."""
    status: dict[str, object] = {
        "status": "failed",
        "error": _cap(f"reward module: {error.message}"),
        "error_kind": "reward_function",
        "steps": steps_completed,
        "train_seconds": round(max(train_seconds, 0.0), 3),
    }
    if stats is not None:
        status["reward"] = stats.model_dump(mode="json")
    return status


def _cap(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "..."


def reward_calls(batch: Sequence[Rollout]) -> list[SandboxCall]:
    """One sandbox call of ``reward(prompt, completion, answer)`` per rollout."""
    from metarl.sandbox.parent import SandboxCall

    return [SandboxCall(function=REWARD_FUNCTION, args=[prompt, completion, answer]) for prompt, completion, answer in batch]


class SandboxRewardSource:
    """The batch reward function of a local inner job: the agent's ``reward`` in the sandbox.

    Use as a context manager (``with SandboxRewardSource(folder, spec) as reward_fn:``): entering
    starts the sandboxed process and imports the module (persistent mode) or checks that a
    one-shot import works (per_step mode); leaving kills and reaps the process. Calling it scores
    one step's rollouts and returns the raw values (the trainer checks them with
    :func:`checked_rewards`). Raises :class:`RewardFunctionError` on any failure of the module,
    :class:`metarl.sandbox.parent.SandboxUnavailable` when the sandbox itself cannot run.
    """

    def __init__(self, workspace_dir: str | Path, spec: EnvironmentRewardSpec) -> None:
        self.workspace_dir = Path(workspace_dir)
        self.spec = spec
        self.stats = RewardStats(mode=spec.mode)
        self._session: SandboxSession | None = None

    def limits(self) -> Any:
        """The sandbox limits of the reward process (a :class:`metarl.sandbox.parent.SandboxLimits`)."""
        from metarl.sandbox.parent import SandboxLimits

        spec = self.spec
        per_step_cpu = max(1, min(spec.cpu_seconds, math.ceil(spec.step_wall_seconds)))
        return SandboxLimits(
            cpu_seconds=spec.cpu_seconds if spec.mode == "persistent" else per_step_cpu,
            wall_seconds=spec.startup_wall_seconds if spec.mode == "persistent" else spec.step_wall_seconds,
            memory_bytes=spec.memory_bytes,
            min_isolation=spec.min_isolation,
        )

    def __enter__(self) -> SandboxRewardSource:
        from metarl.sandbox.parent import SandboxSession, run_calls_in_sandbox

        started = time.monotonic()
        if self.spec.mode == "persistent":
            self._session = SandboxSession(self.workspace_dir, self.spec.module, self.limits())
            result = self._session.start()
        else:
            result = run_calls_in_sandbox(self.workspace_dir, self.spec.module, [], self.limits())
        self.stats = self.stats.model_copy(update={"startup_seconds": round(time.monotonic() - started, 4)})
        try:
            if result.error is not None:
                raise RewardFunctionError(sandbox_error_message(result.error, "importing it"))
            if result.exports is None or REWARD_FUNCTION not in result.exports.functions:
                raise RewardFunctionError(f"the environment module defines no function {REWARD_FUNCTION}(prompt, completion, answer)")
        except RewardFunctionError:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill and reap the reward process (persistent mode); idempotent."""
        if self._session is not None:
            self._session.close()

    def __call__(self, batch: list[Rollout]) -> list[Any]:
        """Score one step's rollouts: the module's raw return values, one per rollout."""
        from metarl.sandbox.parent import run_calls_in_sandbox

        started = time.monotonic()
        calls = reward_calls(batch)
        if self.spec.mode == "persistent":
            if self._session is None:
                raise RuntimeError("enter the reward source (with ...) before calling it")
            result = self._session.call(calls, wall_seconds=self.spec.step_wall_seconds)
        else:
            result = run_calls_in_sandbox(self.workspace_dir, self.spec.module, calls, self.limits())
        elapsed = time.monotonic() - started
        self.stats = self.stats.model_copy(
            update={
                "steps": self.stats.steps + 1,
                "rollouts": self.stats.rollouts + len(batch),
                "seconds": round(self.stats.seconds + elapsed, 4),
                "max_step_seconds": round(max(self.stats.max_step_seconds, elapsed), 4),
            }
        )
        return values_from_result(result, batch)
