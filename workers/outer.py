"""The outer-update task (queue `outer`, one at a time): claims its step, updates, saves the new version.

Lifecycle of one step: claim (compare-and-set pending -> running under a new token, or take over a
running step whose heartbeat is older than `retries.lease_s`, counting the takeover), then the
update runs while a background thread heartbeats the claim (a remote update can take minutes),
then the new policy version is published in one transaction guarded by the token. A step taken
over more than `retries.max_stage_attempts` times (its workers keep dying in it) fails the run
with the reason recorded, instead of being re-sent forever; so does a permanent backend error.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Task
from celery.signals import task_failure
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from metarl.backends import registry
from metarl.backends.base import OuterBatchEpisode, OuterResult, PolicySample
from metarl.store.claims import utcnow
from metarl.store.db import json_param, run_sql, session_scope
from metarl.store.episodes import record_costs, run_config_by_key
from metarl.store.tick_wakeup import request_tick
from metarl.domain.retry import WORKER_BACKOFF, backoff_delay
from metarl.errors import PermanentBackendError, TransientBackendError, describe_error
from metarl.store.step_metrics import outer_step_metrics
from metarl.store.records import OuterStatus, OuterStep, Run, RunStatus
from workers.app import app
from workers.common import database_url, worker_name
from workers.heartbeat import LeaseKeeper, heartbeat_interval
from schemas.states import ENDED_RUN_STATUSES

log = logging.getLogger("metarl.outer")



# -- pure rules ------------------------------------------------------------------------------------


def crash_looping(takeovers: int, max_stage_attempts: int) -> bool:
    """True when a step was taken over from dead workers more often than the cap allows (same rule as stages)."""
    return takeovers > max_stage_attempts


def crash_loop_message(step: int, takeovers: int, max_stage_attempts: int, last_error: str | None) -> str:
    """The error recorded on a step (and its run) that keeps killing its workers."""
    message = (
        f"outer step {step} was abandoned {takeovers} times (its worker died or crashed during the update; "
        f"retries.max_stage_attempts = {max_stage_attempts}); giving up"
    )
    return f"{message}; last error: {last_error}" if last_error else message



def update_with_retries(work: Callable[[], OuterResult], max_attempts: int, sleep: Callable[[float], None] = time.sleep) -> OuterResult:
    """Run `work`, retrying transient backend errors with backoff (the claim stays heartbeated meanwhile).

    After `max_attempts` transient errors in a row it raises PermanentBackendError naming the last one.
    Permanent errors and anything else propagate at once.
    """
    failures = 0
    while True:
        try:
            return work()
        except TransientBackendError as err:
            failures += 1
            if failures >= max_attempts:
                raise PermanentBackendError(f"gave up after {failures} transient errors: {describe_error(err)}") from err
            delay = backoff_delay(WORKER_BACKOFF, failures)
            log.warning("transient error in the outer update (%s); retry %s/%s in %ss", err, failures, max_attempts - 1, delay)
            sleep(delay)


# -- claim, heartbeat, failure ---------------------------------------------------------------------


@dataclass(frozen=True)
class OuterClaim:
    """This worker's claim on an outer step."""

    outer_step_id: int
    token: str
    takeovers: int


def claim_outer_step(outer_step_id: int, lease_s: float) -> OuterClaim | None:
    """CAS the step from pending (or running with a dead heartbeat) to running under a new token, in its own transaction."""
    with session_scope(database_url()) as session:
        return take_outer_step(session, outer_step_id, lease_s)


TAKE_STEP_SQL = """
UPDATE outer_steps
SET status = 'running', worker = %(worker)s, token = %(token)s, heartbeat_at = %(now)s,
    takeovers = takeovers + CASE WHEN status = 'running' THEN 1 ELSE 0 END
WHERE id = %(id)s AND (status = 'pending' OR (status = 'running' AND heartbeat_at < %(stale_before)s))
RETURNING takeovers
"""
RENEW_STEP_SQL = """
UPDATE outer_steps SET heartbeat_at = %(now)s WHERE id = %(id)s AND token = %(token)s AND status = 'running' RETURNING id
"""
"""Sent as they are (no ORM compilation), like the stage claims."""


