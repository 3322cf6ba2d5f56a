"""Local CPU backends: real GRPO inner jobs in detached trainer processes, and hidden-eval scoring.

An inner job is submitted (a process is started in its own session, its pid and start time stored)
and then polled, exactly like a cloud pod, so a killed train worker re-attaches instead of
training again. The trainer process is `python -m metarl.backends.local.job JOB_DIR`.

When the episode has a workspace (an agent wrote the job), the job trains on the agent's own
environment module: the workspace's files are copied into `JOB_DIR/workspace/` and job.json gets
a `reward` section (:class:`metarl.probe.reward_source.EnvironmentRewardSpec`), so the trainer scores
every step's rollouts with the module's `reward()` in one persistent sandboxed process. Without a
workspace (the `sim` agent writes only job.toml) the built-in graders with the job's
`[reward.components]` weights score the rollouts, as before.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from metarl.artifact_store import ArtifactStore
from metarl.backends.local.config import LocalEvalBackend, LocalTrainBackend
from metarl.backends.local.processes import process_alive, process_identity
from metarl.errors import PermanentBackendError
from metarl.graders import REWARD_COMPONENTS
from metarl.interfaces import BackendServices, BaseModelIdentity, EpisodeContext, LaunchResult, PollResult, Score
from metarl.learning.data_families import family_for, model_families
from metarl.learning.eval_secret import EVAL_SECRET_ENV, EVAL_SECRET_FILE_ENV
from metarl.learning.families import TaskFamily
from metarl.learning.runtime import THREADS_ENV, threads_per_job
from metarl.probe.job import BackendCheck
from metarl.sandbox.isolation import IsolationLevel
from schemas.backend_config import expect_config
from schemas.base import FieldProblem
from schemas.job import JobSpec
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

JOB_FILE, STATUS_FILE, LAUNCH_FILE, DATASET_FILE = "job.json", "status.json", "launch.json", "dataset.jsonl"
WORKSPACE_COPY = "workspace"
REWARD_STEP_WALL_SECONDS = 20.0
"""Deadline for the environment module to score one step's rollouts (a hang fails the job after this)."""


def reward_process_cpu_seconds(max_train_seconds: float) -> int:
    """CPU seconds for a job's persistent reward process: the training time budget, within [30, 3600]."""
    return int(min(3600, max(30, math.ceil(max_train_seconds))))


