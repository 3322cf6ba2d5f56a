"""Find stage work that is not done and not in safe hands, and send it again (idempotently)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, aliased

from metarl.domain.transitions import ACTIVE_STAGES
from metarl.store.records import ClaimStatus, Episode, OuterStatus, OuterStep, Stage, StageClaim


@dataclass(frozen=True)
class StageDispatch:
    """One stage message to send after the transaction commits."""

    stage: Stage
    episode_id: int
    probe_attempt: int


def orphaned_episodes(session: Session, run_id: str, now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> list[StageDispatch]:
    """Active episodes whose current stage has no live claim and was not dispatched recently.

    At startup (resume) every unclaimed stage is re-sent at once; a duplicate finds its claim and stops.
    """
    claim = aliased(StageClaim)
    unclaimed_cutoff = now if startup else now - dt.timedelta(seconds=redispatch_after_s)
    stale_cutoff = now - dt.timedelta(seconds=lease_s)
    rows = session.execute(
        select(Episode.id, Episode.stage, Episode.probe_attempt)
        .outerjoin(
            claim,
            and_(claim.episode_id == Episode.id, claim.stage == Episode.stage, claim.probe_attempt == Episode.probe_attempt),
        )
        .where(Episode.run_id == run_id, Episode.stage.in_(ACTIVE_STAGES))
        .where(
            or_(
                and_(claim.id.is_(None), or_(Episode.dispatched_at.is_(None), Episode.dispatched_at <= unclaimed_cutoff)),
                and_(claim.status == ClaimStatus.running, claim.heartbeat_at < stale_cutoff, Episode.dispatched_at < stale_cutoff),
            )
        )
        .order_by(Episode.id)
        .limit(10_000)
    ).all()
    dispatches = [StageDispatch(stage, episode_id, attempt) for episode_id, stage, attempt in rows]
    if dispatches:
        session.execute(
            update(Episode)
            .where(Episode.id.in_([d.episode_id for d in dispatches]))
            .values(dispatched_at=now, dispatch_count=Episode.dispatch_count + 1)
        )
    return dispatches


def orphaned_outer_steps(session: Session, run_id: str, now: dt.datetime, redispatch_after_s: float, lease_s: float, startup: bool) -> list[int]:
    """Outer steps pending and not sent recently, or running with a dead heartbeat."""
    unclaimed_cutoff = now if startup else now - dt.timedelta(seconds=redispatch_after_s)
    stale_cutoff = now - dt.timedelta(seconds=lease_s)
    step_ids = session.execute(
        select(OuterStep.id).where(
            OuterStep.run_id == run_id,
            or_(
                and_(OuterStep.status == OuterStatus.pending, or_(OuterStep.dispatched_at.is_(None), OuterStep.dispatched_at <= unclaimed_cutoff)),
                and_(OuterStep.status == OuterStatus.running, OuterStep.heartbeat_at < stale_cutoff, OuterStep.dispatched_at < stale_cutoff),
            ),
        )
    ).scalars().all()
    if step_ids:
        session.execute(update(OuterStep).where(OuterStep.id.in_(step_ids)).values(dispatched_at=now))
    return list(step_ids)
