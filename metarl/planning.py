"""The dry run's value types and price arithmetic, shared by `metarl/dry_run.py` and each vendor's plan (`metarl/backends/<vendor>/plan.py`).

A vendor's planner gets :class:`PlanInputs` and returns its stage's :class:`StagePlan`: the cost
line, and for a train backend what it would create (pods, compiled configs, per-job costs).
Pure: no SDK, no socket, no file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.job import TrainDefaults
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

PRICE_FLAG = "--usd-per-gpu-hour"

NO_PRICE_TABLE = (
    "no offline Runpod price table: a pod's costPerHr is known only once the API has launched it; "
    f"pass {PRICE_FLAG} 'TYPE=USD' with the current list price per GPU-hour for an estimate"
)


class Frozen(BaseModel):
    """Immutable value type of the plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskLine(Frozen):
    """One task of the run as the plan uses it."""

    task_id: str = Field(min_length=1, max_length=64, description="Task id")
    held_out: bool = Field(description="Evaluated only, never in an outer batch")
    max_train_seconds: float = Field(gt=0, description="The task's training-time cap of one inner job on this run's train backend")
    allowed_models: list[str] = Field(min_length=1, max_length=16, description="Base models a job may choose")
    episodes: float = Field(ge=0, description="Episodes of this task over the run (training episodes spread evenly over the trainable tasks)")


class EpisodeCounts(Frozen):
    """How many episodes the run makes, each with one agent stage, one inner job at most and one eval."""

    max_outer_steps: int = Field(ge=1, description="run.max_outer_steps")
    groups_per_batch: int = Field(ge=1, description="outer.groups_per_batch")
    group_size: int = Field(ge=1, description="outer.group_size")
    train_episodes: int = Field(ge=0, description="max_outer_steps x groups_per_batch x group_size")
    held_out_tasks: int = Field(ge=0, description="Held-out tasks of the run")
    held_out_evals: int = Field(ge=0, description="Policy versions (0 .. max_outer_steps) at which held-out tasks are evaluated")
    held_out_group_size: int = Field(ge=1, description="outer.held_out_group_size, or group_size when unset")
    held_out_episodes: int = Field(ge=0, description="held_out_evals x held_out_tasks x held_out_group_size")
    start_set_episodes: int = Field(default=0, ge=0, description="outer.start_set_group_size x trainable tasks: the fixed start set before step 1")
    total: int = Field(ge=0, description="train_episodes + held_out_episodes + start_set_episodes")


class CostLine(Frozen):
    """The estimated cost of one stage on its backend."""

    stage: Literal["agent", "train", "eval", "outer"] = Field(description="Pipeline stage")
    backend: str = Field(min_length=1, max_length=32, description="Backend type of the stage")
    usd: float | None = Field(default=None, ge=0, description="Estimate in USD (None: unavailable, see `unavailable`)")
    upper_usd: float | None = Field(default=None, ge=0, description="Most it can cost under the configured caps (None: no bound known)")
    kind: Literal["nominal", "upper bound", "simulated", "not billed"] = Field(description="What the estimate is")
    basis: str = Field(min_length=1, max_length=2000, description="How the figures were computed")
    unavailable: str | None = Field(default=None, max_length=1000, description="Why there is no estimate")


class JobCostTerm(Frozen):
    """One part of an inner job's pod time."""

    name: Literal["image pull", "start-up", "training", "upload", "eval wait", "eval"] = Field(description="What the pod does meanwhile")
    seconds: float = Field(ge=0, description="Seconds of pod time")
    billed: bool = Field(description="Whether it is pod time of the job (False: the eval runs elsewhere)")
    usd: float | None = Field(default=None, ge=0, description="Its cost at the price it runs at (None: not estimated)")
    assumes: str = Field(min_length=1, max_length=500, description="Where the figure comes from")


class JobCost(Frozen):
    """The estimated cost of one inner job (Runpod), by pod time term."""

    task_ids: list[str] = Field(min_length=1, description="Tasks whose jobs cost this")
    gpu_count: int = Field(ge=1, le=8, description="GPUs per pod")
    gpu_type: str = Field(min_length=1, max_length=64, description="The preferred GPU type it is priced at")
    usd_per_hour: float | None = Field(default=None, ge=0, description="Pod price per hour (None: no price given)")
    terms: list[JobCostTerm] = Field(min_length=3, max_length=6, description="image pull, start-up, training, upload, eval wait, eval")
    pod_seconds: float = Field(ge=0, description="Billed pod seconds of one job")
    usd: float | None = Field(
        default=None, ge=0, description="One job's estimate, eval included when it is priced, at most budget.max_job_usd (None: no price)"
    )
    eval_included: bool = Field(description="Whether usd includes the hidden eval")
    usd_with_eval_on_pod: float | None = Field(default=None, ge=0, description="One job's estimate if the hidden eval scored on its pod (None: no price)")
    reference: str = Field(min_length=1, max_length=200, description="The reference figure it is set beside")
    fresh_pod_share: float = Field(ge=0, le=1, description="Share of the run's jobs that start on a newly created pod (and pull the image)")
    worst_pod_seconds: float = Field(ge=0, description="Pod seconds of one job when every restart happens after a start-up that timed out")
    worst_usd: float | None = Field(default=None, ge=0, description="Their cost, stopped at budget.max_job_usd (None: no price)")
    worst_assumes: str = Field(min_length=1, max_length=1000, description="How the worst case is made up")


