"""Issue 40, item 10: a run config listing a task twice, or a simulator duration whose median is above its clamp,
is refused with the field named and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from metarl.backends.sim.config import SimDuration
from schemas.base import ConfigError, parse_toml_text, validate_model
from schemas.run_config import RunConfig

SIM = (Path(__file__).resolve().parents[2] / "examples" / "sim.toml").read_text()


def problems(text: str) -> list[tuple[str, str, str]]:
    with pytest.raises(ConfigError) as info:
        validate_model(RunConfig, parse_toml_text(text, "run.toml"), "run.toml")
    return [(problem.field, problem.message, problem.fix) for problem in info.value.problems]


def edited(old: str, new: str) -> str:
    assert old in SIM, old
    return SIM.replace(old, new, 1)


def test_a_task_listed_twice_is_refused() -> None:
    found = problems(edited('tasks = ["addition"', 'tasks = ["addition", "reversal", "addition"'))
    assert len(found) == 1
    field, message, fix = found[0]
    assert field == "run.tasks" and "'addition' is listed twice" in message and "once" in fix


def test_a_median_above_the_clamp_is_refused() -> None:
    found = problems(edited("duration = { median_s = 0.5, sigma = 0.5, max_s = 5.0 }", "duration = { median_s = 60.0, sigma = 0.5, max_s = 5.0 }"))
    assert len(found) == 1
    field, message, fix = found[0]
    assert field == "backends.train.duration" and "median_s 60.0 is above max_s 5.0" in message and "max_s" in fix


def test_a_median_equal_to_the_clamp_and_the_defaults_are_fine() -> None:
    assert SimDuration(median_s=5.0, max_s=5.0).median_s == 5.0
    assert SimDuration().median_s <= SimDuration().max_s
    with pytest.raises(ValueError, match="above max_s"):
        SimDuration(median_s=31.0)
