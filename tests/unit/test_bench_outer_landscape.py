"""bench.outer_landscape: the synthetic credit's shape, one short learning run on it, and the landscape fitted to measured jobs."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from bench._bandit_reference import PASSING_REWARD, candidate_pool, thompson_rewards
from bench._measured_landscape import cross_validated_r2, fit_landscape, job_features, measured_jobs, parse_job_cell
from bench.outer_landscape import Setting, reference_setting, run_setting, synthetic_credit
from bench.versus_search import job_description
from metarl.domain.reward import job_credit
from metarl.policy import job_language as jl
from metarl.policy.local_policy import LocalPolicy, PolicyConfig
from schemas.base import dump_toml_model, load_toml_model
from schemas.job import JobModel, JobReward, JobSpec, JobTraining
from schemas.run_config import EpisodeRewardWeights
from schemas.task_spec import TaskSpec
from tests.unit.test_versus_search import series_rows

REPO = Path(__file__).resolve().parents[2]
SMALL, LARGE = jl.MODELS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def choice(model: str = SMALL, lr: float | None = None, steps: int | None = None) -> jl.JobChoice:
    hyper = {f"{slot.section}.{slot.key}": None for slot in jl.TRAINING_SLOTS}
    hyper["training.learning_rate"], hyper["training.max_steps"] = lr, steps
    return jl.JobChoice(model, hyper, None, None, None, explicit=sum(v is not None for v in hyper.values()))


def test_credit_rewards_a_low_learning_rate_with_enough_steps_and_punishes_a_high_one() -> None:
    assert synthetic_credit(choice(lr=3e-2)) < synthetic_credit(choice(lr=3e-3)) < synthetic_credit(choice()) < 0  # default lr 1e-3 harms
    assert synthetic_credit(choice(lr=1e-4, steps=1000)) == pytest.approx(0.5 * 170 / 200)  # capped by the small model's 60 s budget
    assert synthetic_credit(choice(lr=3e-4, steps=20)) == pytest.approx(0.05)
    assert synthetic_credit(choice(LARGE, lr=1e-4, steps=1000)) < synthetic_credit(choice(SMALL, lr=1e-4, steps=1000))


def test_a_short_run_returns_one_reward_per_episode_and_is_seeded() -> None:
    tasks = {"addition": load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")}
    setting = Setting("test", groups_per_batch=1)
    first = run_setting(setting, tasks, episodes=10, seed=3, noise=0.3)
    assert len(first) == 10 and all(-2.0 < r < 2.0 for r in first)
    assert run_setting(setting, tasks, episodes=10, seed=3, noise=0.3) == first


def test_a_policy_lag_samples_with_an_earlier_version() -> None:
    tasks = {"addition": load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")}
    on_policy = run_setting(Setting("sync", learning_rate=5e-2, groups_per_batch=1), tasks, episodes=24, seed=3, noise=0.0)
    lagged = run_setting(Setting("lag", learning_rate=5e-2, groups_per_batch=1, policy_lag=1), tasks, episodes=24, seed=3, noise=0.0)
    assert lagged[:4] == on_policy[:4]  # a step is one group of 4: both runs sample step 1 with the initial policy
    assert lagged[4:] != on_policy[4:]


# --- the landscape fitted to measured jobs (bench/_measured_landscape.py) ---------------------------------------


def measured_job(model: str, lr: float | None, steps: int | None = None, correctness: float = 1.0) -> JobSpec:
    return JobSpec(
        model=JobModel(name=model),
        training=JobTraining(learning_rate=lr, max_steps=steps),
        reward=JobReward(components={"correctness": correctness, "format": 0.5}),
    )


def planted_credit(family: str, job: JobSpec) -> float:
    """A landscape the features can express: a family offset, the learning rate's effect depending on the model."""
    lr = job.resolved().learning_rate
    good = {SMALL: 0.2, LARGE: 0.4}[job.model.name]
    return {"addition": -0.1, "sorting": 0.05}[family] + (good if lr <= 3e-4 else -0.3)


def planted(jobs_per_family: int = 40) -> list[tuple[str, JobSpec, float]]:
    rng = random.Random(0)
    measured = []
    for family in ("addition", "sorting"):
        for _ in range(jobs_per_family):
            job = measured_job(rng.choice(jl.MODELS), rng.choice((1e-4, 3e-4, 1e-3, 1e-2, None)), rng.choice((20, 80, 200)))
            measured.append((family, job, planted_credit(family, job)))
    return measured