class PodPlan(Frozen):
    """The Runpod pods of a run (none are created by a dry run)."""

    image: str = Field(min_length=1, max_length=512, description="Pod image (backends.train.image)")
    prime_rl_tag: str = Field(min_length=1, max_length=64, description="prime-rl release the image must carry")
    prime_rl_base_image: str = Field(min_length=1, max_length=512, description="prime-rl's image for that release (docker/inner.Dockerfile's base)")
    gpu_types: list[str] = Field(min_length=1, max_length=16, description="GPU types, best first; the next on a capacity error")
    gpu_count: int = Field(ge=1, le=8, description="GPUs per pod")
    cloud_type: str = Field(min_length=1, max_length=16, description="Runpod cloud")
    container_disk_gb: int = Field(ge=0, description="Container disk per pod")
    volume_gb: int = Field(ge=0, description="Volume per pod (0: none)")
    name_pattern: str = Field(min_length=1, max_length=200, description="Pod names (the run id is made when the run is created)")
    example_name: str = Field(min_length=1, max_length=200, description="A pod name of that shape")
    max_at_once: int = Field(ge=1, description="Most pods at once: min(max_pods, window.in_flight)")
    warm_pool_size: int = Field(ge=0, description="Idle pods kept for the next job")
    pods_created: int = Field(ge=0, description="Pods created with no warm pool and no restarts: one per inner job, at most one per episode")
    usd_per_gpu_hour: dict[str, float | None] = Field(
        description="Price per GPU-hour of each type, from --usd-per-gpu-hour or estimated_usd_per_gpu_hour (None: not given)"
    )
    storage_env: list[str] = Field(default_factory=list, description="Names of the worker variables each pod gets for artifact storage (values never shown)")


class CompiledJob(Frozen):
    """The rl.toml of a representative job of one or more tasks."""

    task_ids: list[str] = Field(min_length=1, description="Tasks whose representative job compiles to this rl.toml")
    job_toml: str = Field(min_length=1, description="The representative job: defaults, on the tasks' first allowed model")
    rl_toml: str = Field(min_length=1, description="The compiled rl.toml text")
    rl_config: dict[str, Any] = Field(description="The compiled rl.toml mapping")
    problems: list[str] = Field(description="Why the pinned prime-rl would reject it (empty: it validates against the derived schema and cross-field rules)")


class LocalModel(Frozen):
    """A local stand-in base model the run would build on first use."""

    name: str = Field(min_length=1, max_length=64, description="Local model name")
    stands_in_for: str = Field(min_length=1, max_length=200, description="The hub model a job names")
    scale: float = Field(gt=0, description="Pretraining scale (model_scale)")
    path: str = Field(min_length=1, description="Folder it is (or would be) cached in")
    built: bool = Field(description="Already in the cache on this machine")
    used_by: str = Field(min_length=1, max_length=200, description="Which backends load it")


class LocalModelUser(Frozen):
    """A backend that loads the local stand-in base models, and where from."""

    who: str = Field(min_length=1, max_length=200, description="Which stage and backend loads them")
    cache_dir: str | None = Field(default=None, max_length=4096, description="Its model_cache_dir (None: the default cache)")
    scale: float = Field(gt=0, le=10.0, description="Its model_scale")


class StagePlan(Frozen):
    """One stage's part of the dry-run plan, as its backend's planner gives it."""

    cost: CostLine = Field(description="The stage's estimated cost")
    pods: PodPlan | None = Field(default=None, description="Pods the train backend would create (None: none)")
    compiled: list[CompiledJob] = Field(default_factory=list, description="Compiled configs of representative jobs")
    job_costs: list[JobCost] = Field(default_factory=list, description="Cost of one inner job by term")
    job_defaults: TrainDefaults | None = Field(default=None, description="Defaults the train backend fills into a job (None: it takes none)")
    local_models: list[LocalModelUser] = Field(default_factory=list, description="Who loads local stand-in base models")
    local_note: str | None = Field(default=None, max_length=1000, description="What this stage runs on this machine, in words")
    notes: list[str] = Field(default_factory=list, description="Caveats of this stage's plan")


@dataclass(frozen=True)
class PlanInputs:
    """What every planner reads: the run config, its task specs, the episode counts, the task lines and the GPU prices."""

    config: RunConfig
    specs: dict[str, TaskSpec]
    counts: EpisodeCounts
    tasks: list[TaskLine]
    prices: dict[str, float]


def pod_usd_per_hour(gpu_type: str, gpu_count: int, prices: dict[str, float]) -> float | None:
    """Price of one pod of `gpu_count` GPUs of a type per hour, or None when the type has no price."""
    price = prices.get(gpu_type)
    return None if price is None else price * gpu_count


def inner_job_usd(seconds: float, usd_per_hour: float, max_job_usd: float) -> float:
    """One inner job's pod cost: its seconds at the pod price, stopped at budget.max_job_usd."""
    return min(seconds * usd_per_hour / 3600.0, max_job_usd)


def eval_cost_usd(eval_gpu_seconds: float, usd_per_hour: float | None) -> float | None:
    """Cost of scoring one job: its seconds at the hourly price of what it runs on (None: no price, not estimated).

    On the job's own pod the price is the whole pod's (it is billed while it scores)."""
    return None if usd_per_hour is None else eval_gpu_seconds * usd_per_hour / 3600.0


def usd(value: float | None) -> str:
    """Dollars for people: cents, or more digits for amounts under a cent."""
    if value is None:
        return "unavailable"
    return f"${value:.2f}" if value == 0 or value >= 0.01 else f"${value:.6f}"


def fine_usd(value: float | None) -> str:
    """Dollars to a hundredth of a cent (per-job figures)."""
    return "unavailable" if value is None else f"${value:.4f}"
