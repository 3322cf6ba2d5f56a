"""Idempotent claims of stage work: insert-or-take-over with compare-and-set on the heartbeat."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from metarl.store.db import SqlTarget, run_sql
from metarl.store.stage_records import StageRecord, with_records

from metarl.store.records import ClaimStatus, Stage, StageClaim


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


NEW_CLAIM_COLUMNS = "run_id, episode_id, stage, probe_attempt, token, status, worker, takeovers, transient_failures, claimed_at, heartbeat_at"
NEW_CLAIM_VALUES = "%(episode_id)s, %(stage)s, %(probe_attempt)s, %(new_token)s, 'running', %(worker)s, 0, 0, now(), now()"
"""A new running claim's columns and, after its run id, their values: here and in `metarl.store.episodes.STAGE_ROW_AND_CLAIM_SQL`."""
CLAIM_INSERT_SQL = f"""
INSERT INTO stage_claims ({NEW_CLAIM_COLUMNS})
VALUES (%(run_id)s, {NEW_CLAIM_VALUES})
ON CONFLICT ON CONSTRAINT uq_stage_claims_key DO NOTHING
RETURNING id
"""
CLAIM_EXISTING_SQL = """
SELECT id, status, token, worker FROM stage_claims WHERE episode_id = %(episode_id)s AND stage = %(stage)s AND probe_attempt = %(probe_attempt)s
"""
CLAIM_TAKEOVER_SQL = """
UPDATE stage_claims SET token = %(new_token)s, worker = %(worker)s, heartbeat_at = %(now)s, takeovers = takeovers + %(added)s
WHERE id = %(id)s AND status = 'running' AND (token = %(token)s OR (%(stale_ok)s AND heartbeat_at < %(stale_before)s))
RETURNING takeovers
"""
HEARTBEAT_SQL = """
UPDATE stage_claims SET heartbeat_at = %(now)s WHERE id = %(id)s AND token = %(token)s AND status = 'running' RETURNING id
"""
FINISH_SET = "status = %(status)s, finished_at = %(now)s, heartbeat_at = %(now)s, error = %(claim_error)s, duration_s = extract(epoch FROM %(now)s - claimed_at)"
"""How a claim is closed: here and in `metarl.store.episodes.FINISH_AND_MOVE_SQL`."""
FINISH_SQL = f"UPDATE stage_claims SET {FINISH_SET} WHERE id = %(claim_id)s AND token = %(token)s AND status = 'running' RETURNING id"
"""The claim statements, sent as they are (no ORM compilation): they run several times per stage."""


def _first(session: SqlTarget, sql: str, params: dict[str, object]) -> Any:
    return run_sql(session, sql, params).first()


def claim_stage(
    session: SqlTarget, *, run_id: str, episode_id: int, stage: Stage, probe_attempt: int, worker: str, lease_s: float, token: str | None = None
) -> Claim:
    """Claim one stage of one episode, or take over a claim whose holder stopped heartbeating.

    A caller that passes the token of its own earlier claim (a poll retry) continues it.
    Raises ClaimRefused when the stage is done or held by a live worker.
    """
    new_token = str(uuid.uuid4())
    key = {"episode_id": episode_id, "stage": stage.value, "probe_attempt": probe_attempt}
    inserted = _first(session, CLAIM_INSERT_SQL, {**key, "run_id": run_id, "new_token": new_token, "worker": worker})
    if inserted is not None:
        return Claim(inserted[0], new_token, episode_id, stage, probe_attempt)
    existing = _first(session, CLAIM_EXISTING_SQL, key)
    assert existing is not None, "the claim insert conflicted, so the row exists"
    claim_id, status, held_token, holder = existing
    if status != ClaimStatus.running.value:
        raise ClaimRefused(f"stage {stage.value} of episode {episode_id} is already {status}")
    now = utcnow()
    continuing = token is not None and token == held_token
    taken = _first(
        session,
        CLAIM_TAKEOVER_SQL,
        {
            "new_token": new_token,
            "worker": worker,
            "now": now,
            "added": 0 if continuing else 1,
            "id": claim_id,
            "token": token if continuing else "",
            "stale_ok": not continuing,
            "stale_before": now - dt.timedelta(seconds=lease_s),
        },
    )
    if taken is None:
        raise ClaimRefused(f"stage {stage.value} of episode {episode_id} is held by {holder}")
    return Claim(claim_id, new_token, episode_id, stage, probe_attempt, takeovers=taken[0])


def heartbeat(session: SqlTarget, claim: Claim, records: Sequence[StageRecord] = ()) -> bool:
    """Renew the claim; False means it was taken over (the caller must stop and record nothing more).

    `records` (facts that stand whether or not the claim holds: a launch, a poll) are written in
    the same statement.
    """
    return _first(session, *with_records(HEARTBEAT_SQL, {"now": utcnow(), "id": claim.claim_id, "token": claim.token}, records)) is not None


def finish_claim(session: SqlTarget, claim: Claim, status: ClaimStatus, error: str | None = None) -> bool:
    """Close the claim in the caller's transaction (one statement); False if this worker no longer owns it."""
    return _first(session, FINISH_SQL, finish_params(claim, status, error)) is not None


def finish_params(claim: Claim, status: ClaimStatus, error: str | None) -> dict[str, object]:
    """The parameters of FINISH_SQL and of FINISH_SET in `metarl.store.episodes.FINISH_AND_MOVE_SQL`."""
    return {"status": status.value, "now": utcnow(), "claim_error": error, "claim_id": claim.claim_id, "token": claim.token}


def count_transient_failure(session: Session, claim: Claim) -> int:
    """Record one transient failure of this claim's work; return the count so far."""
    return session.execute(
        update(StageClaim)
        .where(StageClaim.id == claim.claim_id)
        .values(transient_failures=StageClaim.transient_failures + 1, heartbeat_at=utcnow())
        .returning(StageClaim.transient_failures)
    ).scalar_one()
