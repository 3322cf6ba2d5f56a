"""`metarl run --dry-run`: the estimate maths, the compiled configs and the output (metarl/dry_run.py)."""

from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from metarl.backends.runpod.plan import (
    EVAL_DISPATCH_S,
    IMAGE_PULL_S,
    POD_STARTUP_S,
    POD_UPLOAD_S,
    compiled_jobs,
    eval_pod_seconds,
    fresh_pod_share,
    job_costs,
    representative_job,
    warm_pool_idle_s,
)
from metarl.backends.tinker.plan import tinker_attempt_tokens, tinker_attempt_usd, tinker_update_tokens
from metarl.dry_run import DryRunPlan, build_plan, cap_check, episode_counts, estimate_costs, held_out_eval_points, parse_gpu_prices, render_json, render_text
from metarl.planning import eval_cost_usd, inner_job_usd, pod_usd_per_hour, usd
from metarl.runconfig import load_run
from schemas.base import ConfigError, validate_model
from schemas.run_config import BudgetConfig, RunConfig
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def example(name: str) -> tuple[RunConfig, dict[str, TaskSpec]]:
    return load_run(EXAMPLES / f"{name}.toml")


def edited_config(name: str, edit: dict[str, dict[str, Any]]) -> RunConfig:
    """An example config with some tables changed (validated as `metarl run` would)."""
    data = tomllib.loads((EXAMPLES / f"{name}.toml").read_text())
    for dotted, values in edit.items():
        node = data
        for part in dotted.split("."):
            node = node.setdefault(part, {})
        node.update(values)
    return validate_model(RunConfig, data, f"{name}.toml")


def sim_eval_example() -> tuple[RunConfig, dict[str, TaskSpec]]:
    """The Runpod example scored by the SIMULATOR eval instead of on each job's pod (the fault drills' combination)."""
    _, specs = example("runpod")
    return edited_config("runpod", {"backends.eval": {"type": "sim"}}), specs


def pull_s(config: RunConfig, jobs: int = 404) -> float:
    """The image-pull seconds each job carries: a fresh pod's pull times the share of jobs on a fresh pod."""
    return IMAGE_PULL_S * fresh_pod_share(config.backends.train, config.window.in_flight, jobs)  # type: ignore[arg-type]


def idle_usd(config: RunConfig, pod_usd_per_hour: float) -> float:
    """The warm pool's idle pods at the end of the run, at the pod price."""
    return warm_pool_idle_s(config.backends.train) * pod_usd_per_hour / 3600  # type: ignore[arg-type]


def cost_of(costs: list, task_id: str):  # type: ignore[no-untyped-def]
    return next(cost for cost in costs if task_id in cost.task_ids)


# --- episode counts ------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "every", "points"), [(20, 1, 21), (10, 2, 6), (1, 1, 2), (5, 10, 1), (9, 3, 4)])
def test_held_out_eval_points_are_versions_zero_to_last(steps: int, every: int, points: int) -> None:
    assert held_out_eval_points(steps, every) == points == len([v for v in range(steps + 1) if v % every == 0])


def test_episode_counts_of_the_runpod_example() -> None:
    config, specs = example("runpod")
    counts = episode_counts(config, specs)
    assert (counts.train_episodes, counts.held_out_tasks, counts.held_out_evals, counts.held_out_episodes, counts.total) == (320, 1, 21, 84, 404)


def test_held_out_groups_can_be_larger_than_training_groups() -> None:
    config = edited_config("runpod", {"outer": {"held_out_group_size": 10}})
    _, specs = example("runpod")
    counts = episode_counts(config, specs)
    assert (counts.held_out_group_size, counts.held_out_episodes, counts.total) == (10, 21 * 10, 320 + 210)
    assert "21 eval(s) x 1 task(s) x 10 episode(s) = 210" in render_text(build_plan(config, specs, EXAMPLES / "runpod.toml", {}))


def test_no_held_out_task_means_no_held_out_episodes() -> None:
    config, specs = example("sim")
    trainable = {task_id: spec for task_id, spec in specs.items() if not spec.held_out}
    counts = episode_counts(config, trainable)
    assert counts.held_out_evals == counts.held_out_episodes == 0
    assert counts.total == counts.train_episodes == 4 * 2 * 4


# --- prices and per-unit maths ---------------------------------------------------------------


