"""The reconciler's reads and re-dispatch marks: stage work and outer steps that are not done and not in safe hands.

Each function runs in the caller's transaction (the orchestrator's tick, `metarl.store.run_tick`): it
finds what to send again and records the new dispatch time in the same transaction, so a message
is re-sent at most once per `retries.redispatch_after_s`. A duplicate finds its claim and stops.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, aliased

from metarl.domain.transitions import ACTIVE_STAGES
from metarl.store.records import ClaimStatus, Episode, OuterStatus, OuterStep, Stage, StageClaim

ORPHANS_PER_PASS = 10_000
"""Most stage messages one reconciler pass re-sends (the rest are found by the next pass)."""


@dataclass(frozen=True)
class StageDispatch:
    """One stage message to send after the transaction commits."""

    stage: Stage
    episode_id: int
    probe_attempt: int


@dataclass(frozen=True)
class RedispatchCutoffs:
    """Work dispatched at or before `unclaimed_before` and still unclaimed, or claimed with no heartbeat since `stale_before`, is re-sent."""

    unclaimed_before: dt.datetime
    stale_before: dt.datetime


def redispatch_cutoffs(now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> RedispatchCutoffs:
    """The cutoffs of one pass (pure). At startup (resume) every unclaimed item is re-sent at once."""
    return RedispatchCutoffs(
        unclaimed_before=now if startup else now - dt.timedelta(seconds=redispatch_after_s),
        stale_before=now - dt.timedelta(seconds=lease_s),
    )


def orphaned_episodes(session: Session, run_id: str, now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> list[StageDispatch]:
    """Active episodes whose current stage has no live claim (none, a stale one, or one given back for a platform fault)
    and was not dispatched recently; marked dispatched now.

    At startup (resume) every unclaimed stage is re-sent at once; a duplicate finds its claim and stops.
    """
    claim = aliased(StageClaim)
    cutoffs = redispatch_cutoffs(now, redispatch_after_s, lease_s, startup)
    rows = session.execute(
        select(Episode.id, Episode.stage, Episode.probe_attempt)
        .outerjoin(
            claim,
            and_(claim.episode_id == Episode.id, claim.stage == Episode.stage, claim.probe_attempt == Episode.probe_attempt),
        )
        .where(Episode.run_id == run_id, Episode.stage.in_(ACTIVE_STAGES))
        .where(
            or_(
                and_(
                    or_(claim.id.is_(None), claim.status == ClaimStatus.pending),
                    or_(Episode.dispatched_at.is_(None), Episode.dispatched_at <= cutoffs.unclaimed_before),
                ),
                and_(claim.status == ClaimStatus.running, claim.heartbeat_at < cutoffs.stale_before, Episode.dispatched_at < cutoffs.stale_before),
            )
        )
        .order_by(Episode.id)
        .limit(ORPHANS_PER_PASS)
    ).all()
    dispatches = [StageDispatch(stage, episode_id, attempt) for episode_id, stage, attempt in rows]
    if dispatches:
        session.execute(
            update(Episode).where(Episode.id.in_([d.episode_id for d in dispatches])).values(dispatched_at=now, dispatch_count=Episode.dispatch_count + 1)
        )
    return dispatches


def orphaned_outer_steps(session: Session, run_id: str, now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> list[int]:
    """Outer steps pending and not sent recently, or running with a dead heartbeat; marked dispatched now."""
    cutoffs = redispatch_cutoffs(now, redispatch_after_s, lease_s, startup)
    step_ids = (
        session.execute(
            select(OuterStep.id).where(
                OuterStep.run_id == run_id,
                or_(
                    and_(OuterStep.status == OuterStatus.pending, or_(OuterStep.dispatched_at.is_(None), OuterStep.dispatched_at <= cutoffs.unclaimed_before)),
                    and_(
                        OuterStep.status == OuterStatus.running, OuterStep.heartbeat_at < cutoffs.stale_before, OuterStep.dispatched_at < cutoffs.stale_before
                    ),
                ),
            )
        )
        .scalars()
        .all()
    )
    if step_ids:
        session.execute(update(OuterStep).where(OuterStep.id.in_(step_ids)).values(dispatched_at=now))
    return list(step_ids)
