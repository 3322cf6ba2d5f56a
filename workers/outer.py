"""The outer-update task (queue `outer`, one at a time): claims its step, updates, saves the new version.

Lifecycle of one step: claim (compare-and-set pending -> running under a new token, or take over a
running step whose heartbeat is older than `retries.lease_s`, counting the takeover), then the
update runs while a background thread heartbeats the claim (a remote update can take minutes),
then the new policy version is published in one transaction guarded by the token. A step taken
over more than `retries.max_stage_attempts` times (its workers keep dying in it) fails the run
with the reason recorded, instead of being re-sent forever; so does a permanent backend error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery import Task
from celery.signals import task_failure

from metarl import composition as registry
from metarl.domain.retry import WORKER_BACKOFF, backoff_delay
from metarl.errors import PermanentBackendError, TransientBackendError, describe_error
from metarl.interfaces import OuterResult
from metarl.store import (
    OuterClaim,
    OuterWork,
    StoreError,
    claim_outer_lease,
    claim_outer_work,
    note_outer_attempt_error,
    publish_outer_version,
    renew_outer_step,
)
from metarl.store import (
    fail_outer_step as record_outer_failure,
)
from schemas.states import ENDED_RUN_STATUSES, StageOutcome
from workers.app import app
from workers.common import database_url, worker_name
from workers.heartbeat import LeaseKeeper, heartbeat_interval

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


def claim_outer_step(outer_step_id: int, lease_s: float) -> OuterClaim | None:
    """CAS the step from pending (or running with a dead heartbeat) to running under a new token, in its own transaction."""
    return claim_outer_lease(database_url(), outer_step_id, worker=worker_name(), lease_s=lease_s)


def keep_alive(claim: OuterClaim, lease_s: float) -> LeaseKeeper:
    """A background heartbeat of the claim for the duration of a `with` block."""
    return LeaseKeeper(database_url(), lambda url: renew_outer_step(url, claim), heartbeat_interval(lease_s))


def fail_outer_step(claim: OuterClaim, message: str) -> bool:
    """Record the step as failed with its reason and fail the run (it cannot advance past this step).

    Returns False (and changes nothing) if this worker no longer holds the claim.
    """
    failed = record_outer_failure(database_url(), claim, message)
    if failed is None:
        return False
    run_id, step = failed
    log.error("outer step %s of run %s failed: %s", step, run_id, message)
    return True


def publish_version(claim: OuterClaim, work: OuterWork, result: OuterResult, backend: Any) -> bool:
    """Close the step and record the new policy version in one transaction; False if the claim was lost."""
    return publish_outer_version(database_url(), claim, work, result, backend=backend.name, simulated=backend.simulated)


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
        note_outer_attempt_error(database_url(), int(args[0]), describe_error(exception))
    except StoreError as err:
        log.warning("could not record the error of outer step %s: %s", args[0], err)


@app.task(bind=True, name=OUTER_TASK_NAME, queue="outer", max_retries=None)
def outer_update(self: Task, outer_step_id: int) -> StageOutcome:
    """Run one importance-sampling update on the step's batch and publish the next policy version."""
    claimed = claim_outer_work(database_url(), outer_step_id, worker=worker_name(), skip_runs=ENDED_RUN_STATUSES)
    if isinstance(claimed, str):
        return StageOutcome(claimed)
    claim, config, work = claimed.claim, claimed.config, claimed.work
    lease_s, cap = config.retries.lease_s, config.retries.max_stage_attempts
    last_error = claim.last_error
    if crash_looping(claim.takeovers, cap):
        fail_outer_step(claim, crash_loop_message(work.step, claim.takeovers, cap, last_error))
        return StageOutcome.failed
    backend = registry.outer_backend(config)
    with keep_alive(claim, lease_s) as beat:
        try:
            result = update_with_retries(lambda: backend.update(work.run_id, work.step, work.version_before + 1, work.batch, config, work.base_state_uri), cap)
        except PermanentBackendError as err:
            fail_outer_step(claim, describe_error(err))
            return StageOutcome.failed
    if beat.lost.is_set() or not publish_version(claim, work, result, backend):
        log.warning("outer step %s was taken over while it ran; its result is not published", work.step)
        return StageOutcome.taken_over
    log.info("outer step %s done: policy version %s", work.step, work.version_before + 1)
    return StageOutcome.updated
