"""The dry-run plan of the Runpod backends: the pods, the compiled rl.toml of a representative job per task, the cost per job and per run.

There is no offline Runpod price table (a pod's ``costPerHr`` is known only once the API launched
it), so the figures need prices from the operator (``backends.train.estimated_usd_per_gpu_hour``,
or ``--usd-per-gpu-hour TYPE=USD``); without them the train line gives only the worst case that
``budget.max_job_usd`` allows. Pure, like `metarl/planning.py`.
"""

from __future__ import annotations

import math
from typing import Any

from metarl.backends.runpod.config import PodVllmEvalBackend, RunpodTrainBackend
from metarl.planning import (
    NO_PRICE_TABLE,
    CompiledJob,
    CostLine,
    EpisodeCounts,
    JobCost,
    JobCostTerm,
    PlanInputs,
    PodPlan,
    StagePlan,
    eval_cost_usd,
    fine_usd,
    inner_job_usd,
    pod_usd_per_hour,
)
from schemas.backend_config import expect_config
from schemas.base import dump_toml_model
from schemas.job import JobModel, JobSpec, train_defaults
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

POD_STARTUP_S = 300.0


POD_STARTUP_ASSUMES = (
    "pod start to the first metrics row: container start, model download and load, vLLM engine start, the first step "
    "(assumed; the image pull of a fresh pod is its own term)"
)


IMAGE_PULL_S = 600.0
"""A fresh pod's first pull of the image: prime-rl's CUDA image with torch and vLLM is tens of GB (assumed)."""


EVAL_DISPATCH_S = 30.0
"""From the train stage's poll that sees training done to the eval request reaching the pod: queue and eval stage start (assumed)."""


POD_UPLOAD_S = 60.0


POD_UPLOAD_ASSUMES = "stopping rl and uploading weights/step_N (about 1.2 GB bf16 for Qwen3-0.6B, 3.4 GB for 1.7B), logs and metrics (assumed)"


REFERENCE_USD_PER_JOB = (0.13, 0.30)
"""The reference run's cost of one inner job on a pod of two A40s, to set the estimate beside."""


def eval_pod_seconds(config: RunConfig, task: TaskSpec) -> float:
    """Pod seconds of one job's hidden eval with vLLM (:func:`metarl.backends.runpod.eval.estimate_eval_seconds`, with the run's
    on-pod eval settings or their defaults), rounded up to a second; the first job of each (task, model) also scores the base model."""
    from metarl.backends.runpod.eval import estimate_eval_seconds

    backend = config.backends.eval if isinstance(config.backends.eval, PodVllmEvalBackend) else PodVllmEvalBackend(type="pod_vllm")
    return float(math.ceil(estimate_eval_seconds(task, backend, score_base=False)))


def eval_on_job_pod(config: RunConfig) -> bool:
    """Whether the hidden eval scores on the inner job's pod (billed there) rather than on separate hosts."""
    return isinstance(config.backends.train, RunpodTrainBackend) and isinstance(config.backends.eval, PodVllmEvalBackend)


def fresh_pod_share(backend: RunpodTrainBackend, in_flight: int, jobs: int) -> float:
    """Share of a run's jobs that start on a newly created pod (and pull the image).

    The first ``min(max_pods, window.in_flight)`` jobs create pods; a later job finds an idle pod only where the warm pool
    kept one (at most ``warm_pool_size`` of those pods wait; the rest are terminated when their job ends). Without a warm pool
    every job creates its pod.
    """
    at_once = max(1, min(backend.max_pods, in_flight))
    if jobs <= 0:
        return 1.0
    first = min(1.0, at_once / jobs)
    reused = min(backend.warm_pool_size, at_once) / at_once
    return first + (1.0 - first) * (1.0 - reused)


def job_train_seconds(pull_s: float, cap_s: float) -> float:
    """Pod seconds of one job up to its upload: its image-pull share, start-up, the training cap and the upload."""
    return pull_s + POD_STARTUP_S + cap_s + POD_UPLOAD_S


def eval_wait_s(backend: RunpodTrainBackend) -> float:
    """Seconds a pod waits for its eval request after training: up to one poll of the train stage and the eval stage's start."""
    return backend.poll_interval_s + EVAL_DISPATCH_S


