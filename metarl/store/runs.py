"""Runs: created, taken up by an orchestrator, and read or changed by the `metarl` commands.

A command (`resume`, `stop`, `status`, `report`) works in one transaction, :func:`runs_transaction`:
it resolves the run id the user typed and reads or changes the run in that same transaction.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from metarl.errors import RunNotFound
from metarl.store.db import psycopg_connection, session_scope
from metarl.store.failed_runs import ReopenedStep, reopen_failed_run
from metarl.store.records import PolicyVersion, Run, RunStatus
from metarl.store.report_data import episode_report, list_runs
from metarl.store.run_ids import resolve_run_id
from metarl.store.status import run_status
from schemas.states import DRIVEN_RUN_STATUSES

if TYPE_CHECKING:
    from metarl.report.tables import ReportData
    from schemas.run_config import RunConfig  # built here, not on import: the status commands never need it
    from schemas.task_spec import TaskSpec


def create_run(database_url: str, config: RunConfig, task_specs: Mapping[str, TaskSpec], initial_state: Callable[[str], str | None]) -> str:
    """Insert the run row and its policy version 0 in one transaction; return the run id.

    `initial_state(run_id)` is called once the run row is written (in the transaction) and returns the
    URI of version 0's state (the outer backend's, None when it keeps none); if it raises, nothing is recorded.
    """
    run_id = str(uuid.uuid4())
    with session_scope(database_url) as session:
        session.add(
            Run(
                id=run_id,
                name=config.run.name,
                status=RunStatus.running,
                config=config.model_dump(mode="json"),
                task_specs={task_id: spec.model_dump(mode="json") for task_id, spec in task_specs.items()},
                policy_version=0,
            )
        )
        session.flush()
        state_uri = initial_state(run_id)
        session.add(PolicyVersion(run_id=run_id, version=0, backend=config.backends.outer.type, state_uri=state_uri))
    return run_id


def take_up_run(database_url: str, run_id: str) -> RunConfig:
    """An orchestrator starts driving the run: a stopped, paused or interrupted run (or one stopping with no stop request) runs again; its config.

    Raises RunNotFound when there is no such run.
    """
    from schemas.run_config import RunConfig, stored_without_credentials  # built here, not on import: the status commands never need it

    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id}")
        if run.status == RunStatus.interrupted and run.stop_requested:
            run.status = RunStatus.stopping  # a stop asked for before the interruption still holds
        elif run.status in (RunStatus.stopped, RunStatus.paused, RunStatus.interrupted) or (run.status == RunStatus.stopping and not run.stop_requested):
            run.status = RunStatus.running
            run.stop_requested = False
            run.status_message = "resumed"
        cleaned = stored_without_credentials(run.config)
        if cleaned != run.config:
            run.config = cleaned  # a URL stored with its password before such URLs were refused: the secret leaves the row
        return RunConfig.model_validate(cleaned)


@dataclass(frozen=True)
class RunSummary:
    """What `metarl resume` checks of a run before it drives it."""

    run_id: str
    status: RunStatus
    status_message: str | None
    policy_version: int


class RunsTransaction:
    """The reads and changes of one `metarl` command, in one transaction (made by :func:`runs_transaction`)."""

    def __init__(self, session: Session):
        self._session = session

    def resolve_run_id(self, text: str) -> str:
        """The full id of the run `text` names (its id or a unique prefix); raises `metarl.store.run_ids.RunIdError`."""
        return resolve_run_id(psycopg_connection(self._session), text)

    def summary(self, run_id: str) -> RunSummary | None:
        """The run's status, message and policy version; None when there is no such run."""
        run = self._session.get(Run, run_id)
        if run is None:
            return None
        return RunSummary(run.id, run.status, run.status_message, run.policy_version)

    def stored_config(self, run_id: str) -> RunConfig:
        """The run's config as stored, credentials left out (``schemas.run_config.stored_run_config``); the run must exist."""
        from schemas.run_config import stored_run_config

        run = self._session.get(Run, run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id}")
        return stored_run_config(run.config)

    def saved_version(self, run_id: str, version: int) -> tuple[dt.datetime, str | None] | None:
        """When the run's policy version ``version`` was saved, and its state's URI (None: no such version)."""
        found = self._session.execute(
            select(PolicyVersion.created_at, PolicyVersion.state_uri).where(PolicyVersion.run_id == run_id, PolicyVersion.version == version)
        ).first()
        return None if found is None else (found[0], found[1])

    def reopen_failed_run(self, run_id: str) -> ReopenedStep:
        """Put the failed run's failed outer step back to pending and the run back to running (`metarl.store.failed_runs`)."""
        return reopen_failed_run(self._session, run_id)

    def request_stop(self, run_id: str) -> bool:
        """Ask the run to stop gracefully; False when there is no such run."""
        stopped = self._session.execute(update(Run).where(Run.id == run_id).values(stop_requested=True).returning(Run.id)).scalar_one_or_none()
        return stopped is not None

    def newest_run_named(self, name: str) -> RunSummary | None:
        """The newest run called `name` (what `metarl run CONFIG` continues or reports); None when there is none."""
        run = self._session.execute(select(Run).where(Run.name == name).order_by(Run.created_at.desc()).limit(1)).scalar_one_or_none()
        return None if run is None else RunSummary(run.id, run.status, run.status_message, run.policy_version)

    def mark_interrupted(self, run_id: str, message: str) -> bool:
        """A run whose orchestrator was stopped (Ctrl-C, SIGTERM) shows `interrupted`; False when it had already ended."""
        marked = self._session.execute(
            update(Run)
            .where(Run.id == run_id, Run.status.in_(DRIVEN_RUN_STATUSES))
            .values(status=RunStatus.interrupted, status_message=message)
            .returning(Run.id)
        ).scalar_one_or_none()
        return marked is not None

    def list_runs(self) -> list[dict[str, Any]]:
        """The newest runs as `metarl status` lists them (`metarl.store.report_data.list_runs`)."""
        return list_runs(self._session)

    def run_status(self, run_id: str, broker_url: str | None) -> dict[str, Any]:
        """Everything `metarl status RUN_ID` shows (`metarl.store.status.run_status`); LookupError when there is no such run."""
        return run_status(psycopg_connection(self._session), run_id, broker_url)

    def episode_report(self, episode_id: int) -> dict[str, Any]:
        """What happened to one episode (`metarl.store.report_data.episode_report`); LookupError when there is no such episode."""
        return episode_report(self._session, episode_id)

    def report_data(self, run_id: str) -> ReportData:
        """What the run report shows (`metarl.store.report_data`); LookupError when there is no such run."""
        from metarl.store.report_data import load_report_data

        return load_report_data(self._session, run_id)


@contextmanager
def runs_transaction(database_url: str) -> Iterator[RunsTransaction]:
    """One transaction for a command: committed at the end of the block, rolled back on an error."""
    with session_scope(database_url) as session:
        yield RunsTransaction(session)
