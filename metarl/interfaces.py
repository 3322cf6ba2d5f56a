"""Interfaces and value types shared across layers: every backend implements these protocols; the store, the domain rules, messaging and the workers exchange these values."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import FieldProblem
from schemas.job import JobSpec
from schemas.run_config import RunConfig
from schemas.states import RunStatus
from schemas.task_spec import TaskSpec


class Frozen(BaseModel):
    """Immutable value type."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CostItem(Frozen):
    """One charge a backend incurred (recorded in the ledger under `key`)."""

    source: str = Field(min_length=1, max_length=32, description="Who charged: sim, runpod, tinker, local")
    description: str = Field(min_length=1, max_length=255, description="What was charged")
    quantity: float = Field(ge=0, le=1e15, description="How much of the unit")
    unit: str = Field(min_length=1, max_length=32, description="Unit of quantity: gpu_second, token, ...")
    unit_price_usd: float = Field(ge=0, le=1e6, description="Price of one unit")
    key: str = Field(min_length=1, max_length=255, description="Idempotency key")


class EpisodeContext(Frozen):
    """Everything a stage backend may know of the episode it works on (never the hidden eval)."""

    run_id: str = Field(min_length=1, max_length=36, description="Run id")
    episode_id: int = Field(ge=1, description="Episode id")
    task: TaskSpec = Field(description="The task spec")
    policy_version: int = Field(ge=0, description="Policy version the episode is sampled with")
    probe_attempt: int = Field(ge=1, le=1000, description="Current submission attempt")
    seed: int = Field(ge=0, description="Seed derived from the run seed and the episode")
    feedback: list[FieldProblem] = Field(default_factory=list, max_length=200, description="Probe errors of the previous attempt")
    artifacts_root: str = Field(min_length=1, max_length=4096, description="Artifact folder or URL of the run")
    policy_state_uri: str | None = Field(default=None, max_length=4096, description="Saved state of the behaviour policy version")
    workspace_uri: str | None = Field(default=None, max_length=4096, description="Agent-visible folder of the current attempt's workspace")
    train_backend: str = Field(default="local", pattern=r"^[a-z_]{1,32}$", description="The run's `backends.train.type`")
    train_on_gpu: bool = Field(default=False, description="Whether that backend trains on GPUs (picks the task's training-time cap)")

    @property
    def train_seconds(self) -> float:
        """The task's training-time cap of one inner job on the run's train backend."""
        return self.task.budget.train_seconds_for(self.train_on_gpu)


class PolicySample(Frozen):
    """One sequence sampled by the policy: prompt tokens, completion tokens, behaviour logprobs of the completion."""

    tokens: list[int] = Field(min_length=1, max_length=100_000, description="Prompt followed by completion tokens")
    logprobs: list[float] = Field(max_length=100_000, description="Behaviour logprob of each completion token")
    prompt_length: int = Field(ge=1, le=100_000, description="Number of prompt tokens at the start of `tokens`")


class AgentSubmission(Frozen):
    """What the agent submitted in one attempt."""

    job_toml: str = Field(max_length=1_000_000, description="The job.toml text as written")
    agent_tokens: int = Field(ge=0, le=10**12, description="Policy tokens spent on this attempt")
    workspace_uri: str | None = Field(default=None, max_length=4096, description="Where the workspace was saved")
    costs: list[CostItem] = Field(default_factory=list, max_length=1000, description="Charges of this attempt")
    sample: PolicySample | None = Field(default=None, description="Sampled tokens and behaviour logprobs, for the outer update")


class LaunchResult(Frozen):
    """A launched inner job (idempotent by name)."""

    external_id: str = Field(min_length=1, max_length=255, description="Pod id, process id or simulated id")
    state: dict[str, Any] = Field(default_factory=dict, description="Backend state needed to re-attach")


class PollResult(Frozen):
    """Status of an inner job at one poll."""

    status: Literal["running", "succeeded", "failed"] = Field(description="Mapped status")
    state: dict[str, Any] = Field(default_factory=dict, description="Updated backend state")
    checkpoint_uri: str | None = Field(default=None, max_length=4096, description="Trained weights, when succeeded")
    metrics_uri: str | None = Field(default=None, max_length=4096, description="metrics.jsonl location")
    train_seconds: float | None = Field(default=None, ge=0, description="Wall seconds of training, when finished")
    error: str | None = Field(default=None, max_length=10_000, description="Why it failed")
    costs: list[CostItem] = Field(default_factory=list, max_length=100_000, description="Charges so far (idempotent keys)")


class Score(Frozen):
    """A hidden-eval score with its 95% confidence interval."""

    score: float = Field(ge=0, le=1, description="Mean graded score")
    ci_low: float | None = Field(default=None, ge=0, le=1, description="95% CI low")
    ci_high: float | None = Field(default=None, ge=0, le=1, description="95% CI high")
    n_items: int = Field(ge=1, description="Items scored")
    costs: list[CostItem] = Field(default_factory=list, max_length=1000, description="Charges of scoring")


class BaseModelIdentity(Frozen):
    """What an eval backend's base score depends on besides the task: the built model and the scorer's settings."""

    build: str = Field(min_length=1, max_length=200, description="The built model: content hash of a local stand-in's build, hub name@revision, or `simulator`")
    scale: float = Field(gt=0.0, le=10.0, description="Pretraining scale of a local stand-in (1 where the backend has none)")
    scorer: str = Field(min_length=1, max_length=200, description="Scorer settings that change a score (engine, dtype, sampling seed)")


