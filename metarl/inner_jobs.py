"""Database side of inner jobs: the one row per episode the train stage creates, launches and polls.

Every statement here runs once or more per train message, so each is sent as written
(:func:`metarl.db.run_sql`), without ORM compilation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from metarl.backends.base import LaunchResult, PollResult
from metarl.db import SqlTarget, json_param, run_sql
from metarl.ledger import RUN_SPEND_SQL
from schemas.records import InnerJobStatus

INNER_JOB_COLUMNS = ("id", "name", "backend", "external_id", "status", "backend_state", "checkpoint_uri", "error", "train_seconds")
"""The columns an InnerJobRow is made of, in its fields' order (also read with the stage row: `metarl.episodes.STAGE_ROW_SQL`)."""
INNER_JOB_SQL = f"SELECT {', '.join(INNER_JOB_COLUMNS)} FROM inner_jobs WHERE episode_id = %(episode_id)s"
LOCK_RUN_SQL = "SELECT pg_advisory_xact_lock(%(key)s)"
SPENT_AND_ACTIVE_SQL = f"""
SELECT ({RUN_SPEND_SQL}),
       (SELECT count(*) FROM inner_jobs WHERE backend = %(backend)s AND status = ANY(%(active)s))
"""
CREATE_SQL = """
INSERT INTO inner_jobs (run_id, episode_id, name, backend, simulated, status, launch_count, backend_state, model_name, created_at)
VALUES (%(run_id)s, %(episode_id)s, %(name)s, %(backend)s, %(simulated)s, %(status)s, 0, %(state)s, %(model_name)s, now())
RETURNING id
"""
LAUNCHED_SQL = """
UPDATE inner_jobs
SET external_id = %(external_id)s, backend_state = %(state)s, status = %(running)s, launched_at = now(), launch_count = launch_count + 1, error = NULL
WHERE episode_id = %(episode_id)s AND external_id IS NULL
"""
POLLED_SQL = "UPDATE inner_jobs SET backend_state = %(state)s WHERE episode_id = %(episode_id)s"
ENDED_SQL = """
UPDATE inner_jobs
SET backend_state = %(state)s, status = %(status)s, finished_at = now(), checkpoint_uri = %(checkpoint_uri)s, metrics_uri = %(metrics_uri)s,
    train_seconds = %(train_seconds)s, error = %(error)s
WHERE episode_id = %(episode_id)s
"""
ACTIVE_STATUSES = (InnerJobStatus.launching, InnerJobStatus.running)


@dataclass(frozen=True)
class InnerJobRow:
    """What the train and eval stages read of an episode's inner job."""

    id: int
    name: str
    backend: str
    external_id: str | None
    status: InnerJobStatus
    backend_state: dict[str, Any]
    checkpoint_uri: str | None
    error: str | None
    train_seconds: float | None


def inner_job_of(session: SqlTarget, episode_id: int) -> InnerJobRow | None:
    """The episode's inner job, or None before it was created."""
    return inner_job_row(run_sql(session, INNER_JOB_SQL, {"episode_id": episode_id}).first())


def inner_job_row(columns: tuple[Any, ...] | None) -> InnerJobRow | None:
    """An InnerJobRow from the INNER_JOB_COLUMNS of a row (None when there is no row, or its id is NULL: an outer join found none)."""
    if columns is None or columns[0] is None:
        return None
    job_id, name, backend, external_id, status, state, checkpoint, error, seconds = columns
    return InnerJobRow(job_id, name, backend, external_id, InnerJobStatus(status), dict(state or {}), checkpoint, error, seconds)


def spent_and_active(session: SqlTarget, run_key: int, run_id: str, backend: str) -> tuple[float, int]:
    """Under the run's advisory lock (held to the end of the transaction): the run's spend so far and the backend's active jobs."""
    run_sql(session, LOCK_RUN_SQL, {"key": run_key})
    spent, active = run_sql(session, SPENT_AND_ACTIVE_SQL, {"run_id": run_id, "backend": backend, "active": [s.value for s in ACTIVE_STATUSES]}).one()
    return float(spent), int(active)


def create_inner_job(session: SqlTarget, *, run_id: str, episode_id: int, name: str, backend: str, simulated: bool, model_name: str) -> InnerJobRow:
    """Insert the episode's inner job in state `launching` (no external id yet)."""
    params = {
        "run_id": run_id,
        "episode_id": episode_id,
        "name": name,
        "backend": backend,
        "simulated": simulated,
        "status": InnerJobStatus.launching.value,
        "state": json_param({}),
        "model_name": model_name,
    }
    (job_id,) = run_sql(session, CREATE_SQL, params).one()
    return InnerJobRow(job_id, name, backend, None, InnerJobStatus.launching, {}, None, None, None)


def record_launch(session: SqlTarget, episode_id: int, launched: LaunchResult) -> None:
    """Store the external id and state of a launched job (once: a second launch record changes nothing)."""
    params = {"external_id": launched.external_id, "state": json_param(launched.state), "running": InnerJobStatus.running.value, "episode_id": episode_id}
    run_sql(session, LAUNCHED_SQL, params)


def record_poll(session: SqlTarget, episode_id: int, polled: PollResult, ended: InnerJobStatus | None) -> None:
    """Store a poll's backend state, and when the job ended its outcome."""
    if ended is None:
        run_sql(session, POLLED_SQL, {"state": json_param(polled.state), "episode_id": episode_id})
        return
    params = {
        "state": json_param(polled.state),
        "status": ended.value,
        "checkpoint_uri": polled.checkpoint_uri,
        "metrics_uri": polled.metrics_uri,
        "train_seconds": polled.train_seconds,
        "error": polled.error,
        "episode_id": episode_id,
    }
    run_sql(session, ENDED_SQL, params)