def take_outer_step(session: Session, outer_step_id: int, lease_s: float) -> OuterClaim | None:
    """In the caller's transaction: CAS the step from pending (or running with a dead heartbeat) to running under a new token.

    Taking a running step over from a worker that stopped heartbeating counts one takeover.
    """
    token = str(uuid.uuid4())
    now = utcnow()
    params = {"worker": worker_name(), "token": token, "now": now, "id": outer_step_id, "stale_before": now - dt.timedelta(seconds=lease_s)}
    taken = run_sql(session, TAKE_STEP_SQL, params).first()
    return OuterClaim(outer_step_id, token, taken[0]) if taken is not None else None


def renew_outer_claim(session: Session, claim: OuterClaim) -> bool:
    """Heartbeat the step; False when it is no longer ours (taken over, or finished by someone else)."""
    return run_sql(session, RENEW_STEP_SQL, {"now": utcnow(), "id": claim.outer_step_id, "token": claim.token}).first() is not None


def keep_alive(claim: OuterClaim, lease_s: float) -> LeaseKeeper:
    """A background heartbeat of the claim for the duration of a `with` block."""
    return LeaseKeeper(database_url(), lambda session: renew_outer_claim(session, claim), heartbeat_interval(lease_s))


def fail_outer_step(claim: OuterClaim, message: str) -> bool:
    """Record the step as failed with its reason and fail the run (it cannot advance past this step).

    Returns False (and changes nothing) if this worker no longer holds the claim.
    """
    now = utcnow()
    with session_scope(database_url()) as session:
        failed = session.execute(
            update(OuterStep)
            .where(OuterStep.id == claim.outer_step_id, OuterStep.token == claim.token, OuterStep.status == OuterStatus.running)
            .values(status=OuterStatus.failed, error=message, finished_at=now, heartbeat_at=now)
            .returning(OuterStep.run_id, OuterStep.step)
        ).one_or_none()
        if failed is None:
            return False
        run_id, step = failed
        session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status.not_in(ENDED_RUN_STATUSES))
            .values(status=RunStatus.failed, status_message=f"outer step {step} failed: {message}", finished_at=now)
        )
    log.error("outer step %s of run %s failed: %s", step, run_id, message)
    return True


def record_attempt_error(outer_step_id: int, message: str) -> None:
    """Note why an attempt at a running step ended (kept for the crash-loop message); status is untouched."""
    with session_scope(database_url()) as session:
        session.execute(update(OuterStep).where(OuterStep.id == outer_step_id, OuterStep.status == OuterStatus.running).values(error=message))


# -- the batch and the new version -----------------------------------------------------------------


@dataclass(frozen=True)
class OuterStepRow:
    """What the outer task reads of its step before claiming it: one row, one round trip."""

    run_id: str
    run_created_at: dt.datetime
    run_status: RunStatus
    step: int
    version_before: int
    error: str | None
    base_state_uri: str | None


STEP_ROW_SQL = """
SELECT s.run_id, r.created_at, r.status, s.step, s.policy_version_before, s.error, pv.state_uri
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
FINISH_STEP_SQL = """
UPDATE outer_steps SET status = 'done', policy_version_after = %(after)s, finished_at = %(now)s, metrics = %(metrics)s, error = NULL
WHERE id = %(id)s AND token = %(token)s AND status = 'running'
RETURNING id
"""
INSERT_VERSION_SQL = """
INSERT INTO policy_versions (run_id, version, backend, state_uri, outer_step_id, created_at)
VALUES (%(run_id)s, %(version)s, %(backend)s, %(state_uri)s, %(id)s, now())
"""
ADVANCE_RUN_SQL = "UPDATE runs SET policy_version = %(after)s WHERE id = %(run_id)s AND policy_version = %(before)s"
"""The outer task's statements, sent as they are (no ORM compilation)."""


def outer_step_row(session: Session, outer_step_id: int) -> OuterStepRow | None:
    """The step, its run's status and the base policy's saved state, or None when there is no such step."""
    row = run_sql(session, STEP_ROW_SQL, {"id": outer_step_id}).first()
    if row is None:
        return None
    run_id, created_at, status, step, before, error, state_uri = row
    return OuterStepRow(run_id, created_at, RunStatus(status), step, before, error, state_uri)