def job_cost(task: TaskSpec, config: RunConfig, usd_per_hour: float | None, jobs: int) -> JobCost:
    """One inner job of a task on a Runpod pod: its share of an image pull, start-up, training cap, upload, and the eval's
    wait and scoring when it runs on the pod; and the worst case, when every restart follows a start-up that timed out."""
    backend = expect_config(config.backends.train, RunpodTrainBackend)
    on_pod = eval_on_job_pod(config)
    cap = backend.train_seconds(task)
    eval_seconds = eval_pod_seconds(config, task)
    share = fresh_pod_share(backend, config.window.in_flight, jobs)
    pull = IMAGE_PULL_S * share

    def at_pod_price(seconds: float) -> float | None:
        return None if usd_per_hour is None else seconds * usd_per_hour / 3600.0

    if on_pod:
        eval_usd, eval_assumes = eval_cost_usd(eval_seconds, usd_per_hour), "scored on the job's pod after training, at the pod's price"
    else:
        would = eval_cost_usd(eval_seconds, usd_per_hour)
        elsewhere = f"; scoring on the job's pod would add {fine_usd(would)}" if would is not None else ""
        eval_usd, eval_assumes = (
            None,
            f"not in the job's cost: backends.eval.type = {config.backends.eval.type!r} does not score on the job's pod{elsewhere}",
        )
    engine = config.backends.eval if isinstance(config.backends.eval, PodVllmEvalBackend) else PodVllmEvalBackend(type="pod_vllm")
    eval_assumes = (
        f"{eval_assumes} ({engine.engine_start_s:g} s vLLM engine start + {task.hidden_eval.n_items} items x pass@{task.hidden_eval.pass_k} "
        f"at {engine.tokens_per_s:g} tokens/s, assumed; the first job of each task and model also scores the base)"
    )
    wait = eval_wait_s(backend)
    pull_assumes = (
        f"a fresh pod's first pull of the image ({IMAGE_PULL_S:g} s, assumed) times the share of jobs on a fresh pod ({share:.2f}: "
        + (
            "no warm pool"
            if backend.warm_pool_size == 0
            else f"{min(backend.max_pods, config.window.in_flight)} pods at once, {backend.warm_pool_size} kept warm between jobs, {jobs} jobs"
        )
        + ")"
    )
    terms = [
        JobCostTerm(name="image pull", seconds=round(pull, 1), billed=True, usd=at_pod_price(pull), assumes=pull_assumes),
        JobCostTerm(name="start-up", seconds=POD_STARTUP_S, billed=True, usd=at_pod_price(POD_STARTUP_S), assumes=POD_STARTUP_ASSUMES),
        JobCostTerm(
            name="training",
            seconds=cap,
            billed=True,
            usd=at_pod_price(cap),
            assumes="the task's budget.max_gpu_train_seconds, counted from the first metrics row; rl is stopped there (a job that finishes max_steps sooner costs less)",
        ),
        JobCostTerm(name="upload", seconds=POD_UPLOAD_S, billed=True, usd=at_pod_price(POD_UPLOAD_S), assumes=POD_UPLOAD_ASSUMES),
    ]
    if on_pod:
        terms.append(
            JobCostTerm(
                name="eval wait",
                seconds=wait,
                billed=True,
                usd=at_pod_price(wait),
                assumes=f"the pod waits for the eval request: up to one poll ({backend.poll_interval_s:g} s, backends.train.poll_interval_s) + {EVAL_DISPATCH_S:g} s for the eval stage (assumed)",
            )
        )
    terms.append(JobCostTerm(name="eval", seconds=eval_seconds, billed=on_pod, usd=eval_usd, assumes=eval_assumes))
    pod_seconds = sum(term.seconds for term in terms if term.billed)
    train_seconds = job_train_seconds(pull, cap)
    train_usd = at_pod_price(train_seconds)
    on_pod_eval = eval_cost_usd(eval_seconds + wait, usd_per_hour)
    eval_part = on_pod_eval if on_pod and on_pod_eval is not None else 0.0
    total = None if train_usd is None else min(train_usd + eval_part, config.budget.max_job_usd)
    attempt_lost = IMAGE_PULL_S + backend.startup_timeout_s
    last = IMAGE_PULL_S + backend.startup_timeout_s + cap + POD_UPLOAD_S + ((wait + engine.eval_timeout_s) if on_pod else 0.0)
    worst_seconds = backend.max_restarts * attempt_lost + last
    worst_usd = at_pod_price(worst_seconds)
    low, high = REFERENCE_USD_PER_JOB
    return JobCost(
        task_ids=[task.id],
        gpu_count=backend.gpu_count,
        gpu_type=backend.gpu_types[0],
        usd_per_hour=usd_per_hour,
        terms=terms,
        pod_seconds=round(pod_seconds, 1),
        usd=total,
        eval_included=on_pod and eval_usd is not None,
        usd_with_eval_on_pod=None if train_usd is None or on_pod_eval is None else min(train_usd + on_pod_eval, config.budget.max_job_usd),
        reference=f"the reference run: ${low:.2f}-{high:.2f} per job on 2x A40 pods",
        fresh_pod_share=share,
        worst_pod_seconds=worst_seconds,
        worst_usd=None if worst_usd is None else min(worst_usd, config.budget.max_job_usd),
        worst_assumes=(
            f"{backend.max_restarts} restart(s) (backends.train.max_restarts), each after a fresh pod's image pull and a start-up that waited out "
            f"startup_timeout_s ({backend.startup_timeout_s:g} s, billed), then a last attempt that pulls, waits out the start-up timeout, trains the whole cap"
            + (f", waits and scores up to eval_timeout_s ({engine.eval_timeout_s:g} s)" if on_pod else "")
            + f"; the job is stopped at budget.max_job_usd (${config.budget.max_job_usd:.2f})"
        ),
    )