class BaseScoreKey(Frozen):
    """Everything a cached base score depends on: a stored score is reused only for an equal key (`metarl.store.baselines`)."""

    task_id: str = Field(min_length=1, max_length=64, description="Task id")
    model_name: str = Field(min_length=1, max_length=200, description="Base model as the job names it")
    model_build: str = Field(min_length=1, max_length=200, description="BaseModelIdentity.build")
    model_scale: float = Field(gt=0.0, le=10.0, description="BaseModelIdentity.scale")
    eval_version: int = Field(ge=1, description="hidden_eval.version")
    eval_items: int = Field(ge=1, description="hidden_eval.n_items")
    pass_k: int = Field(ge=1, le=64, description="hidden_eval.pass_k")
    grader: str = Field(min_length=1, max_length=64, description="The task family's grader and the version of its code")
    backend: str = Field(min_length=1, max_length=32, description="Eval backend name")
    scorer: str = Field(min_length=1, max_length=200, description="BaseModelIdentity.scorer")


class OuterBatchEpisode(Frozen):
    """One episode of an outer batch."""

    episode_id: int = Field(ge=1, description="Episode id")
    group_id: int = Field(ge=1, description="Group id")
    policy_version: int = Field(ge=0, description="Behaviour policy version")
    reward: float = Field(ge=-1000, le=1000, description="Episode reward")
    samples: list[PolicySample] = Field(default_factory=list, max_length=1000, description="The episode's sampled attempts")


class OuterResult(Frozen):
    """What an outer update produced."""

    state_uri: str | None = Field(default=None, max_length=4096, description="Saved policy state of the new version")
    metrics: dict[str, float] = Field(default_factory=dict, description="Loss, ratio statistics, ...")
    costs: list[CostItem] = Field(default_factory=list, max_length=1000, description="Charges of the update")


class AgentBackend(Protocol):
    name: str
    simulated: bool

    def run_attempt(self, ctx: EpisodeContext, baseline: Callable[[str], float] | None = None) -> AgentSubmission:
        """One submission attempt; ``baseline`` answers the workspace's ``baseline_score(model)`` tool."""
        ...


class TrainBackend(Protocol):
    name: str
    simulated: bool

    def capacity(self) -> int: ...

    def launch(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> LaunchResult: ...

    def poll(self, ctx: EpisodeContext, job: JobSpec, external_id: str, state: dict[str, Any]) -> PollResult: ...

    def poll_interval_s(self) -> float: ...


class EvalBackend(Protocol):
    name: str
    simulated: bool

    @staticmethod
    def base_model_identity(config: Any, model_name: str, task: TaskSpec) -> BaseModelIdentity:
        """What this backend's base score of ``model_name`` on ``task`` depends on, from its config alone (no backend is built)."""
        ...

    def score_base(self, task: TaskSpec, model_name: str) -> Score: ...

    def score_trained(self, ctx: EpisodeContext, job: JobSpec, checkpoint_uri: str | None, train_state: dict[str, Any]) -> Score: ...


class OuterBackend(Protocol):
    name: str
    simulated: bool

    def update(self, run_id: str, step: int, version: int, batch: list[OuterBatchEpisode], config: RunConfig, base_state_uri: str | None) -> OuterResult: ...

    def initial_state(self, run_id: str, config: RunConfig) -> str | None: ...


class BackendServices(Protocol):
    """What the composition (metarl/composition.py) hands a backend class that builds itself from the run config."""

    def runpod_runs(self) -> RunpodRuns | None:
        """The run database as the Runpod backend sees it (None without a database)."""
        ...


@runtime_checkable
class HoldsRunResources(Protocol):
    """A train backend that holds resources for a run after its jobs end (warm pods) and can give them back."""

    def release_run(self, run_id: str) -> int:
        """Give back what ``run_id`` still holds; returns how many were released."""
        ...


# --- what the Runpod backend needs of the run database (the store implements it: metarl/store/runpod_runs.py) ---


@dataclass(frozen=True)
class RunState:
    """What decides whether a run still launches jobs: its status and whether a stop was asked for."""

    status: RunStatus
    stop_requested: bool


@dataclass(frozen=True)
class ReapView:
    """What the orphan reaper needs of the run a pod's name leads to: the run, its config and its live jobs' names
    (launching or running, their episode still at train)."""

    run_id: str
    status: RunStatus
    config: RunConfig
    live_jobs: frozenset[str]


class RunpodRuns(Protocol):
    """The run database as the Runpod backend sees it."""

    name: str
    """Which database this is: a key for what a process keeps per database (the reaper's last run)."""

    def record_costs(self, run_id: str, episode_id: int | None, items: list[CostItem]) -> None:
        """Write charges to the ledger now, each once (a replayed charge is not billed again)."""
        ...

    def run_total_usd(self, run_id: str) -> float:
        """Dollars recorded for the run so far."""
        ...

    def run_state(self, run_id: str) -> RunState | None:
        """The run's status and stop request (None: no such run)."""
        ...

    def base_score_cached(self, task: TaskSpec, model_name: str, eval_backend: str, identity: BaseModelIdentity) -> bool:
        """Whether the base score of (task, model) with this eval backend and identity is stored."""
        ...

    def holding_lock(self, key: int) -> AbstractContextManager[None]:
        """Hold the cross-process lock `key` for the block (waiting for it)."""
        ...

    def trying_lock(self, key: int) -> AbstractContextManager[bool]:
        """Try the cross-process lock `key` without waiting: the block gets whether it holds it (and holds it to its end)."""
        ...

    def reap_view(self, run_key: str) -> ReapView | None:
        """The run whose id starts with `run_key` (a pod name's run part), or None when no single run of this database does."""
        ...