def test_inner_job_usd_is_seconds_at_the_pod_price_stopped_at_the_job_cap() -> None:
    assert inner_job_usd(3600, 0.88, 5.0) == pytest.approx(0.88)
    assert inner_job_usd(60, 0.88, 5.0) == pytest.approx(0.88 / 60)
    assert inner_job_usd(36_000, 0.88, 1.0) == 1.0


def test_pod_price_is_per_gpu_price_times_gpus() -> None:
    assert pod_usd_per_hour("NVIDIA A40", 2, {"NVIDIA A40": 0.44}) == pytest.approx(0.88)
    assert pod_usd_per_hour("NVIDIA L40S", 2, {"NVIDIA A40": 0.44}) is None


def test_tinker_bounds_follow_the_turn_and_context_caps() -> None:
    config, _ = example("tinker")
    agent, outer = config.backends.agent, config.backends.outer
    assert tinker_attempt_tokens(agent) == (24 * 32_768, 32_768)  # sampled tokens cannot exceed one context
    assert tinker_attempt_usd(agent) == pytest.approx((24 * 32_768 * 0.5 + 32_768 * 1.5) / 1e6)
    assert tinker_update_tokens(outer, agent, batch_episodes=8, max_attempts=3) == 8 * 3 * 32_768


def test_parse_gpu_prices() -> None:
    config, _ = example("runpod")
    train = config.backends.train
    assert parse_gpu_prices([], train, "x") == train.estimated_usd_per_gpu_hour == {"NVIDIA A40": 0.44}  # the config's estimate
    assert parse_gpu_prices([], train.model_copy(update={"estimated_usd_per_gpu_hour": {}}), "x") == {}
    # a flag overrides the config's price of its type and adds the others
    assert parse_gpu_prices(["NVIDIA A40=0.5", "NVIDIA L40S=0.86"], train, "x") == {"NVIDIA A40": 0.5, "NVIDIA L40S": 0.86}
    for bad in ["NVIDIA A40", "NVIDIA A40=", "=0.4", "NVIDIA A40=-1", "NVIDIA A40=nan", "NVIDIA A40=inf", "NVIDIA A40=1e9", "NVIDIA H100=2.0"]:
        with pytest.raises(ConfigError) as caught:
            parse_gpu_prices([bad], train, "x")
        assert caught.value.problems[0].field == "--usd-per-gpu-hour"
    sim, _ = example("sim")
    with pytest.raises(ConfigError, match="only Runpod"):
        parse_gpu_prices(["NVIDIA A40=0.44"], sim.backends.train, "x")


# --- the estimate ------------------------------------------------------------------------------


def test_runpod_estimate_without_prices_gives_only_the_job_cap_worst_case() -> None:
    config, specs = sim_eval_example()
    estimate = estimate_costs(config, specs, {})
    train = next(line for line in estimate.lines if line.stage == "train")
    assert train.usd is None and "no offline Runpod price table" in (train.unavailable or "")
    assert train.upper_usd is None and "the warm pool's idle pods" in train.basis  # idle pods are in no job's cap and have no price
    assert estimate.total_usd is None and estimate.upper_usd is None
    assert estimate.cap.binds == "unknown"
    no_pool = edited_config("runpod", {"backends.eval": {"type": "sim"}, "backends.train": {"warm_pool_size": 0}})
    assert next(line for line in estimate_costs(no_pool, specs, {}).lines if line.stage == "train").upper_usd == pytest.approx(404 * 1.0)


def test_fresh_pod_share_follows_the_warm_pool() -> None:
    config, _ = example("runpod")
    backend = config.backends.train
    assert fresh_pod_share(backend.model_copy(update={"warm_pool_size": 0}), 32, 404) == 1.0  # type: ignore[union-attr]
    assert fresh_pod_share(backend.model_copy(update={"warm_pool_size": 16}), 32, 404) == pytest.approx(16 / 404)  # type: ignore[union-attr]
    two = fresh_pod_share(backend.model_copy(update={"warm_pool_size": 2}), 32, 404)  # type: ignore[union-attr]
    assert two == pytest.approx(16 / 404 + (1 - 16 / 404) * (1 - 2 / 16))


