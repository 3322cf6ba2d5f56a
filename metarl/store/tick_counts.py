"""The counters one orchestrator tick decides on, read in one statement, and how the tick's own actions move them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy.orm import Session

from metarl.domain.transitions import ACTIVE_STAGES
from metarl.store.db import run_sql
from metarl.store.ledger import RUN_SPEND_SQL
from metarl.store.records import GroupStatus, OuterStatus

TICK_COUNTS_SQL = f"""
SELECT o.steps, o.busy, o.done, o.dropped_counted, g.trainable, g.waiting, g.dropped, e.active, c.spent
FROM (SELECT count(*) AS steps,
             count(*) FILTER (WHERE status = ANY(%(busy)s)) AS busy,
             count(*) FILTER (WHERE status = %(done)s) AS done,
             coalesce(sum(dropped_stale_groups), 0) AS dropped_counted
      FROM outer_steps WHERE run_id = %(run_id)s) o,
     (SELECT count(*) FILTER (WHERE NOT held_out) AS trainable,
             count(*) FILTER (WHERE NOT held_out AND status = ANY(%(waiting)s)) AS waiting,
             count(*) FILTER (WHERE status = %(dropped)s) AS dropped
      FROM episode_groups WHERE run_id = %(run_id)s) g,
     (SELECT count(*) AS active FROM episodes WHERE run_id = %(run_id)s AND stage = ANY(%(active)s)) e,
     (SELECT ({RUN_SPEND_SQL}) AS spent) c
"""
"""Sent as written (no ORM compilation): every tick runs it once instead of about ten small counts."""


@dataclass(frozen=True)
class TickCounts:
    """What a tick counts of its run; the tick adjusts a copy as it drops, batches and opens groups."""

    outer_steps: int
    outer_busy: int
    outer_done: int
    dropped_counted: int
    trainable_groups: int
    waiting_groups: int
    dropped_groups: int
    active_episodes: int
    spent_usd: float

    def after_dropping(self, groups: int) -> TickCounts:
        """Complete groups marked dropped as too stale."""
        return replace(self, waiting_groups=self.waiting_groups - groups, dropped_groups=self.dropped_groups + groups)

    def after_batching(self, groups: int, dropped_recorded: int) -> TickCounts:
        """A new pending outer step that took `groups` complete groups and recorded `dropped_recorded` drops."""
        return replace(
            self,
            outer_steps=self.outer_steps + 1,
            outer_busy=self.outer_busy + 1,
            waiting_groups=self.waiting_groups - groups,
            dropped_counted=self.dropped_counted + dropped_recorded,
        )

    def after_opening(self, groups: int, episodes: int, trainable: bool) -> TickCounts:
        """New open groups (trainable or held out) and their episodes, all at their first stage."""
        return replace(
            self,
            trainable_groups=self.trainable_groups + (groups if trainable else 0),
            waiting_groups=self.waiting_groups + (groups if trainable else 0),
            active_episodes=self.active_episodes + episodes,
        )

    @property
    def dropped_unrecorded(self) -> int:
        """Dropped groups no outer step has counted yet."""
        return self.dropped_groups - self.dropped_counted


def read_tick_counts(session: Session, run_id: str) -> TickCounts:
    """The run's counters, in the caller's transaction (one round trip)."""
    row = run_sql(
        session,
        TICK_COUNTS_SQL,
        {
            "run_id": run_id,
            "busy": [OuterStatus.pending.value, OuterStatus.running.value],
            "done": OuterStatus.done.value,
            "waiting": [GroupStatus.open.value, GroupStatus.complete.value],
            "dropped": GroupStatus.dropped.value,
            "active": [stage.value for stage in ACTIVE_STAGES],
        },
    ).one()
    steps, busy, done, dropped_counted, trainable, waiting, dropped, active, spent = row
    return TickCounts(
        outer_steps=int(steps),
        outer_busy=int(busy),
        outer_done=int(done),
        dropped_counted=int(dropped_counted),
        trainable_groups=int(trainable),
        waiting_groups=int(waiting),
        dropped_groups=int(dropped),
        active_episodes=int(active),
        spent_usd=float(spent),
    )