def compile_local_job(
    job: JobSpec, task: TaskSpec, model_scale: float = 1.0, *, environment_reward: bool = False, min_isolation: IsolationLevel = "full"
) -> dict[str, Any]:
    """Turn a validated job.toml into the local trainer's config (raises ValueError naming the field).

    With ``environment_reward`` the job scores rollouts with the workspace's environment module
    (a ``reward`` section naming the module in the job's copy of the workspace); the built-in
    weights stay in ``train.rewards`` for the record but are not used.
    """
    from metarl.learning.grpo import LocalTrainConfig, RewardComponentWeights

    resolved = job.resolved()
    unknown = sorted(set(job.reward.components) - set(REWARD_COMPONENTS))
    if unknown:
        raise ValueError(f"reward.components: unknown component(s) {unknown}; the local environment provides {list(REWARD_COMPONENTS)}")
    if resolved.batch_size % resolved.group_size:
        raise ValueError("training.batch_size must be a multiple of training.group_size")
    weights = {name: max(0.0, weight) for name, weight in job.reward.components.items() if name != "length_penalty"}
    if "length_penalty" in job.reward.components:
        weights["length_penalty"] = abs(job.reward.components["length_penalty"])
    config = LocalTrainConfig(
        base_model=job.model.name,
        learning_rate=resolved.learning_rate,
        max_steps=resolved.max_steps,
        batch_size=max(1, resolved.batch_size // resolved.group_size),
        group_size=resolved.group_size,
        temperature=resolved.temperature,
        max_tokens=resolved.max_tokens,
        kl_coef=resolved.kl_coef,
        lora_rank=job.model.lora_rank,
        rewards=RewardComponentWeights(**weights),
        seed=job.training.seed,
        time_budget_s=task.budget.max_train_seconds,
    )
    family = family_for(task)
    compiled: dict[str, Any] = {
        "train": config.model_dump(mode="json"),
        "family": task.family,
        "grader": dict(family.grader),
        "max_answer_chars": family.max_answer_chars,
        "task": task.model_dump(mode="json"),
        "model_scale": model_scale,
    }
    if environment_reward:
        from metarl.probe.reward_source import EnvironmentRewardSpec

        spec = EnvironmentRewardSpec(
            workspace=WORKSPACE_COPY,
            module=job.environment.module,
            step_wall_seconds=REWARD_STEP_WALL_SECONDS,
            cpu_seconds=reward_process_cpu_seconds(task.budget.max_train_seconds),
            min_isolation=min_isolation,
        )
        compiled["reward"] = spec.model_dump(mode="json")
    return compiled


def copy_workspace(files_dir: str | Path, target: Path) -> int:
    """Copy the regular files of a workspace into ``target`` with the workspace tools' confinement
    (no links followed, size caps); returns the file count. Raises WorkspaceError."""
    from metarl.workspace import read_workspace_bytes, scan_files

    files, _refused = scan_files(files_dir)
    for info in files:
        destination = target.joinpath(*info.path.split("/"))
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(read_workspace_bytes(files_dir, info.path))
    return len(files)


def local_compile_problems(job: JobSpec, task: TaskSpec) -> list[FieldProblem]:
    """The probe's check that the job compiles for the local trainer."""
    from pydantic import ValidationError

    try:
        compile_local_job(job, task)
    except ValidationError as err:
        from schemas.base import problems_from_validation

        return [problem.model_copy(update={"field": f"(local trainer) {problem.field}"}) for problem in problems_from_validation(err)]
    except ValueError as err:
        field, _, message = str(err).partition(": ")
        return [FieldProblem(field=field if message else "(job)", message=message or str(err), fix="change the job so the local trainer accepts it")]
    return []


def dataset_text(family_or_name: str | TaskFamily, size: int, difficulty: float, seed: int) -> str:
    """A training set as JSONL, from the family's generator (which never yields hidden-eval items)."""
    from metarl.learning.registry import get_family

    family = get_family(family_or_name) if isinstance(family_or_name, str) else family_or_name
    rng = random.Random(seed)
    lines = []
    for _ in range(size):
        example = family.generate(rng, difficulty)
        lines.append(json.dumps({"prompt": example.prompt, "answer": example.answer}))
    return "\n".join(lines) + "\n"


def last_log_line(path: Path) -> str:
    """The last non-empty line of a log (a trainer's exception), or a note that there is none."""
    if not path.exists():
        return "(no log)"
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(empty log; killed?)"


class LocalTrain:
    """Inner jobs as detached local trainer processes on the train host that launched them; launch is idempotent by job name.

    The job's folder is on that host (under a local root, the root's `jobs/`; else a scratch folder in the host's
    cache) and its state records the host. The host's polls keep `seen_at` fresh; when a job finishes under a remote
    store, its checkpoint and metrics are stored there. A poll that lands on another train host waits while the job's
    host is seen, and after `host_silence_s` of silence (the host is gone, with its trainer) starts the job again on
    its own host; the state lists the hosts it was lost with (`relaunched_after`).
    """

    name = "local"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> LocalTrain:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.train, LocalTrainBackend), ArtifactStore(config.artifacts.root), min_isolation=config.sandbox.min_isolation)

    @staticmethod
    def compile_checks(config: RunConfig) -> list[BackendCheck]:
        """The probe's check that the job runs on this backend's local models."""
        return [local_compile_problems]

    def __init__(self, config: LocalTrainBackend, store: ArtifactStore, *, min_isolation: IsolationLevel = "full", jobs_dir: Path | None = None):
        self.config = config
        self.store = store
        self.jobs_dir = jobs_dir if jobs_dir is not None else store.working_dir("jobs")
        self.min_isolation = min_isolation

    def capacity(self) -> int:
        return self.config.max_concurrent_jobs

    def poll_interval_s(self) -> float:
        return self.config.poll_interval_s

    def launch(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> LaunchResult:
        return LaunchResult(external_id=f"local-{job_name}", state=self._start(ctx, job, job_name))

    def _start(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> dict[str, Any]:
        """Start the job's trainer on this host unless its folder here shows it started already; the job's state."""
        job_dir = (self.jobs_dir / job_name).resolve()
        job_dir.mkdir(parents=True, exist_ok=True)
        launch_file = job_dir / LAUNCH_FILE
        if launch_file.exists():
            return json.loads(launch_file.read_text(encoding="utf-8"))
        try:
            compiled = compile_local_job(
                job, ctx.task, self.config.model_scale, environment_reward=ctx.workspace_uri is not None, min_isolation=self.min_isolation
            )
        except ValueError as err:
            raise PermanentBackendError(f"job does not compile for the local trainer: {err}") from None
        compiled["model_cache_dir"] = self.config.model_cache_dir
        if ctx.workspace_uri is not None:
            from metarl.workspace import WorkspaceError, read_workspace_bytes

            try:
                (job_dir / DATASET_FILE).write_bytes(read_workspace_bytes(ctx.workspace_uri, job.dataset.path))
            except WorkspaceError as err:
                raise PermanentBackendError(f"dataset {job.dataset.path}: {err.message}") from None
            shutil.rmtree(job_dir / WORKSPACE_COPY, ignore_errors=True)  # left by a launch interrupted before launch.json
            try:
                copy_workspace(ctx.workspace_uri, job_dir / WORKSPACE_COPY)
            except WorkspaceError as err:
                raise PermanentBackendError(f"workspace (environment module): {err.message}") from None
        else:
            (job_dir / DATASET_FILE).write_text(
                dataset_text(family_for(ctx.task), job.dataset.size, job.dataset.difficulty, job.training.seed), encoding="utf-8"
            )
        (job_dir / JOB_FILE).write_text(json.dumps(compiled, indent=2), encoding="utf-8")
        env = {key: value for key, value in os.environ.items() if not key.upper().endswith(("_KEY", "_TOKEN", "_SECRET", "_PASSWORD"))}
        env.update(
            {name: os.environ[name] for name in (EVAL_SECRET_ENV, EVAL_SECRET_FILE_ENV) if name in os.environ}
        )  # base-model pretraining keeps out of the hidden eval
        env[THREADS_ENV] = str(threads_per_job(self.config.max_concurrent_jobs, self.config.torch_threads_per_job))
        with open(job_dir / "trainer.log", "ab") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "metarl.backends.local.job", str(job_dir)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        now = time.time()
        state = {
            "job_dir": str(job_dir),
            "pid": process.pid,
            **process_identity(process.pid),
            "launched_at": now,
            "host": self.store.host,
            "seen_at": now,
        }
        temporary = launch_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(state), encoding="utf-8")
        temporary.replace(launch_file)
        return state

    def poll(self, ctx: EpisodeContext, job: JobSpec, external_id: str, state: dict[str, Any]) -> PollResult:
        if state.get("host", self.store.host) != self.store.host:
            return self._poll_from_another_host(ctx, job, external_id, state)
        state = {**state, "seen_at": time.time()}
        job_dir = Path(state["job_dir"])
        status_file = job_dir / STATUS_FILE
        if status_file.exists():
            status = json.loads(status_file.read_text(encoding="utf-8"))
            metrics = self._stored_metrics(job_dir, external_id)
            if status["status"] == "succeeded":
                checkpoint = self.store.put_tree(job_dir / "checkpoint", f"jobs/{external_id.removeprefix('local-')}/checkpoint")
                return PollResult(status="succeeded", state=state, checkpoint_uri=checkpoint, metrics_uri=metrics, train_seconds=status["train_seconds"])
            return PollResult(
                status="failed", state=state, metrics_uri=metrics, train_seconds=status.get("train_seconds"), error=status.get("error", "trainer failed")
            )
        if process_alive(state):
            return PollResult(status="running", state=state)
        if status_file.exists():
            return self.poll(ctx, job, external_id, state)
        return PollResult(status="failed", state=state, error=f"trainer process ended without a status: {last_log_line(job_dir / 'trainer.log')}")

    def _stored_metrics(self, job_dir: Path, external_id: str) -> str | None:
        """The job's metrics file as a reference in the store (None when the trainer wrote none)."""
        metrics = job_dir / "metrics.jsonl"
        if not metrics.is_file():
            return None
        return self.store.put_file(metrics, f"jobs/{external_id.removeprefix('local-')}/metrics.jsonl")

    def _poll_from_another_host(self, ctx: EpisodeContext, job: JobSpec, external_id: str, state: dict[str, Any]) -> PollResult:
        """A poll on a train host other than the job's: wait while its host polls it; start it here once that host fell silent."""
        silent_s = time.time() - float(state.get("seen_at", state.get("launched_at", 0.0)))
        if silent_s < self.config.host_silence_s:
            return PollResult(status="running", state=state)
        lost_with = [*state.get("relaunched_after", []), str(state.get("host"))]
        started = self._start(ctx, job, external_id.removeprefix("local-"))
        return PollResult(status="running", state={**started, "relaunched_after": lost_with})


class LocalEval:
    """Hidden-eval scoring with torch on the CPU, through the same prompt and grading code as every scorer."""

    name = "local"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> LocalEval:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.eval, LocalEvalBackend))

    def __init__(self, config: LocalEvalBackend):
        self.config = config

    @staticmethod
    def base_model_identity(config: LocalEvalBackend, model_name: str, task: TaskSpec) -> BaseModelIdentity:
        """The stand-in's build for the task's families at the configured scale; the seed matters for pass@k sampling."""
        from metarl.learning.models import base_model_build

        build = base_model_build(model_name, config.model_scale, families=model_families(task))
        return BaseModelIdentity(build=build, scale=config.model_scale, scorer=f"local torch seed={config.seed}")

    def _score(self, model_dir: Path, task: TaskSpec) -> Score:
        from metarl.learning.scoring import score_checkpoint

        family = family_for(task)
        items = family.hidden_eval(task.hidden_eval.n_items, task.hidden_eval.version)
        result = score_checkpoint(model_dir, family, items, pass_k=task.hidden_eval.pass_k, seed=self.config.seed)
        return Score(score=result.mean, ci_low=result.ci_low, ci_high=result.ci_high, n_items=max(1, result.n))

    def score_base(self, task: TaskSpec, model_name: str) -> Score:
        from metarl.learning.models import ensure_base_model

        base_dir = ensure_base_model(model_name, self.config.model_cache_dir, scale=self.config.model_scale, families=model_families(task))
        return self._score(base_dir, task)

    def score_trained(self, ctx: EpisodeContext, job: JobSpec, checkpoint_uri: str | None, train_state: dict[str, Any]) -> Score:
        if checkpoint_uri is None:
            raise PermanentBackendError("the inner job left no checkpoint to score")
        return self._score(Path(checkpoint_uri), ctx.task)
