"""`metarl run CONFIG --dry-run`: what a run would launch and roughly what it would cost, calling no API.

The plan is built from the loaded run config and task specs only: no vendor SDK is imported, no
socket is opened, no service is started and nothing is written. What it holds:

- the episode count: ``max_outer_steps x groups_per_batch x group_size`` training episodes, plus a
  group of held-out episodes per held-out task at every policy version the held-out eval runs at;
- for Runpod inner jobs, the pods (image, GPU types, names, how many at once) and the prime-rl
  ``rl.toml`` of a representative job per task (the default job on the task's first allowed model,
  compiled as the train backend compiles it and checked against the pinned schema);
- for local and vLLM scoring, the local base models that would be built, and where;
- a cost estimate per stage against ``budget.max_run_usd``, and whether that cap would bind.

There is no offline Runpod price table (a pod's ``costPerHr`` is known only once the API launched
it), so the Runpod line needs prices from the operator (``backends.train.estimated_usd_per_gpu_hour``
in the config, or ``--usd-per-gpu-hour TYPE=USD``, which wins); without them it says so and gives only the worst case that ``budget.max_job_usd`` allows. Tinker token
costs are upper bounds from the configured turn and context caps. Everything but
:func:`local_models` (which looks whether a base model is already in the cache) is pure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import ConfigError, FieldProblem, dump_toml_model, printable
from schemas.job import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_STEPS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    JobModel,
    JobSpec,
    TrainDefaults,
    train_defaults,
)
from schemas.run_config import (
    BudgetConfig,
    LocalEvalBackend,
    LocalTrainBackend,
    PodVllmEvalBackend,
    RunConfig,
    RunpodTrainBackend,
    SimAgentBackend,
    SimTrainBackend,
    TinkerAgentBackend,
    TinkerOuterBackend,
    VllmEvalBackend,
)
from schemas.task_spec import TaskSpec

POD_STARTUP_S = 300.0
POD_STARTUP_ASSUMES = (
    "pod start to the first metrics row: container start, model download and load, vLLM engine start, the first step "
    "(assumed; a fresh pod's first pull of the image comes on top, a warm pool pod skips it)"
)
POD_UPLOAD_S = 60.0
POD_UPLOAD_ASSUMES = "stopping rl and uploading weights/step_N (about 1.2 GB bf16 for Qwen3-0.6B, 3.4 GB for 1.7B), logs and metrics (assumed)"
REFERENCE_USD_PER_JOB = (0.13, 0.30)
"""The reference run's cost of one inner job on a pod of two A40s, to set the estimate beside."""
EVAL_ON_THE_JOB_POD: frozenset[str] = frozenset({"pod_vllm"})
"""``backends.eval.type`` values that score on the inner job's own pod after training, billed at its
price; other eval backends run on hosts the ledger does not bill."""

PRICE_FLAG = "--usd-per-gpu-hour"
MAX_GPU_USD_PER_HOUR = 1000.0
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
    total: int = Field(ge=0, description="train_episodes + held_out_episodes")


class CostLine(Frozen):
    """The estimated cost of one stage on its backend."""

    stage: Literal["agent", "train", "eval", "outer"] = Field(description="Pipeline stage")
    backend: str = Field(min_length=1, max_length=32, description="Backend type of the stage")
    usd: float | None = Field(default=None, ge=0, description="Estimate in USD (None: unavailable, see `unavailable`)")
    upper_usd: float | None = Field(default=None, ge=0, description="Most it can cost under the configured caps (None: no bound known)")
    kind: Literal["nominal", "upper bound", "simulated", "not billed"] = Field(description="What the estimate is")
    basis: str = Field(min_length=1, max_length=2000, description="How the figures were computed")
    unavailable: str | None = Field(default=None, max_length=1000, description="Why there is no estimate")


class CapCheck(Frozen):
    """The estimate against the run's dollar caps."""

    max_run_usd: float = Field(ge=0, description="budget.max_run_usd")
    max_job_usd: float = Field(ge=0, description="budget.max_job_usd")
    on_cap: str = Field(min_length=1, max_length=16, description="budget.on_cap")
    binds: Literal["yes", "may", "no", "unknown"] = Field(
        description="yes: the estimate is over the cap; may: only the worst case is; no: not even the worst case; unknown: no estimate"
    )
    episodes_within_cap: int | None = Field(default=None, ge=0, description="About how many episodes the cap pays for when it binds")
    message: str = Field(min_length=1, max_length=1000, description="The verdict in words")


class JobCostTerm(Frozen):
    """One part of an inner job's pod time."""

    name: Literal["start-up", "training", "upload", "eval"] = Field(description="What the pod does meanwhile")
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
    terms: list[JobCostTerm] = Field(min_length=3, max_length=4, description="start-up, training, upload, eval")
    pod_seconds: float = Field(ge=0, description="Billed pod seconds of one job")
    usd: float | None = Field(
        default=None, ge=0, description="One job's estimate, eval included when it is priced, at most budget.max_job_usd (None: no price)"
    )
    eval_included: bool = Field(description="Whether usd includes the hidden eval")
    usd_with_eval_on_pod: float | None = Field(default=None, ge=0, description="One job's estimate if the hidden eval scored on its pod (None: no price)")
    reference: str = Field(min_length=1, max_length=200, description="The reference figure it is set beside")


class CostEstimate(Frozen):
    """Episodes, cost per stage, totals and the cap check."""

    episodes: EpisodeCounts = Field(description="Episode counts")
    lines: list[CostLine] = Field(min_length=4, max_length=4, description="One line per stage")
    total_usd: float | None = Field(default=None, ge=0, description="Sum of the estimates (None when a line is unavailable)")
    upper_usd: float | None = Field(default=None, ge=0, description="Sum of the worst cases (None when a line has no bound)")
    cap: CapCheck = Field(description="The estimate against budget.max_run_usd")


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