def test_runpod_estimate_with_prices() -> None:
    config, specs = sim_eval_example()
    estimate = estimate_costs(config, specs, {"NVIDIA A40": 0.44})
    train = next(line for line in estimate.lines if line.stage == "train")
    # image pull share + start-up + every task's GPU cap (600 s) + upload, at 2 x $0.44/h, and the idle warm pool at the end
    per_job = (pull_s(config) + POD_STARTUP_S + 600 + POD_UPLOAD_S) * 0.88 / 3600
    assert train.usd == pytest.approx(404 * per_job + idle_usd(config, 0.88))
    assert train.upper_usd == pytest.approx(404 * 1.0 + idle_usd(config, 0.88))
    assert estimate.total_usd == pytest.approx(train.usd)  # agent and outer local, eval simulated: not billed
    assert estimate.cap.binds == "may"  # under $300, but 404 jobs at the $1 job cap could reach $404


def test_runpod_estimate_uses_each_tasks_budget() -> None:
    config, specs = example("runpod")
    slow = specs["addition"].model_copy(
        update={"budget": specs["addition"].budget.model_copy(update={"max_gpu_train_seconds": 1200.0, "max_train_seconds": 5.0})}
    )
    estimate = estimate_costs(config, {**specs, "addition": slow}, {"NVIDIA A40": 0.5})
    per_trainable, overhead = 320 / 5, pull_s(config) + POD_STARTUP_S + POD_UPLOAD_S
    expected = (per_trainable * (1200 + overhead) + (per_trainable * 4 + 84) * (600 + overhead)) / 3600 * 1.0 + idle_usd(config, 1.0)
    assert next(line for line in estimate.lines if line.stage == "train").usd == pytest.approx(expected)  # the CPU cap plays no part


def test_eval_cost_is_pod_seconds_at_a_price_or_not_estimated() -> None:
    config, specs = example("runpod")
    from metarl.backends.runpod.eval import estimate_eval_seconds

    seconds = eval_pod_seconds(config, specs["addition"])
    assert seconds == math.ceil(estimate_eval_seconds(specs["addition"], config.backends.eval, score_base=False))
    more = specs["addition"].model_copy(update={"hidden_eval": specs["addition"].hidden_eval.model_copy(update={"pass_k": 4})})
    assert eval_pod_seconds(config, more) > seconds
    slower = edited_config("runpod", {"backends.eval": {"tokens_per_s": 100.0}})
    assert eval_pod_seconds(slower, specs["addition"]) > seconds  # the run's own engine settings are used
    assert eval_cost_usd(seconds, 0.88) == pytest.approx(seconds * 0.88 / 3600)
    assert eval_cost_usd(seconds, None) is None


def test_cost_per_job_is_image_pull_start_up_training_cap_upload_and_eval() -> None:
    config, specs = sim_eval_example()
    costs = job_costs(config, specs, {"NVIDIA A40": 0.44}, 404)
    assert sorted(task for cost in costs for task in cost.task_ids) == sorted(specs)
    cost = cost_of(costs, "addition")
    assert (cost.gpu_count, cost.gpu_type, cost.usd_per_hour) == (2, "NVIDIA A40", pytest.approx(0.88))
    terms = {term.name: term for term in cost.terms}
    assert [term.name for term in cost.terms] == ["image pull", "start-up", "training", "upload", "eval"]
    assert terms["image pull"].seconds == pytest.approx(pull_s(config), abs=0.1) and cost.fresh_pod_share == pytest.approx(pull_s(config) / IMAGE_PULL_S)
    assert (terms["start-up"].seconds, terms["training"].seconds, terms["upload"].seconds) == (POD_STARTUP_S, 600, POD_UPLOAD_S)
    assert all(term.assumes for term in cost.terms)
    # an eval that does not score on the pod is not in the job's cost, and the figure says so
    assert not terms["eval"].billed and terms["eval"].usd is None and not cost.eval_included
    train_seconds = pull_s(config) + POD_STARTUP_S + 600 + POD_UPLOAD_S
    assert cost.pod_seconds == pytest.approx(train_seconds, abs=0.1)
    assert cost.usd == pytest.approx(train_seconds * 0.88 / 3600)
    on_pod = (eval_pod_seconds(config, specs["addition"]) + config.backends.train.poll_interval_s + EVAL_DISPATCH_S) * 0.88 / 3600  # type: ignore[attr-defined]
    assert cost.usd_with_eval_on_pod == pytest.approx(cost.usd + on_pod)
    assert "$0.13-0.30" in cost.reference
    # the worst case: a restart after a start-up that timed out, then a whole attempt; stopped at the job cap
    train = config.backends.train
    worst = IMAGE_PULL_S + train.startup_timeout_s + IMAGE_PULL_S + train.startup_timeout_s + 600 + POD_UPLOAD_S  # type: ignore[attr-defined]
    assert train.max_restarts == 1 and cost.worst_pod_seconds == pytest.approx(worst)  # type: ignore[attr-defined]
    assert cost.worst_usd == pytest.approx(min(worst * 0.88 / 3600, config.budget.max_job_usd))
    unpriced = job_costs(config, specs, {}, 404)
    assert {cost.usd for cost in unpriced} == {None} and {term.usd for cost in unpriced for term in cost.terms} == {None}
    assert {cost.worst_usd for cost in unpriced} == {None}


