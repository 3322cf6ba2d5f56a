"""Run config: backends (chosen by `type`, each a vendor's config model), window, groups, staleness, retry caps, reward weights, budgets."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.backend_config import (
    STAGE_NAMES,
    AgentBackendConfig,
    BackendConfig,
    EvalBackendConfig,
    OuterBackendConfig,
    StageName,
    TrainBackendConfig,
)
from schemas.backend_registry import backend_type, stage_configs
from schemas.base import StrictModel
from schemas.config_guards import ARTIFACTS_URL_FIX, BROKER_URL_FIX, DATABASE_URL_FIX, credential_free, hide_url_credentials
from schemas.task_spec import IDENTIFIER
from schemas.urls import without_credentials


def _stage_field(stage: StageName) -> Any:
    """The annotation of one stage's table: the registered config models of that stage, picked by `type`."""
    models = stage_configs(stage)
    if len(models) == 1:
        return models[0]
    return Annotated[Union[models], Field(discriminator="type")]  # noqa: UP007 (a runtime tuple of classes)


if TYPE_CHECKING:
    AgentBackend = AgentBackendConfig
    TrainBackend = TrainBackendConfig
    EvalBackend = EvalBackendConfig
    OuterBackend = OuterBackendConfig
else:
    AgentBackend = _stage_field("agent")
    TrainBackend = _stage_field("train")
    EvalBackend = _stage_field("eval")
    OuterBackend = _stage_field("outer")


class Backends(StrictModel):
    """One backend per stage, each a vendor's config model (schemas/backend_registry.py lists the vendors)."""

    agent: AgentBackend = Field(description="Trainer-agent backend")
    train: TrainBackend = Field(description="Inner-trainer backend")
    eval: EvalBackend = Field(description="Hidden-eval scorer backend")
    outer: OuterBackend = Field(description="Outer-update backend")

    def by_stage(self) -> dict[StageName, BackendConfig]:
        """Stage name -> that stage's backend config."""
        return {"agent": self.agent, "train": self.train, "eval": self.eval, "outer": self.outer}

    @model_validator(mode="after")
    def _work_together(self) -> Backends:
        backends = self.by_stage()
        problem = backends_problem(backends)
        if problem is not None:
            raise ValueError(problem)
        refused = weights_problem(backends)
        if refused is not None:
            raise refused
        return self


class RunSection(StrictModel):
    """Identity and length of the run."""

    name: str = Field(pattern=IDENTIFIER, description="Run name (used in logs and pod names)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the run")
    tasks: list[Annotated[str, Field(pattern=IDENTIFIER)]] = Field(
        min_length=1, max_length=256, description="Task ids, resolved as <task_specs_dir>/<id>.toml, each listed once"
    )
    task_specs_dir: str = Field(default="tasks_specs", min_length=1, max_length=4096, description="Folder of task specs, relative to the config file")
    max_outer_steps: int = Field(default=5, ge=1, le=1_000_000, description="Stop after this many outer updates")
    episode_train_seconds: list[Annotated[float, Field(gt=0, le=7 * 24 * 3600)]] = Field(
        default_factory=list,
        max_length=16,
        description=(
            "Training-time caps (seconds) drawn per group of episodes, so the policy learns several budgets; each at most every task's own cap "
            "on the run's train backend. Empty: every episode has its task's cap"
        ),
    )

    @field_validator("tasks")
    @classmethod
    def _each_task_once(cls, tasks: list[str]) -> list[str]:
        first: dict[str, int] = {}
        for index, task in enumerate(tasks):
            if task in first:
                raise PydanticCustomError(
                    "duplicate_task",
                    "task '{task}' is listed twice (entries {first} and {second})",
                    {"task": task, "first": first[task], "second": index, "fix": f"list {task!r} once"},
                )
            first[task] = index
        return tasks


class WindowConfig(StrictModel):
    """How much work is kept in flight."""

    in_flight: int = Field(default=8, ge=1, le=100_000, description="Episodes kept in flight (rounded up to whole groups)")
    tick_s: float = Field(default=0.5, ge=0.01, le=60, description="Orchestrator loop period in seconds")
    batches_ahead: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description=(
            "Open training groups at most this many outer batches ahead of the step that trains on them (None: no limit, "
            "in_flight alone decides; 0: synchronous, each group trained on by the policy version that sampled it)"
        ),
    )


class OuterConfig(StrictModel):
    """Grouping, batching and staleness of the outer update."""

    group_size: int = Field(default=4, ge=1, le=1024, description="Episodes per group (same task, same policy version)")
    groups_per_batch: int = Field(default=2, ge=1, le=10_000, description="Complete groups per outer update")
    max_steps_off_policy: int = Field(default=2, ge=0, le=1000, description="Drop groups sampled more than this many versions ago")
    stale_groups: Literal["drop", "resample"] = Field(default="drop", description="What to do with a group that is too stale")
    learning_rate: float = Field(default=1e-4, gt=0, le=1.0, description="Outer learning rate")
    start_set_group_size: int = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "Episodes per training family of the run's fixed start set: untrained-policy episodes recorded before the first outer step, "
            "with seeds that do not depend on run.seed (the same set in every run), never trained on. 0: no start set"
        ),
    )
    ratio_cap: float = Field(default=2.0, ge=1.0, le=100.0, description="Truncation of the importance ratio")
    held_out_eval_every: int = Field(default=1, ge=1, le=100_000, description="Evaluate held-out tasks every K outer steps")
    held_out_group_size: int | None = Field(
        default=None, ge=1, le=1024, description="Episodes per held-out evaluation (None = group_size); larger groups measure held-out reward more precisely"
    )