class DryRunPlan(Frozen):
    """Everything `metarl run CONFIG --dry-run` prints."""

    config_path: str = Field(min_length=1, description="The run config")
    run_name: str = Field(min_length=1, description="run.name")
    backends: dict[str, str] = Field(description="Stage -> backend type")
    tasks: list[TaskLine] = Field(min_length=1, description="The run's tasks")
    services: str = Field(min_length=1, description="Where the database and broker would be (not contacted)")
    artifacts_root: str = Field(min_length=1, description="artifacts.root")
    pods: PodPlan | None = Field(default=None, description="Runpod pods (None: no pods)")
    compiled: list[CompiledJob] = Field(default_factory=list, description="prime-rl configs of representative jobs (Runpod only)")
    job_defaults: TrainDefaults | None = Field(default=None, description="Learning rate and kl_coef defaults of the train backend (None: it takes no job)")
    job_costs: list[JobCost] = Field(default_factory=list, description="Cost of one inner job by pod-time term (Runpod only)")
    local_models: list[LocalModel] = Field(default_factory=list, description="Local base models the run would use")
    local_note: str | None = Field(default=None, description="What runs on this machine")
    estimate: CostEstimate = Field(description="Cost estimate and cap check")
    notes: list[str] = Field(default_factory=list, description="Caveats of the plan")


# --- prices from the command line ----------------------------------------------------------


def parse_gpu_prices(values: list[str], backend: object, source: str) -> dict[str, float]:
    """Price per GPU-hour by type: the config's ``estimated_usd_per_gpu_hour``, overridden by each
    `TYPE=USD` flag value; ConfigError naming the flag for a bad value."""
    configured = dict(backend.estimated_usd_per_gpu_hour) if isinstance(backend, RunpodTrainBackend) else {}
    if not values:
        return configured
    if not isinstance(backend, RunpodTrainBackend):
        raise ConfigError(
            source,
            [FieldProblem(field=PRICE_FLAG, message="only Runpod inner jobs have GPU prices", fix=f'drop {PRICE_FLAG}, or set backends.train.type = "runpod"')],
        )
    prices = configured
    for value in values:
        gpu, sep, price_text = value.rpartition("=")
        gpu = gpu.strip()
        try:
            price = float(price_text) if sep else math.nan
        except ValueError:
            price = math.nan
        if not sep or not gpu or not (0.0 <= price <= MAX_GPU_USD_PER_HOUR):
            raise ConfigError(
                source,
                [
                    FieldProblem(
                        field=PRICE_FLAG,
                        message=f"{value!r} is not TYPE=USD with a price in [0, {MAX_GPU_USD_PER_HOUR:g}]",
                        fix=f"write e.g. {PRICE_FLAG} 'NVIDIA A40=0.44'",
                    )
                ],
            )
        if gpu not in backend.gpu_types:
            raise ConfigError(
                source,
                [
                    FieldProblem(
                        field=PRICE_FLAG,
                        message=f"{gpu!r} is not one of backends.train.gpu_types {backend.gpu_types}",
                        fix="use a GPU type of backends.train.gpu_types, spelled as there",
                    )
                ],
            )
        prices[gpu] = price
    return prices


# --- episode counts and the estimate maths (pure) -------------------------------------------


def held_out_eval_points(max_outer_steps: int, every: int) -> int:
    """Policy versions 0 .. max_outer_steps at which the orchestrator opens held-out groups (version % every == 0)."""
    return max_outer_steps // every + 1


def episode_counts(config: RunConfig, specs: dict[str, TaskSpec]) -> EpisodeCounts:
    """Episodes of a run that finishes all its outer steps with no stale group dropped."""
    outer = config.outer
    train = config.run.max_outer_steps * outer.groups_per_batch * outer.group_size
    held_out_tasks = sum(1 for spec in specs.values() if spec.held_out)
    evals = held_out_eval_points(config.run.max_outer_steps, outer.held_out_eval_every) if held_out_tasks else 0
    held_out_size = outer.held_out_group_size or outer.group_size
    held_out = evals * held_out_tasks * held_out_size
    return EpisodeCounts(
        max_outer_steps=config.run.max_outer_steps,
        groups_per_batch=outer.groups_per_batch,
        group_size=outer.group_size,
        train_episodes=train,
        held_out_tasks=held_out_tasks,
        held_out_evals=evals,
        held_out_group_size=held_out_size,
        held_out_episodes=held_out,
        total=train + held_out,
    )


def task_lines(config: RunConfig, specs: dict[str, TaskSpec], counts: EpisodeCounts) -> list[TaskLine]:
    """Each task with its episodes: training groups go round-robin over the trainable tasks (spread evenly here)."""
    trainable = [task_id for task_id, spec in specs.items() if not spec.held_out]
    per_held_out = counts.held_out_evals * counts.held_out_group_size
    return [
        TaskLine(
            task_id=task_id,
            held_out=spec.held_out,
            max_train_seconds=spec.budget.train_seconds_for(config.backends.train.type),
            allowed_models=list(spec.budget.allowed_models),
            episodes=float(per_held_out) if spec.held_out else counts.train_episodes / len(trainable),
        )
        for task_id, spec in specs.items()
    ]


def pod_usd_per_hour(gpu_type: str, gpu_count: int, prices: dict[str, float]) -> float | None:
    """Price of one pod of `gpu_count` GPUs of a type per hour, or None when the type has no price."""
    price = prices.get(gpu_type)
    return None if price is None else price * gpu_count


def inner_job_usd(seconds: float, usd_per_hour: float, max_job_usd: float) -> float:
    """One inner job's pod cost: its seconds at the pod price, stopped at budget.max_job_usd."""
    return min(seconds * usd_per_hour / 3600.0, max_job_usd)


