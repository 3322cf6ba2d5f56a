"""Idempotent claims of stage work: insert-or-take-over with compare-and-set on the heartbeat."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from sqlalchemy import DateTime, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from schemas.records import ClaimStatus, Stage, StageClaim


@dataclass(frozen=True)
class Claim:
    """A claim this worker holds."""

    claim_id: int
    token: str
    episode_id: int
    stage: Stage
    probe_attempt: int
    takeovers: int = 0


class ClaimRefused(Exception):
    """The stage is done already, or another worker holds a live claim on it."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def claim_stage(
    session: Session, *, run_id: str, episode_id: int, stage: Stage, probe_attempt: int, worker: str, lease_s: float, token: str | None = None
) -> Claim:
    """Claim one stage of one episode, or take over a claim whose holder stopped heartbeating.

    A caller that passes the token of its own earlier claim (a poll retry) continues it.
    Raises ClaimRefused when the stage is done or held by a live worker.
    """
    new_token = str(uuid.uuid4())
    inserted = session.execute(
        insert(StageClaim)
        .values(
            run_id=run_id,
            episode_id=episode_id,
            stage=stage,
            probe_attempt=probe_attempt,
            token=new_token,
            status=ClaimStatus.running,
            worker=worker,
        )
        .on_conflict_do_nothing(constraint="uq_stage_claims_key")
        .returning(StageClaim.id)
    ).scalar_one_or_none()
    if inserted is not None:
        return Claim(inserted, new_token, episode_id, stage, probe_attempt)
    existing = session.execute(
        select(StageClaim).where(StageClaim.episode_id == episode_id, StageClaim.stage == stage, StageClaim.probe_attempt == probe_attempt)
    ).scalar_one()
    if existing.status != ClaimStatus.running:
        raise ClaimRefused(f"stage {stage.value} of episode {episode_id} is already {existing.status.value}")
    now = utcnow()
    if token is not None and token == existing.token:
        condition = StageClaim.token == token
    else:
        condition = StageClaim.heartbeat_at < now - dt.timedelta(seconds=lease_s)
    taken = session.execute(
        update(StageClaim)
        .where(StageClaim.id == existing.id, StageClaim.status == ClaimStatus.running, condition)
        .values(
            token=new_token,
            worker=worker,
            heartbeat_at=now,
            takeovers=StageClaim.takeovers + (0 if token == existing.token else 1),
        )
        .returning(StageClaim.takeovers)
    ).scalar_one_or_none()
    if taken is None:
        raise ClaimRefused(f"stage {stage.value} of episode {episode_id} is held by {existing.worker}")
    return Claim(existing.id, new_token, episode_id, stage, probe_attempt, takeovers=taken)


def heartbeat(session: Session, claim: Claim) -> bool:
    """Renew the claim; False means it was taken over (the caller must stop and record nothing)."""
    renewed = session.execute(
        update(StageClaim)
        .where(StageClaim.id == claim.claim_id, StageClaim.token == claim.token, StageClaim.status == ClaimStatus.running)
        .values(heartbeat_at=utcnow())
        .returning(StageClaim.id)
    ).scalar_one_or_none()
    return renewed is not None


def finish_claim(session: Session, claim: Claim, status: ClaimStatus, error: str | None = None) -> bool:
    """Close the claim in the caller's transaction (one statement); False if this worker no longer owns it."""
    now = utcnow()
    closed = session.execute(
        update(StageClaim)
        .where(StageClaim.id == claim.claim_id, StageClaim.token == claim.token, StageClaim.status == ClaimStatus.running)
        .values(
            status=status,
            finished_at=now,
            heartbeat_at=now,
            error=error,
            duration_s=func.extract("epoch", literal(now, DateTime(timezone=True)) - StageClaim.claimed_at),
        )
        .returning(StageClaim.id)
    ).scalar_one_or_none()
    return closed is not None


def count_transient_failure(session: Session, claim: Claim) -> int:
    """Record one transient failure of this claim's work; return the count so far."""
    return session.execute(
        update(StageClaim)
        .where(StageClaim.id == claim.claim_id)
        .values(transient_failures=StageClaim.transient_failures + 1, heartbeat_at=utcnow())
        .returning(StageClaim.transient_failures)
    ).scalar_one()
