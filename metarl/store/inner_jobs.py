"""Database side of inner jobs: the one row per episode the train stage creates, launches and polls.

Every statement here runs once or more per train message, so each is sent as written
(:func:`metarl.store.db.run_sql`), without ORM compilation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from metarl.interfaces import LaunchResult, PollResult
from metarl.store.claims import Claim, heartbeat
from metarl.store.columns import checked_columns
from metarl.store.db import SqlTarget, json_param, run_sql, sql_transaction
from metarl.store.records import InnerJob, InnerJobStatus
from metarl.store.stage_records import WHEN_HELD, StageRecord


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


INNER_JOB_COLUMNS = checked_columns(InnerJob.__table__, (field.name for field in fields(InnerJobRow)))
"""The columns an InnerJobRow is made of, its fields' names in their order (read with the stage row: `metarl.store.episodes.STAGE_ROW_SQL`)."""
CREATE_WITHIN_LIMITS_SQL = """
SELECT spent, active, job_id FROM metarl_create_inner_job(
    %(run_id)s::text, %(episode_id)s::bigint, %(name)s::text, %(backend)s::text, %(simulated)s::boolean, %(model_name)s::text,
    %(max_usd)s::double precision, %(capacity)s::integer)
"""
"""The run's spend, the backend's active jobs and the new inner job's id (NULL when a cap stopped it): one statement.
The function (migrations 0005, 0008, 0014, 0015) takes the backend's advisory lock first and counts its `launching` and `running` jobs
that hold a slot (`metarl_inner_job_holds_slot`: the run is `running` or `stopping`, or a worker still polls the job, its train claim's
heartbeat younger than the run's lease plus its poll interval; a left-over job nobody polls holds none); in autocommit the lock is released when the insert is
visible, so the next caller's count sees it."""
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

LOST_SQL = f"""
UPDATE inner_jobs SET status = %(lost)s, finished_at = now(), error = %(error)s
WHERE episode_id = %(episode_id)s AND status IN (%(launching)s, %(running)s) AND {WHEN_HELD}
"""
"""An unfinished job whose episode the train stage gave up on: no one polls it again, so it no longer holds a slot of its backend."""


def inner_job_row(columns: tuple[Any, ...] | None) -> InnerJobRow | None:
    """An InnerJobRow from the INNER_JOB_COLUMNS of a row (None when there is no row, or its id is NULL: an outer join found none)."""
    if columns is None or columns[0] is None:
        return None
    job_id, name, backend, external_id, status, state, checkpoint, error, seconds = columns
    return InnerJobRow(job_id, name, backend, external_id, InnerJobStatus(status), dict(state or {}), checkpoint, error, seconds)


CreationBlock = Literal["budget", "capacity"]
"""Which cap stopped an inner job's creation: the run's budget, or the backend's capacity."""


def inner_job_name_prefix(run_id: str) -> str:
    """What every inner job name of the run starts with (the episode id follows): a pod's name leads back to its run."""
    return f"metarl-{run_id[:8]}-"


def inner_job_name(run_id: str, episode_id: int) -> str:
    """The episode's inner job name, unique in the database (`uq_inner_jobs_name`) and stable across retries."""
    return f"{inner_job_name_prefix(run_id)}{episode_id}"


def creation_outcome(spent: float, job_id: int | None, *, name: str, backend: str, max_usd: float) -> InnerJobRow | CreationBlock:
    """What `metarl_create_inner_job` answered: the new job (state `launching`, no external id yet), or the cap that stopped it
    (the budget first)."""
    if job_id is None:
        return "budget" if float(spent) >= max_usd else "capacity"
    return InnerJobRow(job_id, name, backend, None, InnerJobStatus.launching, {}, None, None, None)


def create_within_limits(
    session: SqlTarget, *, run_id: str, episode_id: int, name: str, backend: str, simulated: bool, model_name: str, max_usd: float, capacity: int
) -> InnerJobRow | CreationBlock:
    """Insert the episode's inner job in state `launching` (no external id yet) when the run's spend is under `max_usd`
    and the backend runs fewer than `capacity` jobs; otherwise say which cap stopped it (the budget first).

    One statement (`metarl_create_inner_job`), serialised with every other creation on the same
    backend by an advisory lock held to the end of the caller's transaction: send it in autocommit,
    so the lock is held only while it runs.
    """
    params = {
        "run_id": run_id,
        "episode_id": episode_id,
        "name": name,
        "backend": backend,
        "simulated": simulated,
        "model_name": model_name,
        "max_usd": max_usd,
        "capacity": capacity,
    }
    spent, _active, job_id = run_sql(session, CREATE_WITHIN_LIMITS_SQL, params).one()
    return creation_outcome(spent, job_id, name=name, backend=backend, max_usd=max_usd)


def launch_record(episode_id: int, launched: LaunchResult) -> StageRecord:
    """The external id and state of a launched job, as a record (once: a second launch record changes nothing)."""
    return StageRecord(
        "launched",
        LAUNCHED_SQL,
        {"external_id": launched.external_id, "state": json_param(launched.state), "running": InnerJobStatus.running.value, "episode_id": episode_id},
    )


def poll_record(episode_id: int, polled: PollResult, ended: InnerJobStatus | None) -> StageRecord:
    """A poll's backend state, and when the job ended its outcome, as a record (written whether or not the claim still holds)."""
    if ended is None:
        return StageRecord("polled", POLLED_SQL, {"state": json_param(polled.state), "episode_id": episode_id})
    params = {
        "state": json_param(polled.state),
        "status": ended.value,
        "checkpoint_uri": polled.checkpoint_uri,
        "metrics_uri": polled.metrics_uri,
        "train_seconds": polled.train_seconds,
        "error": polled.error,
        "episode_id": episode_id,
    }
    return StageRecord("polled", ENDED_SQL, params)


def lost_record(episode_id: int, error: str) -> StageRecord:
    """The episode's unfinished inner job (launching or running) marked `lost` with `error`, written only with the move that
    fails the episode at train: its backend's capacity count (`metarl_create_inner_job`) no longer counts it (it counts the jobs
    of every live run, so a left-over one would hold its slot for good), and the Runpod reaper terminates its pod as an orphan. A job
    that already ended keeps its outcome."""
    params = {
        "lost": InnerJobStatus.lost.value,
        "launching": InnerJobStatus.launching.value,
        "running": InnerJobStatus.running.value,
        "error": error,
        "episode_id": episode_id,
    }
    return StageRecord("lost_job", LOST_SQL, params)


CAPACITY_WAIT_SQL = "UPDATE inner_jobs SET error = %(error)s WHERE episode_id = %(episode_id)s"


def note_capacity_wait(database_url: str, claim: Claim, error: str) -> bool:
    """The train stage's launch found no capacity: show `error` on its inner job and renew its claim, in one transaction
    (the claim waits for its next poll). False when the claim was taken over meanwhile (the note is written all the same)."""
    with sql_transaction(database_url) as sql:
        run_sql(sql, CAPACITY_WAIT_SQL, {"episode_id": claim.episode_id, "error": error})
        return heartbeat(sql, claim)
