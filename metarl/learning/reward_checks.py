"""What a reward function's answers count as in training: the check of one batch of rewards against the reward
rule (:mod:`metarl.reward_rule`), and the error that ends a job when they are unusable. Pure; the sandboxed
reward sources that produce the answers are in :mod:`metarl.probe.reward_source`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from metarl import reward_rule
from metarl.errors import MetarlError
from schemas.base import printable

REWARD_FUNCTION = "reward"
"""The name the environment module's reward function must have."""
SHOWN_CHARS = 60

Rollout = tuple[str, str, str]
"""One rollout as a reward function sees it: (prompt, completion, answer)."""

BatchRewardFn = Callable[[list[Rollout]], Sequence[Any]]
"""A step's rollouts in, one reward per rollout out (validated by :func:`checked_rewards`)."""


class RewardFunctionError(MetarlError):
    """The reward function failed or returned unusable rewards; the inner job fails with this message.

    ``step`` is the 0-based training step it happened in (None: before training, e.g. at import).
    """

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.step = step

    def at_step(self, step: int) -> RewardFunctionError:
        """The same failure, located at a training step."""
        return RewardFunctionError(f"step {step}: {self.message}", step=step)


class RewardBounds(BaseModel):
    """How the rewards a reward function returns are checked and clamped (the bounds of :mod:`metarl.reward_rule`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    clip: float = Field(default=reward_rule.CLIP, gt=0.0, le=1e9, description="Accepted rewards are clamped to [-clip, clip].")
    reject_above: float = Field(
        default=reward_rule.REJECT_ABOVE, gt=0.0, le=1e12, description="A reward whose magnitude exceeds this fails the job (a bug, not a signal)."
    )

    @model_validator(mode="after")
    def _clip_within_rejection(self) -> RewardBounds:
        if self.clip > self.reject_above:
            raise ValueError("clip must not exceed reject_above")
        return self


def _show(text: str, limit: int = SHOWN_CHARS) -> str:
    text = printable(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def describe_rollout(rollout: Rollout) -> str:
    """A short, printable description of one rollout for an error message."""
    prompt, completion, answer = rollout
    return f"prompt={_show(prompt)}, completion={_show(completion)}, answer={_show(answer)}"


def clamp_reward(value: float, bounds: RewardBounds) -> float:
    """``value`` clamped to ``[-bounds.clip, bounds.clip]`` (:func:`metarl.reward_rule.clamp`)."""
    return reward_rule.clamp(value, bounds.clip)


def reward_problem(value: object, bounds: RewardBounds) -> str | None:
    """Why ``value`` is not a usable reward (None when it is): :func:`metarl.reward_rule.reward_problem`; never raises."""
    return reward_rule.reward_problem(value, bounds.reject_above)


def checked_rewards(values: object, batch: Sequence[Rollout], bounds: RewardBounds) -> list[float]:
    """The rewards as floats, one per rollout of ``batch``, clamped; :class:`RewardFunctionError` otherwise.

    Rejected: anything but a list or tuple, the wrong count, and any element that is a bool, not a
    number, NaN, infinite or larger in magnitude than ``bounds.reject_above``. The message names
    the first bad rollout.
    """
    if not isinstance(values, (list, tuple)):
        raise RewardFunctionError(f"the reward function returned {type(values).__name__}, not a list of rewards")
    if len(values) != len(batch):
        raise RewardFunctionError(f"the reward function returned {len(values)} rewards for {len(batch)} rollouts")
    rewards = []
    for index, (value, rollout) in enumerate(zip(values, batch)):
        reward = reward_rule.training_reward(value, bounds.clip, bounds.reject_above)
        if reward is None:
            raise RewardFunctionError(
                f"{REWARD_FUNCTION}() {reward_problem(value, bounds)} for rollout {index} ({describe_rollout(rollout)}); "
                "return a finite number for every (prompt, completion, answer)"
            )
        rewards.append(reward)
    return rewards