def test_without_a_warm_pool_every_job_pulls_the_image() -> None:
    config = edited_config("runpod", {"backends.train": {"warm_pool_size": 0}})
    _, specs = example("runpod")
    cost = cost_of(job_costs(config, specs, {"NVIDIA A40": 0.44}, 404), "addition")
    assert cost.fresh_pod_share == 1.0 and cost.terms[0].name == "image pull" and cost.terms[0].seconds == IMAGE_PULL_S


def test_an_eval_on_the_jobs_pod_is_billed_at_the_pod_price() -> None:
    config, specs = example("runpod")
    assert config.backends.eval.type == "pod_vllm"
    cost = cost_of(job_costs(config, specs, {"NVIDIA A40": 0.44}, 404), "addition")
    wait = config.backends.train.poll_interval_s + EVAL_DISPATCH_S  # type: ignore[attr-defined]
    eval_seconds = eval_pod_seconds(config, specs["addition"])
    assert [term.name for term in cost.terms] == ["image pull", "start-up", "training", "upload", "eval wait", "eval"]
    assert cost.eval_included and cost.pod_seconds == pytest.approx(pull_s(config) + POD_STARTUP_S + 600 + POD_UPLOAD_S + wait + eval_seconds, abs=0.1)
    assert cost.usd == pytest.approx(cost.pod_seconds * 0.88 / 3600, abs=1e-4) == pytest.approx(cost.usd_with_eval_on_pod, abs=1e-4)
    estimate = estimate_costs(config, specs, {"NVIDIA A40": 0.44})
    lines = {line.stage: line for line in estimate.lines}
    jobs = {task.task_id: task.episodes for task in build_plan(config, specs, EXAMPLES / "runpod.toml", {}).tasks}
    expected = sum(episodes * (eval_pod_seconds(config, specs[task_id]) + wait) * 0.88 / 3600 for task_id, episodes in jobs.items())
    assert sum(jobs.values()) == 404 and lines["eval"].kind == "nominal" and lines["eval"].usd == pytest.approx(expected)
    assert estimate.total_usd == pytest.approx(lines["train"].usd + lines["eval"].usd)
    assert "hidden eval included" in render_text(build_plan(config, specs, EXAMPLES / "runpod.toml", {"NVIDIA A40": 0.44}))


def test_the_dry_run_shows_gpu_budgets_and_learning_rates() -> None:
    config, specs = example("runpod")
    text = render_text(build_plan(config, specs, EXAMPLES / "runpod.toml", {"NVIDIA A40": 0.44}))
    assert "time cap   600 s per job (the tasks' budget.max_gpu_train_seconds" in text
    assert "learning_rate 3e-06 (LoRA 0.0001), kl_coef 0.001 (-> [trainer.loss] kl_tau" in text
    assert "lr = 3e-06" in text and "kl_tau = 0.001" in text and "interval = 10" in text
    cost = cost_of(job_costs(config, specs, {"NVIDIA A40": 0.44}, 404), "addition")
    assert f"per job   {cost.pod_seconds:>6g} s  ${cost.usd:.4f} (hidden eval included); beside the reference run: $0.13-0.30" in text
    assert f"worst     {cost.worst_pod_seconds:>6g} s  $1.0000" in text and "startup_timeout_s (1800 s, billed)" in text
    assert "training     600 s  $0.1467" in text
    assert all(task.max_train_seconds == 600 for task in build_plan(config, specs, EXAMPLES / "runpod.toml", {}).tasks)
    local, local_specs = example("quickstart")
    local_text = render_text(build_plan(local, local_specs, EXAMPLES / "quickstart.toml", {}))
    assert "learning_rate 0.001 (LoRA 0.001), kl_coef 0 (k3 KL to the base model)" in local_text and "Cost per job" not in local_text