def tinker_attempt_tokens(agent: TinkerAgentBackend) -> tuple[int, int]:
    """(prompt, sampled) tokens of one attempt at most: every turn re-sends a full context and samples its cap."""
    prompt = agent.max_turns * agent.context_window()
    sampled = min(agent.max_turns * agent.max_tokens_per_turn, agent.context_window())
    return prompt, sampled


def tinker_attempt_usd(agent: TinkerAgentBackend) -> float:
    """Most one Tinker agent attempt can cost at the configured prices."""
    prompt, sampled = tinker_attempt_tokens(agent)
    return (prompt * agent.usd_per_million_prompt_tokens + sampled * agent.usd_per_million_sample_tokens) / 1e6


def tinker_update_tokens(outer: TinkerOuterBackend, agent: TinkerAgentBackend, batch_episodes: int, max_attempts: int) -> int:
    """Most tokens one outer update sends through the model: every attempt a full context (the built-in loss needs one pass)."""
    return batch_episodes * max_attempts * agent.context_window()


def eval_pod_seconds(config: RunConfig, task: TaskSpec) -> float:
    """Pod seconds of one job's hidden eval with vLLM (:func:`metarl.backends.runpod.eval.estimate_eval_seconds`, with the run's
    on-pod eval settings or their defaults), rounded up to a second; the first job of each (task, model) also scores the base model."""
    from metarl.backends.runpod.eval import estimate_eval_seconds

    backend = config.backends.eval if isinstance(config.backends.eval, PodVllmEvalBackend) else PodVllmEvalBackend(type="pod_vllm")
    return float(math.ceil(estimate_eval_seconds(task, backend, score_base=False)))


def eval_cost_usd(eval_gpu_seconds: float, usd_per_hour: float | None) -> float | None:
    """Cost of scoring one job: its seconds at the hourly price of what it runs on (None: no price, not estimated).

    On the job's own pod the price is the whole pod's (it is billed while it scores)."""
    return None if usd_per_hour is None else eval_gpu_seconds * usd_per_hour / 3600.0


def eval_on_job_pod(config: RunConfig) -> bool:
    """Whether the hidden eval scores on the inner job's pod (billed there) rather than on separate hosts."""
    return isinstance(config.backends.train, RunpodTrainBackend) and config.backends.eval.type in EVAL_ON_THE_JOB_POD


def job_cost(task: TaskSpec, config: RunConfig, usd_per_hour: float | None) -> JobCost:
    """One inner job of a task on a Runpod pod: start-up + training cap + upload (+ the eval when it runs on the pod)."""
    backend = config.backends.train
    assert isinstance(backend, RunpodTrainBackend)
    on_pod = eval_on_job_pod(config)
    cap = task.budget.train_seconds_for(backend.type)
    eval_seconds = eval_pod_seconds(config, task)

    def at_pod_price(seconds: float) -> float | None:
        return None if usd_per_hour is None else seconds * usd_per_hour / 3600.0

    if on_pod:
        eval_usd, eval_assumes = eval_cost_usd(eval_seconds, usd_per_hour), "scored on the job's pod after training, at the pod's price"
    else:
        would = eval_cost_usd(eval_seconds, usd_per_hour)
        elsewhere = f"; scoring on the job's pod would add {fine_usd(would)}" if would is not None else ""
        eval_usd, eval_assumes = (
            None,
            f"not estimated: backends.eval.type = {config.backends.eval.type!r} scores on your own GPU eval hosts, which have no price here{elsewhere}",
        )
    engine = config.backends.eval if isinstance(config.backends.eval, PodVllmEvalBackend) else PodVllmEvalBackend(type="pod_vllm")
    eval_assumes = (
        f"{eval_assumes} ({engine.engine_start_s:g} s vLLM engine start + {task.hidden_eval.n_items} items x pass@{task.hidden_eval.pass_k} "
        f"at {engine.tokens_per_s:g} tokens/s, assumed; the first job of each task and model also scores the base)"
    )
    terms = [
        JobCostTerm(name="start-up", seconds=POD_STARTUP_S, billed=True, usd=at_pod_price(POD_STARTUP_S), assumes=POD_STARTUP_ASSUMES),
        JobCostTerm(
            name="training",
            seconds=cap,
            billed=True,
            usd=at_pod_price(cap),
            assumes="the task's budget.max_gpu_train_seconds, counted from the first metrics row; rl is stopped there (a job that finishes max_steps sooner costs less)",
        ),
        JobCostTerm(name="upload", seconds=POD_UPLOAD_S, billed=True, usd=at_pod_price(POD_UPLOAD_S), assumes=POD_UPLOAD_ASSUMES),
        JobCostTerm(name="eval", seconds=eval_seconds, billed=on_pod, usd=eval_usd, assumes=eval_assumes),
    ]
    pod_seconds = sum(term.seconds for term in terms if term.billed)
    train_usd = at_pod_price(POD_STARTUP_S + cap + POD_UPLOAD_S)
    total = None if train_usd is None else min(train_usd, config.budget.max_job_usd) + (eval_usd if on_pod and eval_usd is not None else 0.0)
    on_pod_eval = eval_cost_usd(eval_seconds, usd_per_hour)
    low, high = REFERENCE_USD_PER_JOB
    return JobCost(
        task_ids=[task.id],
        gpu_count=backend.gpu_count,
        gpu_type=backend.gpu_types[0],
        usd_per_hour=usd_per_hour,
        terms=terms,
        pod_seconds=pod_seconds,
        usd=total,
        eval_included=on_pod and eval_usd is not None,
        usd_with_eval_on_pod=None if train_usd is None or on_pod_eval is None else min(train_usd, config.budget.max_job_usd) + on_pod_eval,
        reference=f"the reference run: ${low:.2f}-{high:.2f} per job on 2x A40 pods",
    )


