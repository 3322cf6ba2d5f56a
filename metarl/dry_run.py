"""`metarl run CONFIG --dry-run`: what a run would launch and roughly what it would cost, calling no API.

The plan is built from the loaded run config and task specs only: no vendor SDK is imported, no
socket is opened, no service is started and nothing is written. What it holds:

- the episode count: ``max_outer_steps x groups_per_batch x group_size`` training episodes, plus a
  group of held-out episodes per held-out task at every policy version the held-out eval runs at;
- what each stage's backend plans (its vendor's ``plan.py``, named by its config's ``planner``): for
  Runpod inner jobs, the pods and the prime-rl ``rl.toml`` of a representative job per task;
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
from typing import Literal

from pydantic import Field

from metarl.planning import (
    PRICE_FLAG,
    CompiledJob,
    CostLine,
    EpisodeCounts,
    Frozen,
    JobCost,
    LocalModel,
    LocalModelUser,
    PlanInputs,
    PodPlan,
    StagePlan,
    TaskLine,
    fine_usd,
    usd,
)
from schemas.backend_config import STAGE_NAMES, BackendConfig
from schemas.backend_registry import import_path
from schemas.base import ConfigError, FieldProblem, printable
from schemas.job import DEFAULT_BATCH_SIZE, DEFAULT_GROUP_SIZE, DEFAULT_MAX_STEPS, DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE, TrainDefaults
from schemas.run_config import BudgetConfig, RunConfig
from schemas.task_spec import TaskSpec

MAX_GPU_USD_PER_HOUR = 1000.0


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


class CostEstimate(Frozen):
    """Episodes, cost per stage, totals and the cap check."""

    episodes: EpisodeCounts = Field(description="Episode counts")
    lines: list[CostLine] = Field(min_length=4, max_length=4, description="One line per stage")
    total_usd: float | None = Field(default=None, ge=0, description="Sum of the estimates (None when a line is unavailable)")
    upper_usd: float | None = Field(default=None, ge=0, description="Sum of the worst cases (None when a line has no bound)")
    cap: CapCheck = Field(description="The estimate against budget.max_run_usd")


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
    gpu_types: list[str] = list(getattr(backend, "gpu_types", None) or [])
    configured: dict[str, float] = dict(getattr(backend, "estimated_usd_per_gpu_hour", None) or {})
    if not values:
        return configured
    if not gpu_types:
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
        if gpu not in gpu_types:
            raise ConfigError(
                source,
                [
                    FieldProblem(
                        field=PRICE_FLAG,
                        message=f"{gpu!r} is not one of backends.train.gpu_types {gpu_types}",
                        fix="use a GPU type of backends.train.gpu_types, spelled as there",
                    )
                ],
            )
        prices[gpu] = price
    return prices


# --- episode counts and the estimate (pure) -------------------------------------------------


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
    start_set = outer.start_set_group_size * (len(specs) - held_out_tasks)
    return EpisodeCounts(
        max_outer_steps=config.run.max_outer_steps,
        groups_per_batch=outer.groups_per_batch,
        group_size=outer.group_size,
        train_episodes=train,
        held_out_tasks=held_out_tasks,
        held_out_evals=evals,
        held_out_group_size=held_out_size,
        held_out_episodes=held_out,
        start_set_episodes=start_set,
        total=train + held_out + start_set,
    )


def task_lines(config: RunConfig, specs: dict[str, TaskSpec], counts: EpisodeCounts) -> list[TaskLine]:
    """Each task with its episodes: training groups go round-robin over the trainable tasks (spread evenly here)."""
    trainable = [task_id for task_id, spec in specs.items() if not spec.held_out]
    per_held_out = counts.held_out_evals * counts.held_out_group_size
    return [
        TaskLine(
            task_id=task_id,
            held_out=spec.held_out,
            max_train_seconds=config.backends.train.train_seconds(spec),
            allowed_models=list(spec.budget.allowed_models),
            episodes=float(per_held_out) if spec.held_out else (counts.train_episodes + counts.start_set_episodes) / len(trainable),
        )
        for task_id, spec in specs.items()
    ]


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


def stage_plan(backend: BackendConfig, inputs: PlanInputs) -> StagePlan:
    """One stage's part of the plan, from the planner its config names (imported now; pure)."""
    plan: StagePlan = import_path(type(backend).planner)(backend, inputs)
    return plan


def stage_plans(config: RunConfig, specs: dict[str, TaskSpec], prices: dict[str, float]) -> tuple[PlanInputs, dict[str, StagePlan]]:
    """Every stage's plan, in pipeline order, with the inputs they were made from."""
    counts = episode_counts(config, specs)
    inputs = PlanInputs(config=config, specs=specs, counts=counts, tasks=task_lines(config, specs, counts), prices=prices)
    backends = config.backends.by_stage()
    return inputs, {stage: stage_plan(backends[stage], inputs) for stage in STAGE_NAMES}


