"""Group-relative advantages: the one definition for the outer update and the local inner trainer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

FLAT_GROUP_SPREAD = 1e-12
"""A group whose rewards spread no more than this carries no signal: its advantages are zeros."""


def centred_rewards(rewards: Sequence[float], normalize_std: bool, eps: float) -> list[float]:
    """One group's advantages: each reward minus the group's mean, divided by (the population std + ``eps``) when
    ``normalize_std``; zeros for a flat group (all rewards equal, a group of one included). Raises ValueError on a
    reward that is not finite."""
    values = [float(r) for r in rewards]
    if not values:
        return []
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite, got {values}")
    mean = sum(values) / len(values)
    centred = [v - mean for v in values]
    if max(values) - min(values) <= FLAT_GROUP_SPREAD:
        return [0.0] * len(values)
    if normalize_std:
        std = math.sqrt(sum(c * c for c in centred) / len(centred))
        centred = [c / (std + eps) for c in centred]
    return centred


def group_advantages(rewards_by_group, normalize_std: bool = False, eps: float = 1e-6):
    """Group-relative advantages (:func:`centred_rewards` per group).

    `rewards_by_group` is a sequence of reward lists (returns a list of lists) or a mapping
    group id -> rewards (returns a dict with the same keys).
    """
    if isinstance(rewards_by_group, Mapping):
        return {key: centred_rewards(rewards, normalize_std, eps) for key, rewards in rewards_by_group.items()}
    return [centred_rewards(rewards, normalize_std, eps) for rewards in rewards_by_group]