def test_a_plan_without_a_secret_says_its_local_model_paths_are_provisional() -> None:
    config, specs = example("quickstart")
    provisional = render_text(build_plan(config, specs, EXAMPLES / "quickstart.toml", {}, provisional_secret=True))
    settled = render_text(build_plan(config, specs, EXAMPLES / "quickstart.toml", {}))
    assert "no hidden-eval secret yet" in provisional and "provisional" in provisional
    assert "no hidden-eval secret yet" not in settled
    sim, sim_specs = example("sim")
    assert not build_plan(sim, sim_specs, EXAMPLES / "sim.toml", {}).local_models
    assert "no hidden-eval secret yet" not in render_text(build_plan(sim, sim_specs, EXAMPLES / "sim.toml", {}, provisional_secret=True))


def test_tinker_estimate_is_the_token_upper_bound_and_the_cap_binds() -> None:
    config, specs = example("tinker")
    estimate = estimate_costs(config, specs, {})
    lines = {line.stage: line for line in estimate.lines}
    agent = 104 * 3 * (24 * 32_768 * 0.5 + 32_768 * 1.5) / 1e6
    outer = 10 * 8 * 3 * 32_768 * 1.5 / 1e6
    assert lines["agent"].usd == pytest.approx(agent) and lines["agent"].kind == "upper bound"
    assert lines["outer"].usd == pytest.approx(outer)
    assert lines["train"].usd == lines["eval"].usd == 0.0
    assert estimate.total_usd == pytest.approx(agent + outer)
    assert estimate.cap.binds == "yes"
    assert estimate.cap.episodes_within_cap == math.floor(50.0 / ((agent + outer) / 104))


def test_sim_estimate_is_simulated_and_local_is_free() -> None:
    config, specs = example("sim")
    estimate = estimate_costs(config, specs, {})
    train = next(line for line in estimate.lines if line.stage == "train")
    assert train.kind == "simulated" and train.usd == pytest.approx(52 * 0.5 * 0.88 / 3600)
    assert train.upper_usd == pytest.approx(52 * 5.0 * 0.88 / 3600)
    assert estimate.cap.binds == "no"
    local, local_specs = example("quickstart")
    free = estimate_costs(local, local_specs, {})
    assert free.total_usd == free.upper_usd == 0.0 and {line.kind for line in free.lines} == {"not billed"}


def test_sim_agent_with_a_token_price_has_no_bound() -> None:
    config = edited_config("sim", {"backends.agent": {"usd_per_million_tokens": 2.0}})
    _, specs = example("sim")
    estimate = estimate_costs(config, specs, {})
    agent = next(line for line in estimate.lines if line.stage == "agent")
    assert agent.usd == pytest.approx(52 * 1500 * 2.0 / 1e6) and agent.upper_usd is None
    assert estimate.upper_usd is None and estimate.cap.binds == "may"


@pytest.mark.parametrize(
    ("total", "upper", "binds", "within"),
    [
        (120.0, 150.0, "yes", 83),
        (80.0, 150.0, "may", None),
        (80.0, None, "may", None),
        (80.0, 90.0, "no", None),
        (None, 90.0, "no", None),
        (None, 150.0, "unknown", None),
        (None, None, "unknown", None),
    ],
)
def test_cap_check(total: float | None, upper: float | None, binds: str, within: int | None) -> None:
    check = cap_check(total, upper, 100, BudgetConfig(max_run_usd=100.0, max_job_usd=2.0, on_cap="stop"))
    assert check.binds == binds and check.episodes_within_cap == within
    assert "budget.max_run_usd $100.00" in check.message
    if binds == "yes":
        assert "about 83 of 100" in check.message and "running inner jobs are stopped" in check.message


# --- compiled configs ------------------------------------------------------------------------------