def job_costs(config: RunConfig, specs: dict[str, TaskSpec], prices: dict[str, float]) -> list[JobCost]:
    """The per-job cost of each task (Runpod only), tasks with identical figures together."""
    backend = config.backends.train
    if not isinstance(backend, RunpodTrainBackend):
        return []
    price = pod_usd_per_hour(backend.gpu_types[0], backend.gpu_count, prices)
    grouped: dict[str, JobCost] = {}
    for spec in specs.values():
        cost = job_cost(spec, config, price)
        key = cost.model_copy(update={"task_ids": ["-"]}).model_dump_json()
        if key in grouped:
            grouped[key] = grouped[key].model_copy(update={"task_ids": [*grouped[key].task_ids, spec.id]})
        else:
            grouped[key] = cost
    return list(grouped.values())


def train_line(config: RunConfig, specs: dict[str, TaskSpec], tasks: list[TaskLine], counts: EpisodeCounts, prices: dict[str, float]) -> CostLine:
    """Cost of the inner jobs: one per episode (an episode whose job fails the probe launches none)."""
    backend, budget = config.backends.train, config.budget
    if isinstance(backend, RunpodTrainBackend):
        upper = counts.total * budget.max_job_usd
        cap_note = f"at most budget.max_job_usd ${budget.max_job_usd:.2f} per job, ${upper:.2f} for {counts.total} jobs"
        preferred = backend.gpu_types[0]
        pod_price = pod_usd_per_hour(preferred, backend.gpu_count, prices)
        if pod_price is None:
            return CostLine(
                stage="train", backend="runpod", upper_usd=upper, kind="nominal", basis=cap_note, unavailable=f"{NO_PRICE_TABLE} (no price for {preferred!r})"
            )
        usd = sum(task.episodes * inner_job_usd(POD_STARTUP_S + task.max_train_seconds + POD_UPLOAD_S, pod_price, budget.max_job_usd) for task in tasks)
        seconds = sorted({task.max_train_seconds for task in tasks})
        fallback = [price for gpu in backend.gpu_types[1:] if (price := pod_usd_per_hour(gpu, backend.gpu_count, prices)) is not None]
        fallback_note = f"; a fallback GPU type costs up to ${max(fallback):.4f}/h" if fallback and max(fallback) > pod_price else ""
        basis = (
            f"one job per episode: {POD_STARTUP_S:g} s start-up + the task's budget.max_gpu_train_seconds ({'/'.join(f'{s:g}' for s in seconds)} s) "
            f"+ {POD_UPLOAD_S:g} s upload on {backend.gpu_count}x {preferred} at ${pod_price:.4f}/h{fallback_note}; "
            f"restarts and a fresh pod's image pull are not included; {cap_note}"
        )
        return CostLine(stage="train", backend="runpod", usd=usd, upper_usd=max(upper, usd), kind="nominal", basis=basis)
    if isinstance(backend, SimTrainBackend):
        per_s = backend.usd_per_hour / 3600.0
        usd = counts.total * backend.duration.median_s * per_s
        upper = counts.total * backend.duration.max_s * per_s
        basis = f"[SIMULATOR] one simulated job per episode, median {backend.duration.median_s:g} s (at most {backend.duration.max_s:g} s) at ${backend.usd_per_hour:.2f}/h"
        return CostLine(stage="train", backend="sim", usd=usd, upper_usd=upper, kind="simulated", basis=basis)
    return CostLine(stage="train", backend=backend.type, usd=0.0, upper_usd=0.0, kind="not billed", basis="GRPO processes on this machine's CPU")


def agent_line(config: RunConfig, counts: EpisodeCounts) -> CostLine:
    """Cost of the trainer agent's attempts (up to retries.max_probe_attempts per episode)."""
    backend, attempts = config.backends.agent, config.retries.max_probe_attempts
    if isinstance(backend, TinkerAgentBackend):
        prompt, sampled = tinker_attempt_tokens(backend)
        usd = counts.total * attempts * tinker_attempt_usd(backend)
        basis = (
            f"upper bound: {counts.total} episodes x {attempts} attempts (retries.max_probe_attempts), each {backend.max_turns} turns re-sending a full "
            f"{backend.max_context_tokens}-token context ({prompt} prompt tokens at ${backend.usd_per_million_prompt_tokens:g}/M) and sampling {sampled} tokens "
            f"(at ${backend.usd_per_million_sample_tokens:g}/M): the bound assumes every attempt uses every turn at the full context"
        )
        return CostLine(stage="agent", backend="tinker", usd=usd, upper_usd=usd, kind="upper bound", basis=basis)
    if isinstance(backend, SimAgentBackend):
        usd = counts.total * backend.tokens_mean * backend.usd_per_million_tokens / 1e6
        upper = 0.0 if backend.usd_per_million_tokens == 0 else None
        basis = f"[SIMULATOR] one attempt per episode of {backend.tokens_mean} tokens on average at ${backend.usd_per_million_tokens:g}/M (invalid jobs add attempts)"
        return CostLine(stage="agent", backend="sim", usd=usd, upper_usd=upper, kind="simulated", basis=basis)
    return CostLine(stage="agent", backend=backend.type, usd=0.0, upper_usd=0.0, kind="not billed", basis="the local torch policy on this machine's CPU")