class RetryConfig(StrictModel):
    """Retry caps and liveness timing."""

    max_probe_attempts: int = Field(default=3, ge=1, le=100, description="Agent submissions per episode before it ends unvalidated")
    max_stage_attempts: int = Field(default=3, ge=1, le=100, description="Infrastructure retries of one stage before the episode fails")
    lease_s: float = Field(default=30.0, ge=1.0, le=86_400, description="A claimed stage whose heartbeat is older than this is taken over")
    redispatch_after_s: float = Field(default=30.0, ge=1.0, le=86_400, description="Re-send a dispatched stage nobody claimed after this long")


class StageDeadlines(StrictModel):
    """Hard wall-clock limit of one task message per stage: a backend that hangs past it has its worker
    process killed and replaced; the stage is then retried (claim takeover) up to `retries.max_stage_attempts`.

    A train message is one submit or one poll, not the whole inner job (the backend's own caps bound that).
    """

    agent_s: float = Field(default=1800.0, ge=1.0, le=86_400, description="One agent attempt (policy sampling and tool calls)")
    probe_s: float = Field(default=600.0, ge=1.0, le=86_400, description="One probe of a submission")
    train_s: float = Field(default=600.0, ge=1.0, le=86_400, description="One submit or poll of an inner job")
    eval_s: float = Field(default=1800.0, ge=1.0, le=86_400, description="Scoring base and trained model on the hidden eval")
    outer_s: float = Field(default=3600.0, ge=1.0, le=86_400, description="One outer update")

    def for_queue(self, queue: str) -> float:
        """The limit of messages on `queue` (agent, probe, train, eval, outer)."""
        return float(getattr(self, f"{queue}_s"))


class EpisodeRewardWeights(StrictModel):
    """Weights of the episode reward (docs/architecture.md, "The reward"), the outer reward of one trainer-agent episode.

    Not the inner job's rollout reward: its component weights are `metarl.learning.grpo.RewardComponentWeights`."""

    job: float = Field(default=1.0, ge=0.0, le=100.0, description="Weight of the normalised hidden-eval improvement")
    validation: float = Field(default=0.2, ge=0.0, le=100.0, description="Weight of passing the probe early")
    efficiency: float = Field(default=0.05, ge=0.0, le=100.0, description="Weight of using few agent tokens")
    speed: float = Field(default=0.02, ge=0.0, le=100.0, description="Weight of fast training (only when the job improved)")
    validation_decay: float = Field(default=0.5, ge=0.0, le=1.0, description="Validation credit multiplier per extra attempt")
    token_scale: int = Field(default=4000, ge=1, le=10**9, description="Agent tokens at which efficiency credit is halved")
    min_headroom: float = Field(
        default=0.1,
        ge=1e-6,
        le=1.0,
        description="Least headroom (1 - base score) the job credit divides by: on a family the base nearly solves, one eval item is not worth +-1",
    )

    @model_validator(mode="after")
    def _speed_is_small(self) -> EpisodeRewardWeights:
        if self.speed > 0.5 * self.job:
            raise ValueError("speed weight must be at most half the job weight, or a fast flat job can outscore real learning")
        return self


class BudgetConfig(StrictModel):
    """Dollar caps."""

    max_run_usd: float = Field(default=100.0, ge=0.0, le=10_000_000, description="Stop launching once the run has cost this much")
    max_job_usd: float = Field(default=5.0, ge=0.0, le=1_000_000, description="Stop an inner job once it has cost this much")
    on_cap: Literal["drain", "stop"] = Field(default="drain", description="At the run cap: let running jobs finish, or stop them")


class ServicesConfig(StrictModel):
    """Where the database and broker are (environment variables override; empty = embedded default)."""

    database_url: str | None = Field(
        default=None, max_length=4096, description="SQLAlchemy URL of PostgreSQL; a user name but no password (that goes in METARL_DATABASE_URL)"
    )
    broker_url: str | None = Field(default=None, max_length=4096, description="Celery broker URL (Redis); no password (that goes in METARL_BROKER_URL)")

    @model_validator(mode="before")
    @classmethod
    def _hide_credentials(cls, data: object) -> object:
        return hide_url_credentials(data, {"database_url": True, "broker_url": True})

    @field_validator("database_url", mode="before")
    @classmethod
    def _no_database_password(cls, value: object) -> object:
        return credential_free(value, user_allowed=True, fix=DATABASE_URL_FIX)

    @field_validator("broker_url", mode="before")
    @classmethod
    def _no_broker_password(cls, value: object) -> object:
        return credential_free(value, user_allowed=True, fix=BROKER_URL_FIX)