def test_compiled_jobs_group_identical_tasks_and_validate() -> None:
    config, specs = example("runpod")
    [job] = compiled_jobs(config, specs)
    assert job.task_ids == list(specs) and job.problems == []
    rl = tomllib.loads(job.rl_toml)
    assert rl == job.rl_config
    assert rl["model"]["name"] == "Qwen/Qwen3-0.6B" and rl["max_steps"] == 40
    assert rl["deployment"] == {"type": "single_node", "gpus_per_node": 2, "num_train_gpus": 1, "num_infer_gpus": 1}
    assert rl["orchestrator"]["batch_size"] == 64 and rl["orchestrator"]["group_size"] == 8
    assert rl["orchestrator"]["train"]["sampling"]["max_completion_tokens"] == 16
    assert rl["ckpt"] == {"interval": 10, "keep_last": 2} and rl["trainer"]["optim"]["lr"] == 3e-6  # GPU cap and GPU defaults
    assert job.rl_toml.startswith("# Compiled by metarl for prime-rl v0.8.0")
    assert tomllib.loads(job.job_toml)["model"]["name"] == "Qwen/Qwen3-0.6B"


def test_compiled_jobs_follow_the_pod_gpus_and_report_problems() -> None:
    config = edited_config("runpod", {"backends.train": {"gpu_count": 4}})
    _, specs = example("runpod")
    odd = specs["caesar"].model_copy(update={"budget": specs["caesar"].budget.model_copy(update={"allowed_models": ["Qwen/Qwen3-32B"]})})
    jobs = compiled_jobs(config, {**specs, "caesar": odd})
    assert len(jobs) == 2
    fine, bad = sorted(jobs, key=lambda job: len(job.problems))
    assert fine.rl_config["deployment"] == {"type": "single_node", "gpus_per_node": 4, "num_train_gpus": 2, "num_infer_gpus": 2}
    assert "caesar" not in fine.task_ids and bad.task_ids == ["caesar"]
    assert bad.problems and "Qwen/Qwen3-32B" in bad.problems[0]


def test_no_compiled_configs_without_runpod() -> None:
    for name in ("sim", "quickstart", "tinker"):
        config, specs = example(name)
        assert compiled_jobs(config, specs) == []


def test_representative_job_is_the_default_on_the_first_allowed_model() -> None:
    _, specs = example("runpod")
    job = representative_job(specs["addition"])
    assert job.model.name == specs["addition"].budget.allowed_models[0]
    assert job.explicit_hyperparameters() == 0


# --- output --------------------------------------------------------------------------------------


def test_text_and_json_output_of_a_runpod_plan() -> None:
    config, specs = example("runpod")
    plan = build_plan(config, specs, EXAMPLES / "runpod.toml", {"NVIDIA A40": 0.44, "NVIDIA L40S": 0.86})
    text = render_text(plan)
    lines = {line.stage: line for line in plan.estimate.lines}
    for expected in (
        "DRY RUN",
        "ghcr.io/your-org/metarl-inner:prime-rl-v0.8.0",
        "2x NVIDIA A40, then NVIDIA RTX A6000, NVIDIA L40S",
        "metarl-<run id[:8]>-<episode id>",
        "up to 16",
        "[orchestrator.renderer]",
        "num_infer_gpus = 1",
        "total      404",
        f"train  runpod  {usd(lines['train'].usd)} (worst case {usd(lines['train'].upper_usd)})",
        f"eval   pod_vllm {usd(lines['eval'].usd)}",
        "image pull",
        "the warm pool's idle pods at the end of the run (2 x idle_timeout_s 300 s, billed to no job)",
        "a fallback GPU type costs up to $1.7200/h",
        "max_run_usd $300.00",
    ):
        assert expected in text, expected
    again = DryRunPlan.model_validate_json(render_json(plan))
    assert again == plan


def test_text_output_says_why_the_pod_estimate_is_unavailable() -> None:
    config, specs = sim_eval_example()
    text = render_text(build_plan(config, specs, EXAMPLES / "runpod.toml", {}))
    assert "train  runpod  unavailable" in text and "--usd-per-gpu-hour" in text
    assert "total  unavailable; worst case unknown" in text


def test_building_a_plan_imports_no_vendor_sdk_or_service_client() -> None:
    code = (
        "import sys\nfrom pathlib import Path\nfrom metarl.runconfig import load_run\nfrom metarl.dry_run import build_plan\n"
        "for name in ('runpod', 'tinker', 'sim', 'quickstart'):\n"
        "    config, specs = load_run(Path('examples') / f'{name}.toml')\n"
        "    build_plan(config, specs, Path(name), {})\n"
        "print(sorted(m for m in ('runpod', 'tinker', 'requests', 'httpx', 'sqlalchemy', 'celery', 'kombu', 'redis', 'psycopg', 'fsspec') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
