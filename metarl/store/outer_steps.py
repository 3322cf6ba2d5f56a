"""Database side of the outer update (`workers.outer`): claim a step with its batch, publish the new policy version, fail it.

The step is claimed by the lease of `metarl.store.claims` (:data:`metarl.store.claims.OUTER_STEPS`) in the
transaction that reads its batch; the new version is published in one transaction guarded by the claim's token.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from metarl.interfaces import OuterBatchEpisode, OuterResult, PolicySample
from metarl.store.claims import RUNNING, OuterClaim, take_outer_step, utcnow
from metarl.store.columns import columns_of, insert_lists
from metarl.store.db import SqlTarget, json_param, run_sql, session_scope, text_array_literal
from metarl.store.episodes import record_costs
from metarl.store.records import PolicyVersion, RunStatus
from metarl.store.step_metrics import outer_step_metrics
from metarl.store.tick_wakeup import request_tick
from schemas.run_config import RunConfig, stored_run_config
from schemas.states import ENDED_RUN_STATUSES


@dataclass(frozen=True)
class OuterStepRow:
    """What the outer task reads of its step before claiming it: one row, one round trip."""

    run_id: str
    run_config: dict[str, Any]
    """The run's config as stored (`claim_outer_work` validates it)."""
    run_status: RunStatus
    step: int
    version_before: int
    error: str | None
    base_state_uri: str | None


STEP_ROW_SQL = """
SELECT s.run_id, r.config, r.status, s.step, s.policy_version_before, s.error, pv.state_uri
FROM outer_steps s
JOIN runs r ON r.id = s.run_id
LEFT JOIN policy_versions pv ON pv.run_id = s.run_id AND pv.version = s.policy_version_before
WHERE s.id = %(id)s
"""
BATCH_SQL = """
SELECT e.id, e.group_id, e.policy_version, rw.total, pa.policy_tokens, pa.behaviour_logprobs, pa.prompt_length
FROM episode_groups g
JOIN episodes e ON e.group_id = g.id
JOIN rewards rw ON rw.episode_id = e.id
LEFT JOIN probe_attempts pa ON pa.episode_id = e.id AND pa.policy_tokens IS NOT NULL
WHERE g.outer_step_id = %(id)s
ORDER BY e.id, pa.attempt
"""
ENDED_ARRAY = text_array_literal(status.value for status in ENDED_RUN_STATUSES)
FINISH_STEP_SQL = f"""
UPDATE outer_steps SET status = 'done', policy_version_after = %(after)s, finished_at = %(now)s, metrics = %(metrics)s, error = NULL
WHERE id = %(id)s AND token = %(token)s AND status = '{RUNNING}'
RETURNING id
"""
VERSION_COLUMNS, VERSION_VALUES = insert_lists(PolicyVersion.__table__, columns_of(PolicyVersion.__table__, without=("id",)), {"created_at": "now()"})
INSERT_VERSION_SQL = f"INSERT INTO policy_versions ({VERSION_COLUMNS}) VALUES ({VERSION_VALUES})"
ADVANCE_RUN_SQL = "UPDATE runs SET policy_version = %(after)s WHERE id = %(run_id)s AND policy_version = %(before)s"
FAIL_STEP_SQL = f"""
UPDATE outer_steps SET status = 'failed', error = %(message)s, finished_at = %(now)s, heartbeat_at = %(now)s
WHERE id = %(id)s AND token = %(token)s AND status = '{RUNNING}'
RETURNING run_id, step
"""
FAIL_RUN_SQL = f"UPDATE runs SET status = 'failed', status_message = %(message)s, finished_at = %(now)s WHERE id = %(run_id)s AND status <> ALL({ENDED_ARRAY})"
NOTE_ATTEMPT_ERROR_SQL = f"UPDATE outer_steps SET error = %(message)s WHERE id = %(id)s AND status = '{RUNNING}'"
"""The outer task's statements, sent as they are (no ORM compilation)."""


def outer_step_row(session: SqlTarget, outer_step_id: int) -> OuterStepRow | None:
    """The step, its run's status and the base policy's saved state, or None when there is no such step."""
    row = run_sql(session, STEP_ROW_SQL, {"id": outer_step_id}).first()
    if row is None:
        return None
    run_id, config, status, step, before, error, state_uri = row
    return OuterStepRow(run_id, config, RunStatus(status), step, before, error, state_uri)


@dataclass(frozen=True)
class OuterWork:
    """Everything one update needs, read from the records of its step."""

    run_id: str
    step: int
    version_before: int
    base_state_uri: str | None
    batch: list[OuterBatchEpisode]