def outer_line(config: RunConfig, counts: EpisodeCounts) -> CostLine:
    """Cost of the outer updates (one per outer step, on the training episodes of its batch)."""
    backend, agent = config.backends.outer, config.backends.agent
    if isinstance(backend, TinkerOuterBackend) and isinstance(agent, TinkerAgentBackend):
        batch = config.outer.groups_per_batch * config.outer.group_size
        tokens = tinker_update_tokens(backend, agent, batch, config.retries.max_probe_attempts)
        usd = counts.max_outer_steps * tokens * backend.usd_per_million_train_tokens / 1e6
        basis = (
            f"upper bound: {counts.max_outer_steps} updates x {tokens} tokens ({batch} episodes x {config.retries.max_probe_attempts} attempts x "
            f"{agent.max_context_tokens} tokens) at ${backend.usd_per_million_train_tokens:g}/M; "
            "a recovery after a failed update trains again"
        )
        return CostLine(stage="outer", backend="tinker", usd=usd, upper_usd=usd, kind="upper bound", basis=basis)
    where = "[SIMULATOR] no charge" if backend.type == "sim" else "the local policy update on this machine's CPU"
    return CostLine(stage="outer", backend=backend.type, usd=0.0, upper_usd=0.0, kind="not billed", basis=where)


def eval_line(config: RunConfig, specs: dict[str, TaskSpec], tasks: list[TaskLine], prices: dict[str, float]) -> CostLine:
    """Cost of the hidden eval: billed at the pod's price when it scores on the job's pod; otherwise not in the ledger."""
    backend, train = config.backends.eval, config.backends.train
    pod_price = pod_usd_per_hour(train.gpu_types[0], train.gpu_count, prices) if isinstance(train, RunpodTrainBackend) else None
    per_job = {task.task_id: eval_pod_seconds(config, specs[task.task_id]) for task in tasks}
    seconds = "/".join(f"{value:g}" for value in sorted(set(per_job.values())))
    if eval_on_job_pod(config):
        # budget.max_job_usd counts the eval's pod seconds too: the train line's worst case already bounds them
        within_cap = "its worst case is inside the train line's (budget.max_job_usd counts the eval's pod seconds)"
        if pod_price is None:
            return CostLine(
                stage="eval",
                backend=backend.type,
                upper_usd=0.0,
                kind="nominal",
                basis=f"{seconds} s per job on the job's pod; {within_cap}",
                unavailable=NO_PRICE_TABLE,
            )
        total = sum(task.episodes * (eval_cost_usd(per_job[task.task_id], pod_price) or 0.0) for task in tasks)
        basis = f"one scoring per job on its pod after training, {seconds} s at ${pod_price:.4f}/h (estimate); {within_cap}"
        return CostLine(stage="eval", backend=backend.type, usd=total, upper_usd=0.0, kind="nominal", basis=basis)
    if backend.type == "vllm":
        would = sum(task.episodes * (eval_cost_usd(per_job[task.task_id], pod_price) or 0.0) for task in tasks) if pod_price is not None else None
        elsewhere = f"; scoring each job on its pod instead would cost about {usd(would)} for the run ({seconds} s per job)" if would is not None else ""
        basis = f"vLLM on your GPU eval hosts: not in the ledger and not estimated (no price for those hosts is configured){elsewhere}"
        return CostLine(stage="eval", backend="vllm", usd=0.0, upper_usd=0.0, kind="not billed", basis=basis)
    where = {"sim": "[SIMULATOR] no charge", "local": "scoring on this machine's CPU"}.get(backend.type, "not billed")
    return CostLine(stage="eval", backend=backend.type, usd=0.0, upper_usd=0.0, kind="not billed", basis=where)


def cap_check(total_usd: float | None, upper_usd: float | None, episodes: int, budget: BudgetConfig) -> CapCheck:
    """Whether budget.max_run_usd would stop the run early, and after about how many episodes."""
    cap = budget.max_run_usd

    def verdict(binds: Literal["yes", "may", "no", "unknown"], message: str, within: int | None = None) -> CapCheck:
        return CapCheck(max_run_usd=cap, max_job_usd=budget.max_job_usd, on_cap=budget.on_cap, binds=binds, episodes_within_cap=within, message=message)

    action = "running inner jobs are stopped" if budget.on_cap == "stop" else "running inner jobs finish"
    if total_usd is None:
        if upper_usd is not None and upper_usd <= cap:
            return verdict("no", message=f"the cap does not bind: even the worst case ${upper_usd:.2f} is within budget.max_run_usd ${cap:.2f}")
        return verdict("unknown", message=f"unknown whether budget.max_run_usd ${cap:.2f} binds: part of the estimate is unavailable")
    if total_usd > cap:
        within = math.floor(cap / (total_usd / episodes)) if episodes and total_usd > 0 else 0
        return verdict(
            "yes",
            within=within,
            message=f"the cap would bind: the estimate ${total_usd:.2f} is over budget.max_run_usd ${cap:.2f}; new episodes stop after about {within} of {episodes} ({action})",
        )
    if upper_usd is None or upper_usd > cap:
        worst = "has no known bound" if upper_usd is None else f"${upper_usd:.2f} is over it"
        return verdict("may", message=f"the estimate ${total_usd:.2f} is within budget.max_run_usd ${cap:.2f}, but the worst case {worst}")
    return verdict("no", message=f"the cap does not bind: even the worst case ${upper_usd:.2f} is within budget.max_run_usd ${cap:.2f}")


def estimate_costs(config: RunConfig, specs: dict[str, TaskSpec], prices: dict[str, float]) -> CostEstimate:
    """Episodes, cost per stage and the cap check of a run (pure)."""
    counts = episode_counts(config, specs)
    tasks = task_lines(config, specs, counts)
    lines = [agent_line(config, counts), train_line(config, specs, tasks, counts, prices), eval_line(config, specs, tasks, prices), outer_line(config, counts)]
    total = None if any(line.usd is None for line in lines) else sum(line.usd or 0.0 for line in lines)
    upper = None if any(line.upper_usd is None for line in lines) else sum(line.upper_usd or 0.0 for line in lines)
    return CostEstimate(episodes=counts, lines=lines, total_usd=total, upper_usd=upper, cap=cap_check(total, upper, counts.total, config.budget))