@dataclass(frozen=True)
class OuterWork:
    """Everything one update needs, read from the records of its step."""

    run_id: str
    step: int
    version_before: int
    base_state_uri: str | None
    batch: list[OuterBatchEpisode]


def load_outer_work(session: Session, outer_step_id: int, row: OuterStepRow | None = None) -> OuterWork:
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


def publish_version(claim: OuterClaim, work: OuterWork, result: OuterResult, backend: Any) -> bool:
    """Close the step and record the new policy version in one transaction; False if the claim was lost."""
    after = work.version_before + 1
    with session_scope(database_url()) as session:
        metrics = outer_step_metrics(session, claim.outer_step_id, work.run_id, work.version_before)
        metrics.update({f"backend_{key}": value for key, value in result.metrics.items()})
        params = {"after": after, "now": utcnow(), "metrics": json_param(metrics), "id": claim.outer_step_id, "token": claim.token}
        if run_sql(session, FINISH_STEP_SQL, params).first() is None:
            session.rollback()
            return False
        version = {"run_id": work.run_id, "version": after, "backend": backend.name, "state_uri": result.state_uri, "id": claim.outer_step_id}
        run_sql(session, INSERT_VERSION_SQL, version)
        run_sql(session, ADVANCE_RUN_SQL, {"after": after, "run_id": work.run_id, "before": work.version_before})
        record_costs(session, work.run_id, None, result.costs, backend.simulated)
        request_tick(session, work.run_id, urgent=True)
    return True


# -- the task --------------------------------------------------------------------------------------


OUTER_TASK_NAME = "metarl.outer.update"


@task_failure.connect
def note_outer_failure(sender: Any = None, exception: BaseException | None = None, args: Sequence[Any] | None = None, **_: Any) -> None:
    """Record `Type: message` on the still-running step whose attempt raised or whose pool process died.

    Celery sends `task_failure` from the pool process for an exception and from the worker's main
    process for a lost pool process (WorkerLostError), so both reach the crash-loop message. The
    claim itself then expires and is taken over.
    """
    if getattr(sender, "name", None) != OUTER_TASK_NAME or not args or exception is None:
        return
    try:
        record_attempt_error(int(args[0]), describe_error(exception))
    except SQLAlchemyError as err:
        log.warning("could not record the error of outer step %s: %s", args[0], err)


@app.task(bind=True, name=OUTER_TASK_NAME, queue="outer", max_retries=None)
def outer_update(self: Task, outer_step_id: int) -> str:
    """Run one importance-sampling update on the step's batch and publish the next policy version."""
    with session_scope(database_url()) as session:
        row = outer_step_row(session, outer_step_id)
        if row is None:
            return "missing"
        if row.run_status in ENDED_RUN_STATUSES:
            return "skipped"
        config = run_config_by_key(session, row.run_id, row.run_created_at)
        lease_s, cap = config.retries.lease_s, config.retries.max_stage_attempts
        claim = take_outer_step(session, outer_step_id, lease_s)
        if claim is None:
            return "skipped"
        work = load_outer_work(session, outer_step_id, row)
        last_error = row.error
    if crash_looping(claim.takeovers, cap):
        fail_outer_step(claim, crash_loop_message(work.step, claim.takeovers, cap, last_error))
        return "failed"
    backend = registry.outer_backend(config)
    with keep_alive(claim, lease_s) as beat:
        try:
            result = update_with_retries(
                lambda: backend.update(work.run_id, work.step, work.version_before + 1, work.batch, config, work.base_state_uri), cap
            )
        except PermanentBackendError as err:
            fail_outer_step(claim, describe_error(err))
            return "failed"
    if beat.lost.is_set() or not publish_version(claim, work, result, backend):
        log.warning("outer step %s was taken over while it ran; its result is not published", work.step)
        return "taken over"
    log.info("outer step %s done: policy version %s", work.step, work.version_before + 1)
    return "updated"