def load_outer_work(session: SqlTarget, outer_step_id: int, row: OuterStepRow | None = None) -> OuterWork:
    """The step's batch: every rewarded episode of the groups batched into it, with its policy samples."""
    row = row or outer_step_row(session, outer_step_id)
    if row is None:
        raise LookupError(f"no outer step {outer_step_id}")
    episodes: dict[int, tuple[int, int, float]] = {}
    samples: dict[int, list[PolicySample]] = {}
    for episode_id, group_id, version, reward, tokens, logprobs, prompt_length in run_sql(session, BATCH_SQL, {"id": outer_step_id}):
        episodes.setdefault(episode_id, (group_id, version, reward))
        if tokens is not None:
            samples.setdefault(episode_id, []).append(PolicySample(tokens=tokens, logprobs=logprobs, prompt_length=prompt_length))
    batch = [
        OuterBatchEpisode(episode_id=episode_id, group_id=group_id, policy_version=version, reward=reward, samples=samples.get(episode_id, []))
        for episode_id, (group_id, version, reward) in episodes.items()
    ]
    return OuterWork(run_id=row.run_id, step=row.step, version_before=row.version_before, base_state_uri=row.base_state_uri, batch=batch)


@dataclass(frozen=True)
class OuterClaimed:
    """An outer step this worker now holds: its claim, its run's config and its batch."""

    claim: OuterClaim
    config: RunConfig
    work: OuterWork


def claim_outer_work(database_url: str, outer_step_id: int, *, worker: str, skip_runs: Collection[RunStatus]) -> OuterClaimed | Literal["missing", "skipped"]:
    """In one transaction: read the step, claim it (`metarl.store.claims.take_outer_step`, with the run's lease) and read
    its batch. "missing": no such step; "skipped": its run's status is one of `skip_runs`, or another worker holds it."""
    with session_scope(database_url) as session:
        row = outer_step_row(session, outer_step_id)
        if row is None:
            return "missing"
        if row.run_status in skip_runs:
            return "skipped"
        config = stored_run_config(row.run_config)
        claim = take_outer_step(session, outer_step_id, worker=worker, lease_s=config.retries.lease_s)
        if claim is None:
            return "skipped"
        return OuterClaimed(claim, config, load_outer_work(session, outer_step_id, row))


def publish_outer_version(database_url: str, claim: OuterClaim, work: OuterWork, result: OuterResult, *, backend: str, simulated: bool) -> bool:
    """Close the step and record the new policy version (its metrics, the update's charges, an urgent tick of the run's
    orchestrator) in one transaction; False (nothing written) if the claim was lost."""
    after = work.version_before + 1
    with session_scope(database_url) as session:
        metrics = outer_step_metrics(session, claim.outer_step_id, work.run_id, work.version_before)
        metrics.update({f"backend_{key}": value for key, value in result.metrics.items()})
        params = {"after": after, "now": utcnow(), "metrics": json_param(metrics), "id": claim.outer_step_id, "token": claim.token}
        if run_sql(session, FINISH_STEP_SQL, params).first() is None:
            session.rollback()
            return False
        version = {"run_id": work.run_id, "version": after, "backend": backend, "state_uri": result.state_uri, "outer_step_id": claim.outer_step_id}
        run_sql(session, INSERT_VERSION_SQL, version)
        run_sql(session, ADVANCE_RUN_SQL, {"after": after, "run_id": work.run_id, "before": work.version_before})
        record_costs(session, work.run_id, None, result.costs, simulated)
        request_tick(session, work.run_id, urgent=True)
    return True


def fail_outer_step(database_url: str, claim: OuterClaim, message: str) -> tuple[str, int] | None:
    """Record the step as failed with its reason and fail its run (it cannot advance past this step), in one transaction.

    Returns the step's (run id, step), or None (and changes nothing) if this worker no longer holds the claim.
    """
    now = utcnow()
    with session_scope(database_url) as session:
        failed = run_sql(session, FAIL_STEP_SQL, {"id": claim.outer_step_id, "token": claim.token, "message": message, "now": now}).first()
        if failed is None:
            return None
        run_id, step = failed
        run_sql(session, FAIL_RUN_SQL, {"run_id": run_id, "message": f"outer step {step} failed: {message}", "now": now})
    return run_id, step


def note_outer_attempt_error(database_url: str, outer_step_id: int, message: str) -> None:
    """Note why an attempt at a running step ended (kept for the crash-loop message); its status is untouched."""
    with session_scope(database_url) as session:
        run_sql(session, NOTE_ATTEMPT_ERROR_SQL, {"id": outer_step_id, "message": message})
