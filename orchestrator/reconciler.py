"""When the reconciler runs: stage work and outer steps not done and not in safe hands are sent again (idempotently).

What it finds and marks is read in the tick's transaction (`metarl.store.reconcile`); this module
decides when a tick runs a pass: on the first tick of an orchestrator (resume) and then every
:func:`reconcile_interval_s`.
"""

from __future__ import annotations

import datetime as dt
import time

from metarl.store import RunTick, StageDispatch
from schemas.run_config import RunConfig


def reconcile_interval_s(config: RunConfig) -> float:
    """Seconds between reconciler passes: a quarter of the shorter of the lease and the re-dispatch delay
    (so a lost stage is re-sent at most 25% later than those allow), never more often than the tick.

    Ticks also come on demand (metarl.store.tick_wakeup); the reconciler scans the run's active episodes,
    so it does not run on every one of them.
    """
    return max(config.window.tick_s, min(config.retries.lease_s, config.retries.redispatch_after_s) / 4)


class Reconciler:
    """Runs a pass on the first tick and then at most every `reconcile_interval_s` (monotonic clock)."""

    def __init__(self) -> None:
        self._next_pass = 0.0

    def pass_if_due(self, tick: RunTick, config: RunConfig, now: dt.datetime, *, startup: bool) -> tuple[list[StageDispatch], list[int]]:
        """The stage messages and outer steps to send again (marked dispatched `now` in the tick's transaction), or nothing when no pass is due.

        At startup every unclaimed item is re-sent at once.
        """
        if not startup and time.monotonic() < self._next_pass:
            return [], []
        retries = config.retries
        dispatches = tick.orphaned_episodes(now, retries.redispatch_after_s, retries.lease_s, startup)
        outer_ids = tick.orphaned_outer_steps(now, retries.redispatch_after_s, retries.lease_s, startup)
        self._next_pass = time.monotonic() + reconcile_interval_s(config)
        return dispatches, outer_ids
