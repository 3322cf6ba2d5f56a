"""bench.outer_landscape: the synthetic credit's shape and one short learning run on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.outer_landscape import Setting, run_setting, synthetic_credit
from metarl.policy import job_language as jl
from schemas.base import load_toml_model
from schemas.task_spec import TaskSpec

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