def job_costs(config: RunConfig, specs: dict[str, TaskSpec], prices: dict[str, float], jobs: int) -> list[JobCost]:
    """The per-job cost of each task (Runpod only) in a run of ``jobs`` inner jobs, tasks with identical figures together."""
    backend = config.backends.train
    if not isinstance(backend, RunpodTrainBackend):
        return []
    price = pod_usd_per_hour(backend.gpu_types[0], backend.gpu_count, prices)
    grouped: dict[str, JobCost] = {}
    for spec in specs.values():
        cost = job_cost(spec, config, price, jobs)
        key = cost.model_copy(update={"task_ids": ["-"]}).model_dump_json()
        if key in grouped:
            grouped[key] = grouped[key].model_copy(update={"task_ids": [*grouped[key].task_ids, spec.id]})
        else:
            grouped[key] = cost
    return list(grouped.values())


def warm_pool_idle_s(backend: RunpodTrainBackend) -> float:
    """Pod seconds the warm pool idles at the end of a run: up to warm_pool_size pods wait idle_timeout_s for a next job."""
    return backend.warm_pool_size * backend.idle_timeout_s


def train_cost(backend: RunpodTrainBackend, inputs: PlanInputs) -> CostLine:
    """Cost of the inner jobs (one per episode; an episode whose job fails the probe launches none) and of the warm pool's idle pods."""
    config, counts, tasks, prices, budget = inputs.config, inputs.counts, inputs.tasks, inputs.prices, inputs.config.budget
    preferred = backend.gpu_types[0]
    pod_price = pod_usd_per_hour(preferred, backend.gpu_count, prices)
    idle_s = warm_pool_idle_s(backend)
    idle_note = (
        f"the warm pool's idle pods at the end of the run ({backend.warm_pool_size} x idle_timeout_s {backend.idle_timeout_s:g} s, billed to no job)"
        if idle_s
        else "no warm pool"
    )
    upper_jobs = counts.total * budget.max_job_usd
    if pod_price is None:
        unpriced_idle = f", plus {idle_note}, which has no price without one" if idle_s else ""
        cap_note = f"at most budget.max_job_usd ${budget.max_job_usd:.2f} per job, ${upper_jobs:.2f} for {counts.total} jobs{unpriced_idle}"
        return CostLine(
            stage="train",
            backend="runpod",
            upper_usd=None if idle_s else upper_jobs,
            kind="nominal",
            basis=cap_note,
            unavailable=f"{NO_PRICE_TABLE} (no price for {preferred!r})",
        )
    idle_usd = idle_s * pod_price / 3600.0
    share = fresh_pod_share(backend, config.window.in_flight, counts.total)
    pull = IMAGE_PULL_S * share
    jobs_usd = sum(task.episodes * inner_job_usd(job_train_seconds(pull, task.max_train_seconds), pod_price, budget.max_job_usd) for task in tasks)
    seconds = sorted({task.max_train_seconds for task in tasks})
    fallback = [price for gpu in backend.gpu_types[1:] if (price := pod_usd_per_hour(gpu, backend.gpu_count, prices)) is not None]
    fallback_note = f"; a fallback GPU type costs up to ${max(fallback):.4f}/h" if fallback and max(fallback) > pod_price else ""
    upper = upper_jobs + idle_usd
    basis = (
        f"one job per episode: {pull:.0f} s of image pull (a fresh pod's {IMAGE_PULL_S:g} s x {share:.2f} of jobs) + {POD_STARTUP_S:g} s start-up "
        f"+ the task's budget.max_gpu_train_seconds ({'/'.join(f'{s:g}' for s in seconds)} s) + {POD_UPLOAD_S:g} s upload on {backend.gpu_count}x {preferred} "
        f"at ${pod_price:.4f}/h{fallback_note}; + ${idle_usd:.2f} for {idle_note}. Worst case ${upper:.2f}: every job stopped at budget.max_job_usd "
        f"(${budget.max_job_usd:.2f}: restarts and start-ups that time out, see the cost per job) plus the idle pool"
    )
    return CostLine(stage="train", backend="runpod", usd=jobs_usd + idle_usd, upper_usd=max(upper, jobs_usd + idle_usd), kind="nominal", basis=basis)


