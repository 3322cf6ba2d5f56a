"""Training-time caps that vary per group of episodes, so one policy learns several budgets (run config `run.episode_train_seconds`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def group_time_cap(choices: Sequence[float], run_seed: int, group_id: int) -> float | None:
    """The cap of a group's episodes: one of `choices`, the same for every episode of the group and every worker (None: no choices, the task's own)."""
    if not choices:
        return None
    digest = hashlib.sha256(f"time-cap:{run_seed}:{group_id}".encode()).digest()
    return float(choices[int.from_bytes(digest[:4], "big") % len(choices)])
