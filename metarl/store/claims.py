"""Claims: the one lease implementation that stage claims and outer steps are held by.

A lease is a row with `status`, `token`, `worker`, `heartbeat_at` and `takeovers`: a stage claim (a
row of `stage_claims`, made by its first claim) or an outer step (a row of `outer_steps`, created
`pending` by the orchestrator). What is claimed is a :class:`Claimable`; every claim statement is
built from it by :func:`claim_ctes`, one compare-and-set:

- a first claim of a stage inserts its row on the unique key: of two first claims at once, one
  inserts and the other finds the row held; a pending outer step is taken as it is;
- a running lease is taken again under a new token by the worker that holds its token (a
  continuation, not a takeover), or by any worker once its heartbeat is older than the lease (a
  takeover, counted in `takeovers`);
- a lease that is done or failed is never taken again.

The holder renews the lease with its token (:func:`renew_sql`, the heartbeat) and closes it with it;
a holder whose token was replaced learns it at its next renewal or close and records nothing more.
The statements are sent as written (:func:`metarl.store.db.run_sql`): they run several times per stage.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import FromClause

from metarl.store.columns import checked_columns, insert_lists, table_name
from metarl.store.db import SqlTarget, run_sql, sql_transaction
from metarl.store.records import ClaimStatus, OuterStatus, Stage, StageClaim
from metarl.store.records import OuterStep as OuterStepRecord
from metarl.store.stage_records import StageRecord, with_records

RUNNING = ClaimStatus.running.value
PENDING = OuterStatus.pending.value
if RUNNING != OuterStatus.running.value:
    raise ImportError("stage claims and outer steps must name their running state alike: the claim statements share it")
LEASE_COLUMNS = ("id", "status", "token", "worker", "heartbeat_at", "takeovers", "error")
"""The columns every lease's table has (what the claim statements read and write)."""


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Claimable:
    """What is claimed: the table of its leases, the columns that find one, and how a first claim makes its row."""

    table: FromClause
    key: tuple[str, ...]
    """Columns that find the lease; each is the claim statement's parameter of the same name."""
    first_row: Mapping[str, str] | None = None
    """The SQL of each column of the row a first claim inserts (None: the row exists before it is claimed, `pending`)."""
    unique: str | None = None
    """The unique constraint on `key` a first claim's insert conflicts on (with `first_row`)."""

    def __post_init__(self) -> None:
        checked_columns(self.table, (*LEASE_COLUMNS, *self.key))
        if (self.first_row is None) != (self.unique is None):
            raise ValueError(f"a claimable of {table_name(self.table)} needs both first_row and unique, or neither")
        if self.first_row is not None:
            checked_columns(self.table, self.first_row)

    def where_key(self) -> str:
        """`column = %(column)s AND ...` over the key."""
        return " AND ".join(f"{column} = %({column})s" for column in self.key)


STAGE_CLAIMS = Claimable(
    StageClaim.__table__,
    key=("episode_id", "stage", "probe_attempt"),
    first_row={
        "run_id": "run_id",
        "episode_id": "%(episode_id)s",
        "stage": "%(stage)s",
        "probe_attempt": "%(probe_attempt)s",
        "token": "%(new_token)s",
        "status": f"'{RUNNING}'",
        "worker": "%(worker)s",
        "takeovers": "0",
        "transient_failures": "0",
        "claimed_at": "now()",
        "heartbeat_at": "now()",
    },
    unique="uq_stage_claims_key",
)
"""A worker's claim on one stage of one episode (per probe attempt); the first claim's `run_id` comes from its gate."""
OUTER_STEPS = Claimable(OuterStepRecord.__table__, key=("id",))
"""An outer step, claimed by the outer task (created pending by the orchestrator)."""


def claim_ctes(what: Claimable, gate: str | None = None) -> str:
    """The CTEs that take a lease of `what` in one statement, the last of them `claim`: (id, takeovers, error) of the
    lease taken, no row when none was (`error`: what the row held, the last holder's error when it is a takeover).

    `gate` names an earlier CTE of the statement: without a row there, nothing is claimed; its `run_id` is a first
    claim's. A claimable whose rows are inserted by their first claim needs one. The parameters are the key's columns
    and those of :func:`claim_params`.
    """
    table = table_name(what.table)
    gated = f"\n      AND EXISTS (SELECT 1 FROM {gate})" if gate else ""
    taken = f"""UPDATE {table}
    SET status = '{RUNNING}', token = %(new_token)s, worker = %(worker)s, heartbeat_at = %(now)s,
        takeovers = takeovers + CASE WHEN status = '{RUNNING}' AND token IS DISTINCT FROM %(token)s THEN 1 ELSE 0 END
    WHERE {what.where_key()}
      AND (status = '{PENDING}' OR (status = '{RUNNING}' AND (token = %(token)s OR heartbeat_at < %(stale_before)s))){gated}
    RETURNING id, takeovers, error"""
    if what.first_row is None:
        return f"claim AS (\n    {taken}\n)"
    if gate is None:
        raise ValueError(f"a first claim of {table} takes its run_id from a gate")
    columns, values = insert_lists(what.table, what.first_row, what.first_row)
    inserted = f"""INSERT INTO {table} ({columns})
    SELECT {values} FROM {gate}
    ON CONFLICT ON CONSTRAINT {what.unique} DO NOTHING
    RETURNING id, takeovers, error"""
    return f"inserted AS (\n    {inserted}\n),\ntaken AS (\n    {taken}\n),\nclaim AS (SELECT * FROM inserted UNION ALL SELECT * FROM taken)"