def train_plan(backend: RunpodTrainBackend, inputs: PlanInputs) -> StagePlan:
    """The pods, compiled configs, per-job costs and run cost of Runpod inner jobs."""
    config = inputs.config
    return StagePlan(
        cost=train_cost(backend, inputs),
        pods=pod_plan(config, inputs.counts, inputs.prices),
        compiled=compiled_jobs(config, inputs.specs),
        job_costs=job_costs(config, inputs.specs, inputs.prices, inputs.counts.total),
        job_defaults=train_defaults("runpod"),
        notes=[
            "the compiled rl.toml uses the probe's placeholder environment id; a real job's is the digest of its environment package",
            "the pod runner stops rl at the task's budget.max_gpu_train_seconds (counted from the first metrics row), at its max_runtime_s "
            "(4 h by default) or at budget.max_job_usd, whichever comes first; the job keeps the weights of its last [ckpt] interval step",
        ],
    )


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

    return pod_compile_options(backend.gpu_count, backend.train_seconds(task))


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


def eval_plan(backend: PodVllmEvalBackend, inputs: PlanInputs) -> StagePlan:
    """Cost of the hidden eval on each job's pod after training, billed at the pod's price."""
    config, tasks = inputs.config, inputs.tasks
    train = expect_config(config.backends.train, RunpodTrainBackend)
    pod_price = pod_usd_per_hour(train.gpu_types[0], train.gpu_count, inputs.prices)
    wait = eval_wait_s(train)
    per_job = {task.task_id: eval_pod_seconds(config, inputs.specs[task.task_id]) + wait for task in tasks}
    seconds = "/".join(f"{value:g}" for value in sorted(set(per_job.values())))
    # budget.max_job_usd counts the eval's pod seconds too: the train line's worst case already bounds them
    within_cap = "its worst case is inside the train line's (budget.max_job_usd counts the eval's pod seconds)"
    if pod_price is None:
        basis = f"{seconds} s per job on the job's pod; {within_cap}"
        return StagePlan(cost=CostLine(stage="eval", backend=backend.type, upper_usd=0.0, kind="nominal", basis=basis, unavailable=NO_PRICE_TABLE))
    total = sum(task.episodes * (eval_cost_usd(per_job[task.task_id], pod_price) or 0.0) for task in tasks)
    basis = f"one scoring per job on its pod after training, {seconds} s (the wait for the request included) at ${pod_price:.4f}/h (estimate); {within_cap}"
    return StagePlan(cost=CostLine(stage="eval", backend=backend.type, usd=total, upper_usd=0.0, kind="nominal", basis=basis))
