"""Pure rules for groups, staleness and outer batches."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupView:
    """What batching needs to know of one complete group."""

    group_id: int
    policy_version: int


def staleness(group_version: int, current_version: int) -> int:
    """How many policy versions behind the current one a group was sampled."""
    return current_version - group_version


def oldest_fresh_version(current_version: int, max_steps_off_policy: int) -> int:
    """The oldest policy version whose groups may still train the current one; a group sampled before it is stale.

    The one rule of staleness (`outer.max_steps_off_policy`): :func:`is_stale`, the orchestrator's drop of stale
    groups and :func:`metarl.outer_update.filter_stale` all use it.
    """
    return current_version - max_steps_off_policy


def is_stale(group_version: int, current_version: int, max_steps_off_policy: int) -> bool:
    """True when a group sampled with `group_version` is more than `max_steps_off_policy` versions behind."""
    return group_version < oldest_fresh_version(current_version, max_steps_off_policy)


@dataclass(frozen=True)
class BatchPlan:
    """Which complete groups go into the next outer update, and which are dropped as too stale."""

    batch: tuple[int, ...]
    stale: tuple[int, ...]


def plan_batch(groups: list[GroupView], current_version: int, max_steps_off_policy: int, groups_per_batch: int) -> BatchPlan:
    """Oldest fresh groups first; return an empty batch until `groups_per_batch` fresh groups exist."""
    stale = tuple(g.group_id for g in groups if is_stale(g.policy_version, current_version, max_steps_off_policy))
    fresh = sorted((g for g in groups if not is_stale(g.policy_version, current_version, max_steps_off_policy)), key=lambda g: (g.policy_version, g.group_id))
    if len(fresh) < groups_per_batch:
        return BatchPlan(batch=(), stale=stale)
    return BatchPlan(batch=tuple(g.group_id for g in fresh[:groups_per_batch]), stale=stale)


def groups_to_open(in_flight_episodes: int, window: int, group_size: int) -> int:
    """How many new groups to open so that the window stays full (whole groups only)."""
    free = window - in_flight_episodes
    if free <= 0:
        return 0
    return -(-free // group_size)


def groups_allowed_ahead(waiting_groups: int, outer_busy: int, groups_per_batch: int, batches_ahead: int | None) -> int | None:
    """How many more trainable groups may open so that groups are sampled at most `batches_ahead` batches ahead of the
    outer step that will train on them; None when `batches_ahead` is None (no limit: the in-flight window alone decides).

    `waiting_groups` are the trainable groups open or complete but not batched; `outer_busy` the outer steps dispatched
    and not applied (each holds one batch of groups). With 0 (synchronous) the next batch's groups open only after the
    previous step is applied, so every group is trained on by the version that sampled it.
    """
    if batches_ahead is None:
        return None
    if batches_ahead < 0 or groups_per_batch < 1:
        raise ValueError(f"batches_ahead is {batches_ahead} and groups_per_batch {groups_per_batch}; they must be >= 0 and >= 1")
    pending = waiting_groups + outer_busy * groups_per_batch
    return max(0, groups_per_batch * (batches_ahead + 1) - pending)


def group_complete(n_finished: int, size: int) -> bool:
    return n_finished >= size


def tasks_to_open(count: int, resample_tasks: list[str], trainable: list[str], opened_so_far: int) -> list[str]:
    """The task of each of `count` new groups: first the tasks of dropped groups to resample, then the trainable tasks in turn."""
    return [resample_tasks[index] if index < len(resample_tasks) else trainable[(opened_so_far + index) % len(trainable)] for index in range(count)]


def common_failure_cause(errors: list[str | None]) -> str | None:
    """The one cause shared by every error (digits ignored, so episode ids and counts do not tell causes apart); None if they differ."""
    if not errors or any(error is None for error in errors):
        return None
    causes = {re.sub(r"\d+", "N", str(error)) for error in errors}
    return str(errors[0]) if len(causes) == 1 else None


def window_failure_cause(outcomes: list[tuple[bool, str | None]], window: int) -> str | None:
    """Why the run cannot go on: the last `window` ended trainable episodes (newest first: rewarded?, error) all failed
    for one cause; None while fewer ended, any was rewarded, or their causes differ."""
    recent = outcomes[:window]
    if window < 1 or len(recent) < window or any(rewarded for rewarded, _error in recent):
        return None
    return common_failure_cause([error for _rewarded, error in recent])