def estimate_of(lines: list[CostLine], counts: EpisodeCounts, budget: BudgetConfig) -> CostEstimate:
    """Totals of the stages' cost lines and the cap check."""
    total = None if any(line.usd is None for line in lines) else sum(line.usd or 0.0 for line in lines)
    upper = None if any(line.upper_usd is None for line in lines) else sum(line.upper_usd or 0.0 for line in lines)
    return CostEstimate(episodes=counts, lines=lines, total_usd=total, upper_usd=upper, cap=cap_check(total, upper, counts.total, budget))


def estimate_costs(config: RunConfig, specs: dict[str, TaskSpec], prices: dict[str, float]) -> CostEstimate:
    """Episodes, cost per stage and the cap check of a run (pure)."""
    inputs, plans = stage_plans(config, specs, prices)
    return estimate_of([plan.cost for plan in plans.values()], inputs.counts, config.budget)


# --- local base models (reads the cache folder; writes nothing) --------------------------------


def local_models(users: list[LocalModelUser], specs: dict[str, TaskSpec]) -> tuple[list[LocalModel], list[str]]:
    """The local stand-ins of the tasks' allowed models, where each is cached and whether it is built.

    Imports torch (the build key is in metarl.learning.models); creates no folder.
    """
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
    for user in users:
        root = Path(user.cache_dir).expanduser() if user.cache_dir is not None else default_cache_dir()
        for name in names:
            model_spec = BASE_MODELS[name]
            path = root / f"{model_spec.name}-{build_key(model_spec, user.scale)}"
            key = (str(path), name, user.scale)
            if key in found:
                found[key] = found[key].model_copy(update={"used_by": f"{found[key].used_by}, {user.who}"})
                continue
            found[key] = LocalModel(
                name=name, stands_in_for=model_spec.stands_in_for, scale=user.scale, path=str(path), built=(path / BUILD_INFO_FILE).is_file(), used_by=user.who
            )
    return list(found.values()), notes


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

    inputs, plans = stage_plans(config, specs, prices)
    parts = list(plans.values())
    estimate = estimate_of([plan.cost for plan in parts], inputs.counts, config.budget)
    models, notes = local_models([user for plan in parts for user in plan.local_models], specs)
    if provisional_secret and models:
        notes.append(
            f"no hidden-eval secret yet ({EVAL_SECRET_ENV} unset, no {SECRET_FILE} under the artifacts root): the first run creates one; "
            "the local base-model paths above depend on it and are provisional"
        )
    notes.extend(note for plan in parts for note in plan.notes)
    if estimate.episodes.held_out_tasks == 0:
        notes.append("no held-out task: no held-out evals")
    notes.append("stale groups that are dropped and reopened add episodes; episodes whose job fails the probe launch no inner job")
    train = plans["train"]
    return DryRunPlan(
        config_path=str(config_path),
        run_name=config.run.name,
        backends={stage: backend.type for stage, backend in config.backends.by_stage().items()},
        tasks=inputs.tasks,
        services=services_line(config),
        artifacts_root=config.artifacts.root,
        pods=train.pods,
        compiled=train.compiled,
        job_defaults=train.job_defaults,
        job_costs=train.job_costs,
        local_models=models,
        local_note="; ".join(plans[stage].local_note or "" for stage in ("train", "agent", "eval", "outer") if plans[stage].local_note) or None,
        estimate=estimate,
        notes=notes,
    )


# --- output -----------------------------------------------------------------------------------


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
    trainable_ids = [task.task_id for task in plan.tasks if not task.held_out]
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
    if counts.start_set_episodes:
        out.append(
            f"  start set  {counts.start_set_episodes // len(trainable_ids)} episode(s) x {len(trainable_ids)} training task(s) = {counts.start_set_episodes}"
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
        worst = fine_usd(cost.worst_usd) if cost.worst_usd is not None else "unavailable"
        out.append(f"  worst     {cost.worst_pod_seconds:>6g} s  {worst}")
        out.append(f"            {printable(cost.worst_assumes)}")
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
    unpriced = any(line.unavailable for line in estimate.lines)
    worst_total = (
        f"; worst case {usd(estimate.upper_usd)}" if estimate.upper_usd is not None else "; worst case unknown" if unpriced else "; worst case unbounded"
    )
    out.append(f"  total  {total}{worst_total}")
    cap = estimate.cap
    out.append(f"  budget max_run_usd ${cap.max_run_usd:.2f}, max_job_usd ${cap.max_job_usd:.2f}, on_cap {cap.on_cap}: {cap.message}")
    if plan.notes:
        out += ["", "Notes"]
        out += [f"  - {printable(note)}" for note in plan.notes]
    return "\n".join(out) + "\n"
