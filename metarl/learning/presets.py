"""Reference inner-job configs: a sensible one per base model, and a deliberately bad one."""

from __future__ import annotations

from typing import NamedTuple

from metarl.learning.families import TaskFamily
from metarl.learning.grpo import LocalTrainConfig
from metarl.learning.models import resolve_model_name


class SensibleSettings(NamedTuple):
    """The per-model part of the sensible config."""

    learning_rate: float
    max_steps: int
    time_budget_s: float


SENSIBLE_SETTINGS: dict[str, SensibleSettings] = {
    "local-s": SensibleSettings(learning_rate=3e-4, max_steps=300, time_budget_s=55.0),
    "local-l": SensibleSettings(learning_rate=2e-4, max_steps=300, time_budget_s=240.0),
}
"""Per-model settings of the sensible config; the larger model wants a lower rate and more time.

The time budget binds before ``max_steps`` on 2 cores; the small model's budget leaves room for
loading and saving inside one minute of wall time."""

BAD_LEARNING_RATE = 3e-2
"""A learning rate two orders of magnitude too high: the policy collapses within a few steps."""

BAD_MAX_STEPS = 50
"""Steps of the bad config (it has collapsed long before; more steps only cost time)."""


def sensible_config(base_model: str, family: TaskFamily, *, seed: int = 0) -> LocalTrainConfig:
    """A config that reliably improves the base model on ``family`` (B=32 prompts x G=8, one update per batch)."""
    local_name = resolve_model_name(base_model)
    settings = SENSIBLE_SETTINGS[local_name]
    return LocalTrainConfig(
        base_model=local_name,
        batch_size=32,
        group_size=8,
        updates_per_batch=1,
        temperature=1.0,
        max_tokens=family.max_answer_chars + 1,
        seed=seed,
        learning_rate=settings.learning_rate,
        max_steps=settings.max_steps,
        time_budget_s=settings.time_budget_s,
    )


def bad_config(base_model: str, family: TaskFamily, *, seed: int = 0) -> LocalTrainConfig:
    """The sensible config with a learning rate far too high (and fewer steps: it collapses early)."""
    return sensible_config(base_model, family, seed=seed).model_copy(update={"learning_rate": BAD_LEARNING_RATE, "max_steps": BAD_MAX_STEPS})
