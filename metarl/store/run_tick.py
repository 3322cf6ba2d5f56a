"""One orchestrator tick's transaction: the run's row locked, the reads the tick decides on and the moves it makes.

`orchestrator.loop` decides (which groups to drop, batch and open, when the run ends); this module
holds every statement of that: a tick is one transaction, opened by :func:`run_tick` with the run's
row locked (`RUN_ROW_LOCK`) and committed when the tick's block ends, before any message is sent.
The statements are the same, in the same order, as when the loop held the session itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from metarl.errors import RunNotFound
from metarl.store.db import session_scope
from metarl.store.episodes import open_groups, run_config_of
from metarl.store.reconcile import StageDispatch, orphaned_episodes, orphaned_outer_steps
from metarl.store.records import RUN_ROW_LOCK, Episode, EpisodeGroup, GroupStatus, OuterStatus, OuterStep, Run, RunStatus, Stage
from metarl.store.tick_counts import TickCounts, read_tick_counts
from schemas.run_config import RunConfig


@dataclass(frozen=True)
class CompleteGroup:
    """A trainable group whose episodes all ended, waiting for an outer step."""

    group_id: int
    policy_version: int
    size: int


class RunTick:
    """The tick's view of its locked run and the statements it sends, all in the one transaction of :func:`run_tick`."""

    def __init__(self, session: Session, run: Run):
        self._session = session
        self._run = run

    @property
    def run_id(self) -> str:
        return self._run.id

    @property
    def status(self) -> RunStatus:
        return self._run.status

    @property
    def stop_requested(self) -> bool:
        return self._run.stop_requested

    @property
    def policy_version(self) -> int:
        return self._run.policy_version

    @property
    def status_message(self) -> str | None:
        return self._run.status_message

    @property
    def task_specs(self) -> dict[str, Any]:
        """The run's task specs as stored (task id -> spec as JSON)."""
        return self._run.task_specs

    def config(self) -> RunConfig:
        """The run's validated config."""
        return run_config_of(self._run)

    def beat(self, now: dt.datetime) -> None:
        """Record that an orchestrator drives the run (written with the tick's next statement)."""
        self._run.orchestrator_heartbeat_at = now

    def orphaned_episodes(self, now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> list[StageDispatch]:
        """Stage work to send again, marked dispatched now (`metarl.store.reconcile.orphaned_episodes`)."""
        return orphaned_episodes(self._session, self._run.id, now, redispatch_after_s, lease_s, startup)

    def orphaned_outer_steps(self, now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> list[int]:
        """Outer steps to send again, marked dispatched now (`metarl.store.reconcile.orphaned_outer_steps`)."""
        return orphaned_outer_steps(self._session, self._run.id, now, redispatch_after_s, lease_s, startup)

    def counts(self) -> TickCounts:
        """The run's counters, one statement (`metarl.store.tick_counts`)."""
        return read_tick_counts(self._session, self._run.id)

    def drop_stale_groups(self, below_version: int) -> list[str]:
        """Mark dropped the complete trainable groups sampled under a policy version below `below_version`; their task ids."""
        stale = (
            self._session.execute(
                select(EpisodeGroup).where(
                    EpisodeGroup.run_id == self._run.id,
                    EpisodeGroup.status == GroupStatus.complete,
                    EpisodeGroup.held_out.is_(False),
                    EpisodeGroup.policy_version < below_version,
                )
            )
            .scalars()
            .all()
        )
        for group in stale:
            group.status = GroupStatus.dropped
        return [group.task_id for group in stale]

    def drop_unscored_groups(self) -> list[str]:
        """Mark dropped the complete trainable groups none of whose episodes ended with a reward (an outer step on them
        would learn nothing); their task ids, to open again."""
        rewarded = select(Episode.id).where(Episode.group_id == EpisodeGroup.id, Episode.stage == Stage.done).exists()
        unscored = (
            self._session.execute(
                select(EpisodeGroup).where(
                    EpisodeGroup.run_id == self._run.id, EpisodeGroup.status == GroupStatus.complete, EpisodeGroup.held_out.is_(False), ~rewarded
                )
            )
            .scalars()
            .all()
        )
        for group in unscored:
            group.status = GroupStatus.dropped
        return [group.task_id for group in unscored]

    def recent_trainable_outcomes(self, limit: int) -> list[tuple[bool, str | None]]:
        """The newest `limit` ended trainable episodes, newest first: (ended with a reward, error)."""
        rows = self._session.execute(
            select(Episode.stage, Episode.error)
            .where(Episode.run_id == self._run.id, Episode.held_out.is_(False), Episode.stage.in_((Stage.done, Stage.failed)))
            .order_by(Episode.finished_at.desc().nulls_last(), Episode.id.desc())
            .limit(limit)
        ).all()
        return [(stage == Stage.done, error) for stage, error in rows]

    def complete_groups(self) -> list[CompleteGroup]:
        """The run's complete trainable groups (not yet batched)."""
        rows = self._session.execute(
            select(EpisodeGroup.id, EpisodeGroup.policy_version, EpisodeGroup.size).where(
                EpisodeGroup.run_id == self._run.id, EpisodeGroup.status == GroupStatus.complete, EpisodeGroup.held_out.is_(False)
            )
        ).all()
        return [CompleteGroup(group_id, version, size) for group_id, version, size in rows]

    def create_outer_step(self, *, step: int, group_ids: Sequence[int], n_episodes: int, dropped_stale_groups: int, dispatched_at: dt.datetime) -> int:
        """A pending outer step over `group_ids` (complete groups, marked batched into it) from the run's policy version; its id."""
        outer = OuterStep(
            run_id=self._run.id,
            step=step,
            status=OuterStatus.pending,
            policy_version_before=self._run.policy_version,
            n_groups=len(group_ids),
            n_episodes=n_episodes,
            dropped_stale_groups=dropped_stale_groups,
            dispatched_at=dispatched_at,
            metrics={},
        )
        self._session.add(outer)
        self._session.flush()
        self._session.execute(
            update(EpisodeGroup)
            .where(EpisodeGroup.id.in_(group_ids), EpisodeGroup.status == GroupStatus.complete)
            .values(status=GroupStatus.batched, outer_step_id=outer.id)
        )
        return outer.id

    def held_out_group_exists(self, task_id: str, policy_version: int) -> bool:
        """Whether the run has a held-out group of this task sampled under this policy version."""
        found = self._session.execute(
            select(EpisodeGroup.id).where(
                EpisodeGroup.run_id == self._run.id,
                EpisodeGroup.task_id == task_id,
                EpisodeGroup.policy_version == policy_version,
                EpisodeGroup.held_out.is_(True),
                EpisodeGroup.start_set.is_(False),
            )
        ).first()
        return found is not None

    def start_set_opened(self) -> bool:
        """Whether the run's start set has been opened (it is opened once, at policy version 0)."""
        found = self._session.execute(select(EpisodeGroup.id).where(EpisodeGroup.run_id == self._run.id, EpisodeGroup.start_set.is_(True))).first()
        return found is not None

    def open_groups(self, task_ids: Sequence[str], *, size: int, held_out: bool, now: dt.datetime, start_set: bool = False) -> list[int]:
        """One group per task id at the run's policy version, its episodes at their first stage, in one statement; the episode ids."""
        return open_groups(
            self._session,
            run_id=self._run.id,
            task_ids=task_ids,
            policy_version=self._run.policy_version,
            size=size,
            held_out=held_out,
            now=now,
            start_set=start_set,
        )

    def set_status(self, status: RunStatus) -> None:
        """Change the run's status (its message stays)."""
        self._run.status = status

    def set_status_message(self, message: str) -> None:
        """Change the run's status message."""
        self._run.status_message = message

    def end(self, status: RunStatus, finished_at: dt.datetime, message: str | None = None) -> None:
        """The run ended with `status` (finished, stopped) at `finished_at`; `message`, when given, replaces its status message."""
        self._run.status = status
        if message is not None:
            self._run.status_message = message
        self._run.finished_at = finished_at


@contextmanager
def run_tick(database_url: str, run_id: str) -> Iterator[RunTick]:
    """The tick's transaction, with the run's row locked until it commits at the end of the block (rolled back on an error).

    Raises RunNotFound when there is no such run.
    """
    with session_scope(database_url) as session:
        run = session.get(Run, run_id, with_for_update=RUN_ROW_LOCK)
        if run is None:
            raise RunNotFound(f"no run with id {run_id}")
        yield RunTick(session, run)