def claim_params(key: Mapping[str, Any], *, worker: str, token: str | None, lease_s: float | None) -> dict[str, Any]:
    """The parameters of a statement with :func:`claim_ctes`: the lease's key, a fresh token for the claim it takes, the
    token of the caller's own earlier claim (None: it has none), and the bound a takeover's heartbeat must be older than
    (`lease_s` None: no takeover, only a first claim or a continuation)."""
    now = utcnow()
    return {
        **key,
        "new_token": str(uuid.uuid4()),
        "worker": worker,
        "token": token,
        "now": now,
        "stale_before": None if lease_s is None else now - dt.timedelta(seconds=lease_s),
    }


def renew_sql(what: Claimable) -> str:
    """The heartbeat of a lease of `what`: renewed only while this holder's token is on it and it runs."""
    return f"UPDATE {table_name(what.table)} SET heartbeat_at = %(now)s WHERE id = %(id)s AND token = %(token)s AND status = '{RUNNING}' RETURNING id"


# -- stage claims ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A claim this worker holds (`last_error`: what its row held when taken: the last holder's error, on a takeover)."""

    claim_id: int
    token: str
    episode_id: int
    stage: Stage
    probe_attempt: int
    takeovers: int = 0
    last_error: str | None = None


class ClaimRefused(Exception):
    """The stage is done already, or another worker holds a live claim on it."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def stage_key(episode_id: int, stage: Stage, probe_attempt: int) -> dict[str, Any]:
    """The key of a stage claim, as the claim statements' parameters."""
    return {"episode_id": episode_id, "stage": stage.value, "probe_attempt": probe_attempt}


def stage_claim_of(params: Mapping[str, Any], claim_id: int | None, takeovers: int | None, error: str | None) -> Claim | None:
    """The stage claim a statement with :func:`claim_ctes` took with `params` (None when it took none)."""
    if claim_id is None:
        return None
    return Claim(claim_id, params["new_token"], params["episode_id"], Stage(params["stage"]), params["probe_attempt"], int(takeovers or 0), error)


CLAIM_STAGE_SQL = f"""
WITH claimable AS (SELECT %(run_id)s::text AS run_id),
{claim_ctes(STAGE_CLAIMS, "claimable")},
holder AS (SELECT status, worker FROM stage_claims WHERE {STAGE_CLAIMS.where_key()})
SELECT claim.id, claim.takeovers, claim.error, holder.status, holder.worker
FROM (VALUES (1)) AS one LEFT JOIN claim ON true LEFT JOIN holder ON true
"""
"""Every claim rule of a stage in one statement: a first claim, the continuation by token, a takeover after the lease.
`holder` is the row as it was before the statement (why a claim is refused)."""


def refusal(stage: Stage, episode_id: int, status: str | None, holder: str | None) -> str:
    """Why a stage claim was refused, from its row as the claim statement found it (pure)."""
    if status is not None and status != RUNNING:
        return f"stage {stage.value} of episode {episode_id} is already {status}"
    return f"stage {stage.value} of episode {episode_id} is held by {holder or 'another worker'}"


def claim_stage(
    session: SqlTarget, *, run_id: str, episode_id: int, stage: Stage, probe_attempt: int, worker: str, lease_s: float, token: str | None = None
) -> Claim:
    """Claim one stage of one episode, or take over a claim whose holder stopped heartbeating: one statement.

    A caller that passes the token of its own earlier claim (a poll retry) continues it.
    Raises ClaimRefused when the stage is done or held by a live worker.
    """
    params = {**claim_params(stage_key(episode_id, stage, probe_attempt), worker=worker, token=token, lease_s=lease_s), "run_id": run_id}
    claim_id, takeovers, error, status, holder = run_sql(session, CLAIM_STAGE_SQL, params).one()
    claim = stage_claim_of(params, claim_id, takeovers, error)
    if claim is None:
        raise ClaimRefused(refusal(stage, episode_id, status, holder))
    return claim


HEARTBEAT_SQL = renew_sql(STAGE_CLAIMS)
FINISH_SET = (
    "status = %(status)s, finished_at = %(now)s, heartbeat_at = %(now)s, error = %(claim_error)s, duration_s = extract(epoch FROM %(now)s - claimed_at)"
)
"""How a claim is closed: here and in `metarl.store.episodes.FINISH_AND_MOVE_SQL`."""
FINISH_SQL = f"UPDATE stage_claims SET {FINISH_SET} WHERE id = %(claim_id)s AND token = %(token)s AND status = '{RUNNING}' RETURNING id"