def test_a_versus_job_cell_parses_back_to_the_job_it_describes() -> None:
    job = measured_job(LARGE, 3e-4, 200)
    cell = job_description(dump_toml_model(job))
    assert parse_job_cell(cell) == job
    assert parse_job_cell("model.name=Qwen/Qwen3-0.6B training.learning_rate=1e-05").training.learning_rate == 1e-05


def test_features_fill_in_defaults_and_cross_learning_rate_and_steps_with_the_model() -> None:
    features = job_features(measured_job(SMALL, None, None))
    assert f"training.learning_rate=0.001|{SMALL}" in features  # the CPU default learning rate
    assert f"training.max_steps=40|{SMALL}" in features
    assert "training.batch_size=64" in features and "rewards_correctness=True" in features
    assert "rewards_correctness=False" in job_features(measured_job(SMALL, 1e-4, correctness=-1.0))


def test_the_fit_recovers_a_planted_landscape_and_predicts_held_out_jobs() -> None:
    measured = planted()
    landscape = fit_landscape(measured, ridge=0.01)
    for family, job, credit in measured[:10]:
        assert landscape.credit(family, job) == pytest.approx(credit, abs=0.02)
    assert landscape.residual_std < 0.02
    assert cross_validated_r2(measured, ridge=0.01) > 0.95
    unseen = landscape.credit("caesar", measured_job(LARGE, 1e-4))  # no measurements: the mean family offset
    assert unseen == pytest.approx((-0.1 + 0.05) / 2 + 0.4, abs=0.03)


def test_credits_that_do_not_follow_the_settings_are_not_predicted() -> None:
    rng = random.Random(1)
    measured = [(family, job, rng.gauss(0.0, 0.3)) for family, job, _ in planted()]
    assert cross_validated_r2(measured, ridge=3.0) < 0.1


def test_only_passed_jobs_with_settings_are_measured_and_an_empty_set_is_refused() -> None:
    job = job_description(dump_toml_model(measured_job(SMALL, 1e-4)))
    rows = series_rows("random_search", "addition", 0, [0.6, None])
    rows = [row.model_copy(update={"job": job}) for row in rows]
    [(family, parsed, credit)] = measured_jobs(rows)
    assert family == "addition" and parsed.training.learning_rate == 1e-4
    assert credit == pytest.approx(job_credit(rows[0].base_score, 0.6, EpisodeRewardWeights().min_headroom))
    with pytest.raises(ValueError, match="no passed job"):
        fit_landscape([])


# --- the reference learner (bench/_bandit_reference.py) -------------------------------------------------------


def test_thompson_sampling_finds_the_best_jobs_of_a_planted_landscape() -> None:
    tasks = {family: load_toml_model(TaskSpec, REPO / "tasks_specs" / f"{family}.toml") for family in ("addition", "sorting")}
    landscape = fit_landscape(planted(), ridge=0.1)
    pool = candidate_pool(tasks, LocalPolicy(PolicyConfig(init_seed=0, default_bias=1.0)), per_family=150)
    best = {family: max(landscape.credit(family, candidate.job) for candidate in candidates) for family, candidates in pool.items()}
    mean_best = sum(best.values()) / len(best)
    rewards = thompson_rewards(pool, landscape, episodes=60, seed=1, noise=0.05, prior_precision=1.0, posterior_scale=0.3)
    assert len(rewards) == 60
    first, last = sum(rewards[:10]) / 10, sum(rewards[-20:]) / 20
    assert last - PASSING_REWARD > mean_best - 0.1 and last > first + 0.2
    with pytest.raises(ValueError, match="noise"):
        thompson_rewards(pool, landscape, episodes=1, seed=1, noise=0.0, prior_precision=1.0, posterior_scale=0.3)


def test_a_reference_setting_is_checked_before_any_simulation() -> None:
    assert reference_setting("30:0.3") == (30.0, 0.3)
    for bad in ("30", "x:1", "0:1", "3:-1", "nan:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="PRECISION:SCALE|precision"):
            reference_setting(bad)
