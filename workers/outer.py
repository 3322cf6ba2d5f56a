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
from sqlalchemy import case, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from metarl.backends import registry
from metarl.backends.base import OuterBatchEpisode, OuterResult, PolicySample
from metarl.claims import utcnow
from metarl.db import session_scope
from metarl.episodes import record_costs, run_config_of
from metarl.tick_wakeup import request_tick
from metarl.errors import PermanentBackendError, TransientBackendError
from orchestrator.step_metrics import outer_step_metrics
from schemas.records import Episode, EpisodeGroup, OuterStatus, OuterStep, PolicyVersion, ProbeAttempt, Reward, Run, RunStatus
from workers.app import app
from workers.common import database_url, worker_name
from workers.heartbeat import LeaseKeeper, heartbeat_interval

log = logging.getLogger("metarl.outer")

TRANSIENT_BACKOFF_S = (1.0, 4.0, 15.0, 60.0)
MAX_ERROR_CHARS = 2000
CLOSED_RUN_STATUSES = (RunStatus.failed, RunStatus.finished, RunStatus.stopped)


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


def describe_error(exc: BaseException) -> str:
    """`Type: message`, one line, bounded (what a step records about the exception that ended an attempt)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def transient_delay(failures: int, backoff: Sequence[float] = TRANSIENT_BACKOFF_S) -> float:
    """Seconds to wait after the `failures`-th transient error in a row (1-based); the last value repeats."""
    return backoff[min(max(failures, 1), len(backoff)) - 1]


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
            delay = transient_delay(failures)
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


def take_outer_step(session: Session, outer_step_id: int, lease_s: float) -> OuterClaim | None:
    """In the caller's transaction: CAS the step from pending (or running with a dead heartbeat) to running under a new token.

    Taking a running step over from a worker that stopped heartbeating counts one takeover.
    """
    token = str(uuid.uuid4())
    now = utcnow()
    takeovers = session.execute(
        update(OuterStep)
        .where(
            OuterStep.id == outer_step_id,
            or_(
                OuterStep.status == OuterStatus.pending,
                (OuterStep.status == OuterStatus.running) & (OuterStep.heartbeat_at < now - dt.timedelta(seconds=lease_s)),
            ),
        )
        .values(
            status=OuterStatus.running,
            worker=worker_name(),
            token=token,
            heartbeat_at=now,
            takeovers=OuterStep.takeovers + case((OuterStep.status == OuterStatus.running, 1), else_=0),
        )
        .returning(OuterStep.takeovers)
    ).scalar_one_or_none()
    return OuterClaim(outer_step_id, token, takeovers) if takeovers is not None else None


def renew_outer_claim(session: Session, claim: OuterClaim) -> bool:
    """Heartbeat the step; False when it is no longer ours (taken over, or finished by someone else)."""
    renewed = session.execute(
        update(OuterStep)
        .where(OuterStep.id == claim.outer_step_id, OuterStep.token == claim.token, OuterStep.status == OuterStatus.running)
        .values(heartbeat_at=utcnow())
        .returning(OuterStep.id)
    ).scalar_one_or_none()
    return renewed is not None


def keep_alive(claim: OuterClaim, lease_s: float) -> LeaseKeeper:
    """A background heartbeat of the claim for the duration of a `with` block."""
    return LeaseKeeper(database_url(), lambda session: renew_outer_claim(session, claim), heartbeat_interval(lease_s), name=f"outer-{claim.outer_step_id}")


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
            .where(Run.id == run_id, Run.status.in_((RunStatus.running, RunStatus.stopping)))
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
class OuterWork:
    """Everything one update needs, read from the records of its step."""

    run_id: str
    step: int
    version_before: int
    base_state_uri: str | None
    batch: list[OuterBatchEpisode]


def load_outer_work(session: Session, outer_step_id: int) -> OuterWork:
    """The step's batch: every rewarded episode of the groups batched into it, with its policy samples."""
    step = session.get(OuterStep, outer_step_id)
    if step is None:
        raise LookupError(f"no outer step {outer_step_id}")
    rows = session.execute(
        select(Episode.id, Episode.group_id, Episode.policy_version, Reward.total)
        .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
        .join(Reward, Reward.episode_id == Episode.id)
        .where(EpisodeGroup.outer_step_id == outer_step_id)
        .order_by(Episode.id)
    ).all()
    samples: dict[int, list[PolicySample]] = {}
    for attempt in session.execute(
        select(ProbeAttempt).where(ProbeAttempt.episode_id.in_([r[0] for r in rows])).order_by(ProbeAttempt.attempt)
    ).scalars():
        if attempt.policy_tokens is None:
            continue
        samples.setdefault(attempt.episode_id, []).append(
            PolicySample(tokens=attempt.policy_tokens, logprobs=attempt.behaviour_logprobs, prompt_length=attempt.prompt_length)
        )
    batch = [OuterBatchEpisode(episode_id=r[0], group_id=r[1], policy_version=r[2], reward=r[3], samples=samples.get(r[0], [])) for r in rows]
    base_state_uri = session.execute(
        select(PolicyVersion.state_uri).where(PolicyVersion.run_id == step.run_id, PolicyVersion.version == step.policy_version_before)
    ).scalar_one_or_none()
    return OuterWork(run_id=step.run_id, step=step.step, version_before=step.policy_version_before, base_state_uri=base_state_uri, batch=batch)


def publish_version(claim: OuterClaim, work: OuterWork, result: OuterResult, backend: Any) -> bool:
    """Close the step and record the new policy version in one transaction; False if the claim was lost."""
    after = work.version_before + 1
    with session_scope(database_url()) as session:
        metrics = outer_step_metrics(session, claim.outer_step_id, work.run_id)
        metrics.update({f"backend_{key}": value for key, value in result.metrics.items()})
        finished = session.execute(
            update(OuterStep)
            .where(OuterStep.id == claim.outer_step_id, OuterStep.token == claim.token, OuterStep.status == OuterStatus.running)
            .values(status=OuterStatus.done, policy_version_after=after, finished_at=utcnow(), metrics=metrics, error=None)
            .returning(OuterStep.id)
        ).scalar_one_or_none()
        if finished is None:
            session.rollback()
            return False
        session.add(PolicyVersion(run_id=work.run_id, version=after, backend=backend.name, state_uri=result.state_uri, outer_step_id=claim.outer_step_id))
        session.execute(update(Run).where(Run.id == work.run_id, Run.policy_version == work.version_before).values(policy_version=after))
        record_costs(session, work.run_id, None, result.costs, backend.simulated)
        request_tick(session, work.run_id)
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
        step = session.get(OuterStep, outer_step_id)
        if step is None:
            return "missing"
        run = session.get(Run, step.run_id)
        if run is None or run.status in CLOSED_RUN_STATUSES:
            return "skipped"
        config = run_config_of(run)
        lease_s, cap = config.retries.lease_s, config.retries.max_stage_attempts
        last_error = step.error
        claim = take_outer_step(session, outer_step_id, lease_s)
        if claim is None:
            return "skipped"
        work = load_outer_work(session, outer_step_id)
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