# --- pods and compiled configs (pure) -----------------------------------------------------------


def pod_plan(config: RunConfig, counts: EpisodeCounts, prices: dict[str, float]) -> PodPlan | None:
    """The pods a Runpod run would create (None for other train backends)."""
    backend = config.backends.train
    if not isinstance(backend, RunpodTrainBackend):
        return None
    from metarl.backends.runpod.pod.pin import PRIME_RL_IMAGE, PRIME_RL_TAG
    from metarl.backends.runpod.pods import NAME_PREFIX, pod_name_for, run_prefix

    return PodPlan(
        image=backend.image,
        prime_rl_tag=PRIME_RL_TAG,
        prime_rl_base_image=PRIME_RL_IMAGE,
        gpu_types=list(backend.gpu_types),
        gpu_count=backend.gpu_count,
        cloud_type=backend.cloud_type,
        container_disk_gb=backend.container_disk_gb,
        volume_gb=backend.volume_gb,
        name_pattern=f"{NAME_PREFIX}<run id[:8]>-<episode id>, then -r<k> after restart k",
        example_name=pod_name_for(f"{run_prefix('1a2b3c4d')}17", 0),
        max_at_once=min(backend.max_pods, config.window.in_flight),
        warm_pool_size=backend.warm_pool_size,
        pods_created=counts.total,
        usd_per_gpu_hour={gpu: prices.get(gpu) for gpu in backend.gpu_types},
        storage_env=list(backend.storage_env),
    )


def representative_job(task: TaskSpec) -> JobSpec:
    """The default job (every hyperparameter left to its default) on the task's first allowed model."""
    return JobSpec(model=JobModel(name=task.budget.allowed_models[0]))


def compile_options(backend: RunpodTrainBackend, task: TaskSpec) -> Any:
    """The pod settings the Runpod train backend compiles a task's job with (half the GPUs train, the rest
    serve vLLM; the task's GPU time cap sizes the checkpoint interval)."""
    from metarl.backends.runpod.primerl.compiler import pod_compile_options

    return pod_compile_options(backend.gpu_count, task.budget.train_seconds_for(backend.type))


def compiled_jobs(config: RunConfig, specs: dict[str, TaskSpec]) -> list[CompiledJob]:
    """rl.toml of each task's representative job, tasks with identical text together (Runpod only).

    The environment id is the probe's placeholder: a real job's is the digest of the package the
    agent's workspace compiles to.
    """
    backend = config.backends.train
    if not isinstance(backend, RunpodTrainBackend):
        return []
    from metarl.backends.runpod.primerl.checks import primerl_compile_problems
    from metarl.backends.runpod.primerl.compiler import PROBE_ENV_ID, compile_rl_config, render_rl_toml

    grouped: dict[tuple[str, str], CompiledJob] = {}
    for task_id, spec in specs.items():
        options = compile_options(backend, spec)
        job = representative_job(spec)
        rl_config = compile_rl_config(job, PROBE_ENV_ID, options)
        rl_toml = render_rl_toml(rl_config)
        problems = [f"{problem.field}: {problem.message}" for problem in primerl_compile_problems(job, spec, options)]
        key = (rl_toml, "\n".join(problems))
        if key in grouped:
            previous = grouped[key]
            grouped[key] = previous.model_copy(update={"task_ids": [*previous.task_ids, task_id]})
        else:
            grouped[key] = CompiledJob(task_ids=[task_id], job_toml=dump_toml_model(job), rl_toml=rl_toml, rl_config=rl_config, problems=problems)
    return list(grouped.values())


# --- local base models (reads the cache folder; writes nothing) --------------------------------


def local_model_users(config: RunConfig) -> list[tuple[str, str | None, float]]:
    """(who, cache dir, scale) of each backend that loads local base models: local training, local or vLLM scoring."""
    users: list[tuple[str, str | None, float]] = []
    train, evaluate = config.backends.train, config.backends.eval
    if isinstance(train, LocalTrainBackend):
        users.append(("train (local)", train.model_cache_dir, train.model_scale))
    if isinstance(evaluate, LocalEvalBackend):
        users.append(("eval (local)", evaluate.model_cache_dir, evaluate.model_scale))
    if isinstance(evaluate, VllmEvalBackend):
        users.append(("eval (vllm: base scores, on the eval hosts)", evaluate.model_cache_dir, evaluate.model_scale))
    return users


def local_models(config: RunConfig, specs: dict[str, TaskSpec]) -> tuple[list[LocalModel], list[str]]:
    """The local stand-ins of the tasks' allowed models, where each is cached and whether it is built.

    Imports torch (the build key is in metarl.learning.models); creates no folder.
    """
    users = local_model_users(config)
    if not users:
        return [], []
    from metarl.learning.models import BASE_MODELS, BUILD_INFO_FILE, build_key, default_cache_dir, resolve_model_name

    names: list[str] = []
    notes: list[str] = []
    for spec in specs.values():
        for model in spec.budget.allowed_models:
            try:
                local = resolve_model_name(model)
            except KeyError:
                notes.append(f"task {spec.id}: allowed model {model!r} has no local stand-in (the probe rejects jobs that choose it)")
                continue
            if local not in names:
                names.append(local)
    found: dict[tuple[str, str, float], LocalModel] = {}
    for who, cache_dir, scale in users:
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        for name in names:
            model_spec = BASE_MODELS[name]
            path = root / f"{model_spec.name}-{build_key(model_spec, scale)}"
            key = (str(path), name, scale)
            if key in found:
                found[key] = found[key].model_copy(update={"used_by": f"{found[key].used_by}, {who}"})
                continue
            found[key] = LocalModel(
                name=name, stands_in_for=model_spec.stands_in_for, scale=scale, path=str(path), built=(path / BUILD_INFO_FILE).is_file(), used_by=who
            )
    return list(found.values()), notes


