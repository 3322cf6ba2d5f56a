"""Retrying a failed run: its failed outer step goes back to pending and the run to running.

A run fails only when an outer step fails (a permanent backend error, or a step that kept killing
its workers). Once the cause is fixed, `metarl resume RUN_ID --retry-failed` reopens that step: the
reconciler re-sends it on the resumed orchestrator's first tick, and it updates from the same
saved policy version as before. Episodes, rewards and costs are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from metarl.errors import MAX_ERROR_CHARS, bounded_text
from metarl.store.records import RUN_ROW_LOCK, OuterStatus, OuterStep, Run, RunStatus

MAX_MESSAGE_CHARS = MAX_ERROR_CHARS


class NotRetryable(Exception):
    """The run is not failed, or has no failed outer step to retry."""


@dataclass(frozen=True)
class ReopenedStep:
    """The outer step a retry reopened, and why it had failed."""

    step: int
    policy_version: int
    previous_error: str


def retry_message(step: int, previous_error: str) -> str:
    """The run's status message after a retry (bounded; names the step and the error it failed with)."""
    return bounded_text(f"resumed: outer step {step} retried after: {previous_error}", MAX_MESSAGE_CHARS)


def reopen_failed_run(session: Session, run_id: str) -> ReopenedStep:
    """In the caller's transaction: put the run's failed outer step back to pending and the run back to running."""
    run = session.get(Run, run_id, with_for_update=RUN_ROW_LOCK)
    if run is None:
        raise NotRetryable(f"no run with id {run_id}")
    if run.status != RunStatus.failed:
        raise NotRetryable(f"run {run_id} is {run.status.value}, not failed; `metarl resume {run_id}` continues it")
    step = (
        session.execute(select(OuterStep).where(OuterStep.run_id == run_id, OuterStep.status == OuterStatus.failed).order_by(OuterStep.step.desc()))
        .scalars()
        .first()
    )
    if step is None:
        raise NotRetryable(f"run {run_id} failed ({run.status_message}) but has no failed outer step to retry")
    previous = step.error or "no error recorded"
    step.status = OuterStatus.pending
    step.token = step.worker = step.heartbeat_at = step.dispatched_at = step.finished_at = step.error = None
    step.takeovers = 0
    run.status = RunStatus.running
    run.finished_at = None
    run.status_message = retry_message(step.step, previous)
    return ReopenedStep(step.step, step.policy_version_before, previous)