class SandboxConfig(StrictModel):
    """Isolation of agent-written code (the probe and the local trainer's reward session; metarl/sandbox/isolation.py)."""

    min_isolation: Literal["full", "process"] = Field(
        default="full",
        description=(
            "Least isolation the deployment accepts for agent-written code: full = bubblewrap namespaces, read-only root, "
            "seccomp, rlimits; process = no namespaces (hosts that refuse them): Landlock, the same seccomp filter, the uid "
            "nobody under a root worker, rlimits (needs Linux 5.13+ with Landlock enabled). docs/security.md says what each guarantees"
        ),
    )


class ArtifactsConfig(StrictModel):
    """Where checkpoints, logs and workspaces go."""

    root: str = Field(default=".metarl/artifacts", min_length=1, max_length=4096, description="Local folder or fsspec URL (no password in it)")

    @model_validator(mode="before")
    @classmethod
    def _hide_credentials(cls, data: object) -> object:
        return hide_url_credentials(data, {"root": True})

    @field_validator("root", mode="before")
    @classmethod
    def _no_root_password(cls, value: object) -> object:
        return credential_free(value, user_allowed=True, fix=ARTIFACTS_URL_FIX)


class RunConfig(StrictModel):
    """A complete run configuration (`metarl run CONFIG`)."""

    run: RunSection
    backends: Backends
    window: WindowConfig = Field(default_factory=WindowConfig)
    outer: OuterConfig = Field(default_factory=OuterConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    deadlines: StageDeadlines = Field(default_factory=StageDeadlines)
    reward: EpisodeRewardWeights = Field(default_factory=EpisodeRewardWeights)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    services: ServicesConfig = Field(default_factory=ServicesConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)


def backends_problem(backends: Mapping[StageName, BackendConfig]) -> str | None:
    """The first reason one stage's backend gives why it cannot run beside the others (None: they combine).

    Later stages are asked first: the outer update trains what the agent samples, the eval scores what
    the train backend made, so theirs are the rules that name what they need of the earlier ones."""
    for stage in reversed(STAGE_NAMES):
        problem = backends[stage].combination_problem(backends)
        if problem is not None:
            return problem
    return None


def weights_problem(backends: Mapping[StageName, BackendConfig]) -> PydanticCustomError | None:
    """Why the eval backend cannot score what the train backend trains (its ``weights`` not in the eval's ``scores``), naming the pairs that work."""
    train, evaluate = backends["train"], backends["eval"]
    weights: str = getattr(type(train), "weights", "")
    scores: frozenset[str] = getattr(type(evaluate), "scores", frozenset())
    if weights in scores:
        return None
    evals = [backend_type(model) for model in stage_configs("eval") if weights in getattr(model, "scores", frozenset())]
    trains = [backend_type(model) for model in stage_configs("train") if getattr(model, "weights", "") in scores]
    return PydanticCustomError(
        "backend_combination",
        'backends.eval.type = "{eval}" cannot score what backends.train.type = "{train}" trains ({weights} weights; "{eval}" scores {scores} weights): '
        "every job of this run would end unscored",
        {
            "eval": evaluate.type,
            "train": train.type,
            "weights": weights,
            "scores": " or ".join(sorted(scores)),
            "fix": f"with this train backend set backends.eval.type = {' or '.join(repr(name) for name in evals)}; "
            f"or keep this eval backend with backends.train.type = {' or '.join(repr(name) for name in trains)} (docs/backends.md, the backend matrix)",
        },
    )


STORED_URL_FIELDS: dict[tuple[str, ...], bool] = {
    ("services", "database_url"): True,
    ("services", "broker_url"): True,
    ("artifacts", "root"): True,
    ("backends", "agent", "base_url"): False,
    ("backends", "outer", "base_url"): False,
}
"""The URL fields of a stored run config (path -> whether a user name alone is allowed), as the validators above check them."""


def stored_without_credentials(data: dict[str, Any]) -> dict[str, Any]:
    """A stored run config (``runs.config``) with the credentials of its URL fields removed (pure): a run stored before
    such URLs were refused still loads, and its row can be rewritten without the secret."""
    changes: dict[tuple[str, ...], str] = {}
    for path, user_allowed in STORED_URL_FIELDS.items():
        parent: Any = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        value = parent.get(path[-1]) if isinstance(parent, dict) else None
        if isinstance(value, str) and (cleaned_url := without_credentials(value, user_allowed=user_allowed)) != value:
            changes[path] = cleaned_url
    if not changes:
        return data  # the usual case, on every stage's read of its run: nothing copied
    cleaned = copy.deepcopy(data)
    for path, value in changes.items():
        parent = cleaned
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return cleaned


def stored_run_config(data: dict[str, Any]) -> RunConfig:
    """The validated config of a stored run (see :func:`stored_without_credentials`)."""
    return RunConfig.model_validate(stored_without_credentials(data))