def local_note(config: RunConfig) -> str | None:
    """What the run would run on this machine, in words (None when every stage is remote)."""
    train, parts = config.backends.train, []
    if isinstance(train, LocalTrainBackend):
        parts.append(f"inner jobs as local GRPO processes (up to {train.max_concurrent_jobs} at once, job folders under {config.artifacts.root}/jobs); no pods")
    elif isinstance(train, SimTrainBackend):
        parts.append(
            f"[SIMULATOR] a simulated GPU cloud (up to {train.max_concurrent_jobs} jobs at once, records under {config.artifacts.root}/sim-cloud); nothing is trained, no pods"
        )
    if config.backends.agent.type == "local":
        parts.append("the trainer agent as the local torch policy")
    if config.backends.eval.type == "local":
        parts.append("hidden-eval scoring on the CPU")
    return "; ".join(parts) or None


# --- the plan -------------------------------------------------------------------------------


def services_line(config: RunConfig) -> str:
    """Where the database and broker would be, without printing a URL (it may hold a password)."""
    from metarl import settings

    if settings.database_url(config.services.database_url):
        return "services mode (METARL_DATABASE_URL / [services]); not contacted"
    return f"embedded default under {settings.metarl_home()}; not started"


def build_plan(config: RunConfig, specs: dict[str, TaskSpec], config_path: Path, prices: dict[str, float], *, provisional_secret: bool = False) -> DryRunPlan:
    """Everything the dry run prints. Touches no network, service or file (the model cache is only looked at).

    ``provisional_secret``: the deployment has no hidden-eval secret yet, so the local base-model paths
    (keyed by it) are those of a provisional one; the plan says so when it lists any.
    """
    from metarl.learning.eval_secret import EVAL_SECRET_ENV, SECRET_FILE

    estimate = estimate_costs(config, specs, prices)
    models, notes = local_models(config, specs)
    if provisional_secret and models:
        notes.append(
            f"no hidden-eval secret yet ({EVAL_SECRET_ENV} unset, no {SECRET_FILE} under the artifacts root): the first run creates one; "
            "the local base-model paths above depend on it and are provisional"
        )
    if isinstance(config.backends.train, RunpodTrainBackend):
        notes.append("the compiled rl.toml uses the probe's placeholder environment id; a real job's is the digest of its environment package")
        notes.append(
            "the pod runner stops rl at the task's budget.max_gpu_train_seconds (counted from the first metrics row), at its max_runtime_s "
            "(4 h by default) or at budget.max_job_usd, whichever comes first; the job keeps the weights of its last [ckpt] interval step"
        )
    if estimate.episodes.held_out_tasks == 0:
        notes.append("no held-out task: no held-out evals")
    notes.append("stale groups that are dropped and reopened add episodes; episodes whose job fails the probe launch no inner job")
    return DryRunPlan(
        config_path=str(config_path),
        run_name=config.run.name,
        backends={stage: getattr(config.backends, stage).type for stage in ("agent", "train", "eval", "outer")},
        tasks=task_lines(config, specs, estimate.episodes),
        services=services_line(config),
        artifacts_root=config.artifacts.root,
        pods=pod_plan(config, estimate.episodes, prices),
        compiled=compiled_jobs(config, specs),
        job_defaults=train_defaults(config.backends.train.type) if config.backends.train.type in ("local", "runpod") else None,
        job_costs=job_costs(config, specs, prices),
        local_models=models,
        local_note=local_note(config),
        estimate=estimate,
        notes=notes,
    )


# --- output -----------------------------------------------------------------------------------


def usd(value: float | None) -> str:
    """Dollars for people: cents, or more digits for amounts under a cent."""
    if value is None:
        return "unavailable"
    return f"${value:.2f}" if value == 0 or value >= 0.01 else f"${value:.6f}"


def fine_usd(value: float | None) -> str:
    """Dollars to a hundredth of a cent (per-job figures)."""
    return "unavailable" if value is None else f"${value:.4f}"


def render_json(plan: DryRunPlan) -> str:
    """The plan as JSON (for scripts)."""
    return json.dumps(plan.model_dump(mode="json"), indent=2)


def _indent(text: str, prefix: str = "    ") -> list[str]:
    return [prefix + line if line else line for line in text.rstrip("\n").split("\n")]


