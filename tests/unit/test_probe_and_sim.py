"""The probe's semantic checks and the simulator's determinism."""

from __future__ import annotations

import random

from metarl.backends.sim.config import SimAgentBackend, SimDuration, SimEvalBackend
from metarl.backends.sim.simulator import SimAgent, SimEval, simulated_improvement
from metarl.interfaces import EpisodeContext
from metarl.probe.job import probe_job_text
from metarl.runconfig import load_run
from schemas.base import dump_toml_model, load_toml_model
from schemas.job import JobModel, JobSpec, JobTraining
from schemas.task_spec import TaskSpec
from tests.conftest import REPO

TASK = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")


def job(**training):
    return JobSpec(model=JobModel(name="Qwen/Qwen3-0.6B"), training=JobTraining(**training))


def test_valid_job_passes():
    verdict = probe_job_text(dump_toml_model(job(batch_size=32, group_size=8)), TASK)
    assert verdict.passed, verdict.errors


def test_indivisible_batch_is_rejected_with_a_fix():
    verdict = probe_job_text(dump_toml_model(job(batch_size=30, group_size=8)), TASK)
    assert not verdict.passed
    assert verdict.errors[0].field == "training.batch_size"
    assert "multiple of 8" in verdict.errors[0].fix


def test_over_budget_is_rejected():
    verdict = probe_job_text(dump_toml_model(job(max_steps=100_000, batch_size=512, group_size=8)), TASK)
    assert [e.field for e in verdict.errors] == ["training.max_steps"]


def test_sim_agent_is_deterministic_and_improves_with_version():
    agent = SimAgent(SimAgentBackend(type="sim", duration=SimDuration(median_s=0.0), invalid_rate=0.5))

    def invalid_share(version: int) -> float:
        bad = 0
        for episode in range(1, 201):
            ctx = EpisodeContext(run_id="r", episode_id=episode, task=TASK, policy_version=version, probe_attempt=1, seed=1, artifacts_root="/tmp")
            bad += not probe_job_text(agent.run_attempt(ctx).job_toml, TASK).passed
        return bad / 200

    assert invalid_share(0) == invalid_share(0)
    assert invalid_share(10) < invalid_share(0) - 0.2


def test_sim_response_surface_prefers_sensible_lr_and_groups():
    rng = random.Random(0)
    good = simulated_improvement(job(learning_rate=1e-3, group_size=8, batch_size=64, max_steps=60), 0.0, rng)
    bad_lr = simulated_improvement(job(learning_rate=0.5, group_size=8, batch_size=64, max_steps=60), 0.0, rng)
    no_group = simulated_improvement(job(learning_rate=1e-3, group_size=1, batch_size=64, max_steps=60), 0.0, rng)
    assert good > 0.3 and bad_lr < 0.01 and no_group == 0.0


def test_sim_base_score_is_stable():
    evaluator = SimEval(SimEvalBackend(type="sim"))
    assert evaluator.score_base(TASK, "Qwen/Qwen3-0.6B") == evaluator.score_base(TASK, "Qwen/Qwen3-0.6B")


def test_sim_example_runs_on_the_simulator_and_quickstart_and_local_example_on_the_local_backends():
    config, specs = load_run(REPO / "examples" / "sim.toml")
    assert sum(spec.held_out for spec in specs.values()) == 1
    assert {config.backends.agent.type, config.backends.train.type, config.backends.eval.type, config.backends.outer.type} == {"sim"}
    for name in ("quickstart.toml", "local.toml"):
        local, _ = load_run(REPO / "examples" / name)
        assert {local.backends.agent.type, local.backends.train.type, local.backends.eval.type, local.backends.outer.type} == {"local"}


def test_a_difficulty_outside_the_declared_range_is_rejected_with_the_range() -> None:
    narrow = TASK.model_copy(update={"data": TASK.data.model_copy(update={"difficulty_range": (0.0, 0.25)})})
    plain = job(batch_size=32, group_size=8)
    easy = plain.model_copy(update={"dataset": plain.dataset.model_copy(update={"difficulty": 0.25})})
    assert probe_job_text(dump_toml_model(easy), narrow).passed
    verdict = probe_job_text(dump_toml_model(job(batch_size=32, group_size=8)), narrow)
    assert [problem.field for problem in verdict.errors] == ["dataset.difficulty"]
    assert "[0, 0.25]" in verdict.errors[0].message and "between 0 and 0.25" in verdict.errors[0].fix
    assert probe_job_text(dump_toml_model(job(batch_size=32, group_size=8)), TASK).passed