def _first(session: SqlTarget, sql: str, params: dict[str, object]) -> Any:
    return run_sql(session, sql, params).first()


def heartbeat(session: SqlTarget, claim: Claim, records: Sequence[StageRecord] = ()) -> bool:
    """Renew the claim; False means it was taken over (the caller must stop and record nothing more).

    `records` (facts that stand whether or not the claim holds: a launch, a poll) are written in
    the same statement.
    """
    return _first(session, *with_records(HEARTBEAT_SQL, {"now": utcnow(), "id": claim.claim_id, "token": claim.token}, records)) is not None


def renew_claim(database_url: str, claim: Claim, records: Sequence[StageRecord] = ()) -> bool:
    """:func:`heartbeat` as a unit of work of its own (one statement in autocommit)."""
    with sql_transaction(database_url, autocommit=True) as sql:
        return heartbeat(sql, claim, records)


def finish_claim(session: SqlTarget, claim: Claim, status: ClaimStatus, error: str | None = None) -> bool:
    """Close the claim in the caller's transaction (one statement); False if this worker no longer owns it."""
    return _first(session, FINISH_SQL, finish_params(claim, status, error)) is not None


def finish_params(claim: Claim, status: ClaimStatus, error: str | None) -> dict[str, object]:
    """The parameters of FINISH_SQL and of FINISH_SET in `metarl.store.episodes.FINISH_AND_MOVE_SQL`."""
    return {"status": status.value, "now": utcnow(), "claim_error": error, "claim_id": claim.claim_id, "token": claim.token}


COUNT_TRANSIENT_FAILURE_SQL = (
    "UPDATE stage_claims SET transient_failures = transient_failures + 1, heartbeat_at = %(now)s WHERE id = %(id)s RETURNING transient_failures"
)
NOTE_CLAIM_ERROR_SQL = f"UPDATE stage_claims SET error = %(error)s WHERE {STAGE_CLAIMS.where_key()} AND status = '{RUNNING}'"


def count_transient_failure(database_url: str, claim: Claim) -> int:
    """Record one transient failure of this claim's work (one statement); return the count so far."""
    with sql_transaction(database_url, autocommit=True) as sql:
        return int(run_sql(sql, COUNT_TRANSIENT_FAILURE_SQL, {"now": utcnow(), "id": claim.claim_id}).scalar_one())


def note_claim_error(database_url: str, *, episode_id: int, stage: Stage, probe_attempt: int, error: str) -> None:
    """Record `error` on the stage's claim while it still runs (why its attempt ended: kept for the crash-loop message)."""
    with sql_transaction(database_url, autocommit=True) as sql:
        run_sql(sql, NOTE_CLAIM_ERROR_SQL, {**stage_key(episode_id, stage, probe_attempt), "error": error})


# -- outer steps -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OuterClaim:
    """This worker's claim on an outer step (`last_error`: what the step held when taken: the last attempt's error)."""

    outer_step_id: int
    token: str
    takeovers: int
    last_error: str | None = None


TAKE_OUTER_STEP_SQL = f"WITH {claim_ctes(OUTER_STEPS)}\nSELECT id, takeovers, error FROM claim"
RENEW_OUTER_STEP_SQL = renew_sql(OUTER_STEPS)


def take_outer_step(session: SqlTarget, outer_step_id: int, *, worker: str, lease_s: float) -> OuterClaim | None:
    """In the caller's transaction: CAS the step from pending (or running with a dead heartbeat) to running under a new token.

    Taking a running step over from a worker that stopped heartbeating counts one takeover.
    """
    params = claim_params({"id": outer_step_id}, worker=worker, token=None, lease_s=lease_s)
    taken = run_sql(session, TAKE_OUTER_STEP_SQL, params).first()
    return OuterClaim(outer_step_id, params["new_token"], int(taken[1]), taken[2]) if taken is not None else None


def claim_outer_lease(database_url: str, outer_step_id: int, *, worker: str, lease_s: float) -> OuterClaim | None:
    """:func:`take_outer_step` as a unit of work of its own (one statement in autocommit)."""
    with sql_transaction(database_url, autocommit=True) as sql:
        return take_outer_step(sql, outer_step_id, worker=worker, lease_s=lease_s)


def renew_outer_claim(session: SqlTarget, claim: OuterClaim) -> bool:
    """Heartbeat the step; False when it is no longer ours (taken over, or finished by someone else)."""
    return _first(session, RENEW_OUTER_STEP_SQL, {"now": utcnow(), "id": claim.outer_step_id, "token": claim.token}) is not None


def renew_outer_step(database_url: str, claim: OuterClaim) -> bool:
    """:func:`renew_outer_claim` as a unit of work of its own (one statement in autocommit)."""
    with sql_transaction(database_url, autocommit=True) as sql:
        return renew_outer_claim(sql, claim)