def render_text(plan: DryRunPlan) -> str:
    """The plan for people: sections for the run, episodes, pods, compiled configs, local models and costs."""
    counts, estimate = plan.estimate.episodes, plan.estimate
    out = [f"DRY RUN of {printable(plan.config_path)}: nothing launched, no API called, nothing written", ""]
    held = [task.task_id for task in plan.tasks if task.held_out]
    out.append(f"run {plan.run_name}: {len(plan.tasks)} task(s)" + (f" ({', '.join(held)} held out)" if held else ""))
    out.append("backends: " + "  ".join(f"{stage}={kind}" for stage, kind in plan.backends.items()))
    out.append(f"services: {printable(plan.services)}")
    out.append(f"artifacts: {printable(plan.artifacts_root)}")
    out += ["", "Episodes"]
    out.append(
        f"  training   {counts.max_outer_steps} outer step(s) x {counts.groups_per_batch} group(s) x {counts.group_size} episode(s) = {counts.train_episodes}"
    )
    if counts.held_out_tasks:
        out.append(
            f"  held-out   {counts.held_out_evals} eval(s) x {counts.held_out_tasks} task(s) x {counts.held_out_group_size} episode(s) = {counts.held_out_episodes}"
        )
    out.append(f"  total      {counts.total}")
    if plan.job_defaults is not None:
        defaults, train = plan.job_defaults, plan.backends["train"]
        caps = ", ".join(sorted({f"{task.max_train_seconds:g} s" for task in plan.tasks}))
        cap_field = "budget.max_gpu_train_seconds, counted from the first metrics row" if train == "runpod" else "budget.max_train_seconds"
        kl = " (-> [trainer.loss] kl_tau: trainer/inference logprob gap)" if train == "runpod" else " (k3 KL to the base model)"
        out += ["", f"Inner jobs (backends.train = {train})"]
        out.append(f"  time cap   {caps} per job (the tasks' {cap_field})")
        out.append(
            f"  defaults   learning_rate {defaults.learning_rate:g} (LoRA {defaults.lora_learning_rate:g}), kl_coef {defaults.kl_coef:g}{kl}; "
            f"max_steps {DEFAULT_MAX_STEPS}, batch_size {DEFAULT_BATCH_SIZE}, group_size {DEFAULT_GROUP_SIZE}, temperature {DEFAULT_TEMPERATURE:g}, max_tokens {DEFAULT_MAX_TOKENS}"
        )
    if plan.pods is not None:
        pods = plan.pods
        fallbacks = f", then {', '.join(pods.gpu_types[1:])} on capacity errors" if len(pods.gpu_types) > 1 else ""
        out += ["", "Pods (Runpod; none created)"]
        out.append(f"  image      {printable(pods.image)} (prime-rl {pods.prime_rl_tag}, base {pods.prime_rl_base_image})")
        out.append(f"  GPUs       {pods.gpu_count}x {pods.gpu_types[0]}{fallbacks}; {pods.cloud_type} cloud")
        out.append(f"  disk       {pods.container_disk_gb} GB container" + (f", {pods.volume_gb} GB volume" if pods.volume_gb else ", no volume"))
        out.append(f"  names      {pods.name_pattern} (e.g. {pods.example_name})")
        out.append(f"  at once    up to {pods.max_at_once}; warm pool {pods.warm_pool_size}")
        out.append(f"  created    at most {pods.pods_created} (one per inner job; warm pods take several)")
        priced = ", ".join(f"{gpu} ${price:g}/GPU-h" for gpu, price in pods.usd_per_gpu_hour.items() if price is not None)
        out.append(f"  prices     {priced or 'none given (' + PRICE_FLAG + ' or backends.train.estimated_usd_per_gpu_hour)'}")
        out.append(
            f"  pod env    METARL_RUNPOD_ROOT, METARL_POD_NAME, METARL_RUNNER_JOB_URL, METARL_RUNNER_RESULT_URL; storage: {', '.join(pods.storage_env) or 'none'} (those set on the train workers)"
        )
    if plan.compiled:
        out += ["", "Compiled prime-rl configs (the default job of each task)"]
        for job in plan.compiled:
            verdict = "validates against prime-rl's derived schema and cross-field rules" if not job.problems else "REJECTED: " + "; ".join(job.problems)
            out.append(f"  tasks {', '.join(job.task_ids)}: {verdict}")
            out.append("  job.toml:")
            out += _indent(job.job_toml)
            out.append("  rl.toml:")
            out += _indent(job.rl_toml)
    if plan.local_note or plan.local_models:
        out += ["", "On this machine"]
        if plan.local_note:
            out.append(f"  {plan.local_note}")
        for model in plan.local_models:
            state = "built" if model.built else "to build on first use"
            out.append(f"  base model {model.name} (for {model.stands_in_for}, scale {model.scale:g}) {state}: {printable(model.path)}  [{model.used_by}]")
    for cost in plan.job_costs:
        price = f"${cost.usd_per_hour:.4f}/h" if cost.usd_per_hour is not None else "no price given"
        out += ["", f"Cost per job (tasks {', '.join(cost.task_ids)}; {cost.gpu_count}x {cost.gpu_type} at {price})"]
        for term in cost.terms:
            figure = fine_usd(term.usd) if term.usd is not None else "not estimated"
            where = "" if term.billed else " (not on the pod)"
            out.append(f"  {term.name:<9} {term.seconds:>6g} s  {figure}{where}")
            out.append(f"            {printable(term.assumes)}")
        if cost.eval_included:
            eval_note = "hidden eval included"
        else:
            with_eval = f"; {fine_usd(cost.usd_with_eval_on_pod)} with the eval on the job's pod" if cost.usd_with_eval_on_pod is not None else ""
            eval_note = f"hidden eval not included{with_eval}"
        figure = fine_usd(cost.usd) if cost.usd is not None else "unavailable"
        out.append(f"  per job   {cost.pod_seconds:>6g} s  {figure} ({eval_note}); beside {cost.reference}")
    out += ["", "Cost estimate"]
    for line in estimate.lines:
        figure = usd(line.usd) if line.usd is not None else "unavailable"
        bounded_elsewhere = line.upper_usd == 0.0 and line.usd  # its worst case lies within another line's cap
        worst = f" (worst case {usd(line.upper_usd)})" if line.upper_usd is not None and line.upper_usd != line.usd and not bounded_elsewhere else ""
        out.append(f"  {line.stage:<6} {line.backend:<7} {figure}{worst}  [{line.kind}]")
        out.append(f"         {printable(line.basis)}")
        if line.unavailable:
            out.append(f"         unavailable: {line.unavailable}")
    total = usd(estimate.total_usd)
    worst_total = f"; worst case {usd(estimate.upper_usd)}" if estimate.upper_usd is not None else "; worst case unbounded"
    out.append(f"  total  {total}{worst_total}")
    cap = estimate.cap
    out.append(f"  budget max_run_usd ${cap.max_run_usd:.2f}, max_job_usd ${cap.max_job_usd:.2f}, on_cap {cap.on_cap}: {cap.message}")
    if plan.notes:
        out += ["", "Notes"]
        out += [f"  - {printable(note)}" for note in plan.notes]
    return "\n".join(out) + "\n"
