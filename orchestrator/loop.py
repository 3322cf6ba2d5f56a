"""The orchestrator loop: keeps the window full, forms outer batches, reconciles, finishes the run.

It keeps no state of its own: every tick reads the tables, so `resume` is just running the loop again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import Celery
from kombu.exceptions import OperationalError as BrokerUnreachable
from sqlalchemy import select, text, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from metarl.store.claims import utcnow
from metarl.store.db import get_engine, session_scope
from metarl.store.episodes import open_groups, run_config_of
from metarl.store.tick_wakeup import TickWaiter
from metarl.errors import RunNotFound
from metarl.domain.batching import GroupView, groups_to_open, oldest_fresh_version, plan_batch, tasks_to_open
from orchestrator.reconciler import StageDispatch, orphaned_episodes, orphaned_outer_steps
from metarl.store.tick_counts import TickCounts, read_tick_counts
from metarl.store.records import RUN_ROW_LOCK, EpisodeGroup, GroupStatus, OuterStatus, OuterStep, Run, RunStatus, Stage
from schemas.run_config import RunConfig, StageDeadlines
from schemas.states import ENDED_RUN_STATUSES
from schemas.task_spec import TaskSpec
from metarl.messaging.dispatch import send_outer, send_stage

log = logging.getLogger("metarl.orchestrator")

DATABASE_ERRORS = (OperationalError, InterfaceError)
"""What a database that went away (restart, network) raises; the loop waits for it instead of exiting."""
MAX_OUTAGE_WAIT_S = 5.0


def create_run(database_url: str, config: RunConfig, task_specs: dict[str, TaskSpec]) -> str:
    """Insert the run row and policy version 0; return the run id."""
    from metarl.backends.registry import outer_backend
    from metarl.store.records import PolicyVersion

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
        state_uri = outer_backend(config).initial_state(run_id, config)
        session.add(PolicyVersion(run_id=run_id, version=0, backend=config.backends.outer.type, state_uri=state_uri))
    return run_id


@dataclass
class TickReport:
    """What one tick did (for progress displays and tests)."""

    opened_groups: int = 0
    dispatched: int = 0
    outer_step_created: int | None = None
    dropped_stale: int = 0
    finished: bool = False
    status: RunStatus = RunStatus.running
    messages: list[str] = field(default_factory=list)


def run_lock_key(run_id: str) -> int:
    return int(run_id.replace("-", "")[:15], 16) ^ 0x5A5A


class OrchestratorBusy(Exception):
    """Another orchestrator process holds this run."""


class Orchestrator:
    """Lifecycle: setup (lock + checks) -> loop of ticks -> stop (release lock)."""

    def __init__(self, database_url: str, celery_app: Celery, run_id: str):
        self.database_url = database_url
        self.app = celery_app
        self.run_id = run_id
        self._lock_connection = None
        self._first_tick = True
        self._next_reconcile = 0.0
        self._outages: dict[str, float] = {}

    def _acquire_lock(self) -> None:
        connection = get_engine(self.database_url).connect()
        got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": run_lock_key(self.run_id)}).scalar()
        if not got:
            connection.close()
            raise OrchestratorBusy(f"another orchestrator is running run {self.run_id}")
        connection.commit()
        self._lock_connection = connection

    def _ensure_lock(self) -> None:
        """After a database outage: keep the run's advisory lock if its session survived, else take it again.

        A restarted server forgot the lock with its sessions; if another orchestrator took the run
        meanwhile, this one stops (OrchestratorBusy) rather than drive the run twice.
        """
        if self._lock_connection is not None:
            try:
                self._lock_connection.execute(text("SELECT 1"))
                self._lock_connection.commit()
                return
            except DATABASE_ERRORS:
                self._lock_connection.invalidate()
                self._lock_connection.close()
                self._lock_connection = None
        self._acquire_lock()

    def _outage(self, service: str, message: str) -> None:
        """Log the first failure of an outage (not every tick of it)."""
        if service not in self._outages:
            self._outages[service] = time.monotonic()
            log.warning("run %s paused: %s", self.run_id, message)

    def _recovered(self, service: str) -> None:
        started = self._outages.pop(service, None)
        if started is not None:
            log.warning("run %s continues: the %s is reachable again after %.0fs", self.run_id, service, time.monotonic() - started)

    def setup(self) -> RunConfig:
        self._acquire_lock()
        with session_scope(self.database_url) as session:
            run = session.get(Run, self.run_id)
            if run is None:
                raise RunNotFound(f"no run with id {self.run_id}")
            if run.status == RunStatus.stopped or (run.status == RunStatus.stopping and not run.stop_requested):
                run.status = RunStatus.running
                run.stop_requested = False
                run.status_message = "resumed"
            return run_config_of(run)

    def stop(self) -> None:
        if self._lock_connection is not None:
            self._lock_connection.close()
            self._lock_connection = None

    def tick(self) -> TickReport:
        report = TickReport()
        dispatches: list[StageDispatch] = []
        outer_ids: list[int] = []
        with session_scope(self.database_url) as session:
            run = session.get(Run, self.run_id, with_for_update=RUN_ROW_LOCK)
            if run is None:
                raise RunNotFound(f"no run with id {self.run_id}")
            report.status = run.status
            if run.status in ENDED_RUN_STATUSES:
                report.finished = True
                return report
            config = run_config_of(run)
            now = utcnow()
            run.orchestrator_heartbeat_at = now
            if self._first_tick or time.monotonic() >= self._next_reconcile:
                dispatches += orphaned_episodes(session, run.id, now, config.retries.redispatch_after_s, config.retries.lease_s, self._first_tick)
                outer_ids += orphaned_outer_steps(session, run.id, now, config.retries.redispatch_after_s, config.retries.lease_s, self._first_tick)
                self._next_reconcile = time.monotonic() + reconcile_interval_s(config)
            counts = read_tick_counts(session, run.id)
            report.dropped_stale, resample_tasks = self._drop_stale_groups(session, run, config)
            counts = counts.after_dropping(report.dropped_stale)
            created, counts = self._maybe_create_outer_step(session, run, config, counts)
            if created is not None:
                report.outer_step_created = created
                outer_ids.append(created)
            draining = run.stop_requested or self._over_budget(run, config, counts.spent_usd, report)
            if not draining:
                held_out, counts = self._open_held_out_groups(session, run, config, report, counts)
                trainable, counts = self._open_groups(session, run, config, report, resample_tasks, counts)
                dispatches += held_out + trainable
            self._maybe_finish(run, config, report, draining, counts)
        self._first_tick = False
        report.dispatched = self._send(dispatches, outer_ids, config.deadlines)
        return report

    def _send(self, dispatches: list[StageDispatch], outer_ids: list[int], deadlines: StageDeadlines) -> int:
        """Send the tick's messages; with the broker down, stop and leave the rest to the reconciler.

        Their dispatch time is already recorded, so the reconciler re-sends them
        `retries.redispatch_after_s` later (a broker that restarted empty lost its queues too).
        """
        sent = 0
        try:
            for item in dispatches:
                send_stage(self.app, item.stage, item.episode_id, item.probe_attempt, time_limit=deadlines.for_queue(item.stage.value))
                sent += 1
            for outer_id in outer_ids:
                send_outer(self.app, outer_id, time_limit=deadlines.outer_s)
                sent += 1
        except BrokerUnreachable as err:
            unsent = len(dispatches) + len(outer_ids) - sent
            self._outage("broker", f"the broker is unreachable ({err}); {unsent} message(s) wait in the records and are re-sent when it is back")
            return sent
        if sent:
            self._recovered("broker")
        return sent

    def loop(self, stop_event: threading.Event, on_tick: Callable[[TickReport], None] | None = None) -> RunStatus:
        """Tick until the run ends or `stop_event` is set; a database outage pauses the loop (logged once) instead of ending it.

        Between ticks it waits `window.tick_s`, or less when a worker asks for a tick (metarl.store.tick_wakeup).
        """
        config = self.setup()
        waiter = TickWaiter(self.database_url, self.run_id)
        try:
            while not stop_event.is_set():
                try:
                    if "database" in self._outages:
                        self._ensure_lock()
                    report = self.tick()
                    if on_tick is not None:
                        on_tick(report)
                except DATABASE_ERRORS as err:
                    self._outage("database", f"the database is unreachable ({type(err.orig or err).__name__}: {str(err.orig or err).strip()[:200]}); retrying")
                    stop_event.wait(min(MAX_OUTAGE_WAIT_S, max(1.0, config.window.tick_s)))
                    continue
                self._recovered("database")
                if report.finished:
                    self._release_train_resources(config)
                    return report.status
                waiter.wait(config.window.tick_s, stop_event)
            return RunStatus.running
        finally:
            waiter.close()
            self.stop()

    def _release_train_resources(self, config: RunConfig) -> None:
        """A run that ended leaves nothing running on the train backend (idle Runpod pods are settled)."""
        from metarl.backends.registry import release_train_resources
        from metarl.errors import MetarlError

        try:
            released = release_train_resources(config, self.run_id, self.database_url)
        except MetarlError as err:
            log.warning("run %s ended but its train resources could not be released (the train workers' reaper retries): %s", self.run_id, err)
            return
        if released:
            log.info("run %s ended: released %s train backend resource(s)", self.run_id, released)

    def _over_budget(self, run: Run, config: RunConfig, spent: float, report: TickReport) -> bool:
        if spent < config.budget.max_run_usd:
            return False
        running = "running inner jobs are stopped" if config.budget.on_cap == "stop" else "running inner jobs finish"
        message = f"run budget ${config.budget.max_run_usd:.2f} reached (${spent:.2f} spent): no new episodes; {running}"
        if run.status_message != message:
            run.status_message = message
            log.warning(message)
        report.messages.append(message)
        return True

    def _drop_stale_groups(self, session: Session, run: Run, config: RunConfig) -> tuple[int, list[str]]:
        cutoff = oldest_fresh_version(run.policy_version, config.outer.max_steps_off_policy)
        stale = session.execute(
            select(EpisodeGroup).where(
                EpisodeGroup.run_id == run.id,
                EpisodeGroup.status == GroupStatus.complete,
                EpisodeGroup.held_out.is_(False),
                EpisodeGroup.policy_version < cutoff,
            )
        ).scalars().all()
        for group in stale:
            group.status = GroupStatus.dropped
        resample = [group.task_id for group in stale] if config.outer.stale_groups == "resample" else []
        return len(stale), resample

    def _maybe_create_outer_step(self, session: Session, run: Run, config: RunConfig, counts: TickCounts) -> tuple[int | None, TickCounts]:
        if counts.outer_busy or counts.outer_steps >= config.run.max_outer_steps:
            return None, counts
        complete = session.execute(
            select(EpisodeGroup.id, EpisodeGroup.policy_version, EpisodeGroup.size).where(
                EpisodeGroup.run_id == run.id, EpisodeGroup.status == GroupStatus.complete, EpisodeGroup.held_out.is_(False)
            )
        ).all()
        plan = plan_batch([GroupView(g, v) for g, v, _ in complete], run.policy_version, config.outer.max_steps_off_policy, config.outer.groups_per_batch)
        if not plan.batch:
            return None, counts
        sizes = {group_id: size for group_id, _, size in complete}
        episodes = sum(sizes[group_id] for group_id in plan.batch)
        step = OuterStep(
            run_id=run.id,
            step=counts.outer_steps + 1,
            status=OuterStatus.pending,
            policy_version_before=run.policy_version,
            n_groups=len(plan.batch),
            n_episodes=episodes,
            dropped_stale_groups=counts.dropped_unrecorded,
            dispatched_at=utcnow(),
            metrics={},
        )
        session.add(step)
        session.flush()
        session.execute(
            update(EpisodeGroup)
            .where(EpisodeGroup.id.in_(plan.batch), EpisodeGroup.status == GroupStatus.complete)
            .values(status=GroupStatus.batched, outer_step_id=step.id)
        )
        log.info("outer step %s: %s groups, %s episodes, policy version %s", step.step, len(plan.batch), episodes, run.policy_version)
        return step.id, counts.after_batching(len(plan.batch), counts.dropped_unrecorded)

    def _new_groups(self, session: Session, run: Run, config: RunConfig, task_ids: list[str], held_out: bool) -> list[StageDispatch]:
        """Open one group per task id, with its episodes at their first stage, in one statement; their first messages."""
        if not task_ids:
            return []
        size = (config.outer.held_out_group_size or config.outer.group_size) if held_out else config.outer.group_size
        episode_ids = open_groups(session, run_id=run.id, task_ids=task_ids, policy_version=run.policy_version, size=size, held_out=held_out, now=utcnow())
        return [StageDispatch(Stage.agent, episode_id, 1) for episode_id in episode_ids]

    def _open_held_out_groups(self, session: Session, run: Run, config: RunConfig, report: TickReport, counts: TickCounts) -> tuple[list[StageDispatch], TickCounts]:
        version = run.policy_version
        if version % config.outer.held_out_eval_every != 0:
            return [], counts
        dispatches: list[StageDispatch] = []
        for task_id, spec in run.task_specs.items():
            if not spec.get("held_out"):
                continue
            exists = session.execute(
                select(EpisodeGroup.id).where(
                    EpisodeGroup.run_id == run.id, EpisodeGroup.task_id == task_id, EpisodeGroup.policy_version == version, EpisodeGroup.held_out.is_(True)
                )
            ).first()
            if exists is None:
                opened = self._new_groups(session, run, config, [task_id], held_out=True)
                dispatches += opened
                counts = counts.after_opening(1, len(opened), trainable=False)
                report.opened_groups += 1
        return dispatches, counts

    def _open_groups(
        self, session: Session, run: Run, config: RunConfig, report: TickReport, resample_tasks: list[str], counts: TickCounts
    ) -> tuple[list[StageDispatch], TickCounts]:
        trainable = [task_id for task_id, spec in run.task_specs.items() if not spec.get("held_out")]
        if not trainable:
            return [], counts
        needed = (config.run.max_outer_steps - counts.outer_steps) * config.outer.groups_per_batch - counts.waiting_groups
        window = groups_to_open(counts.active_episodes, config.window.in_flight, config.outer.group_size)
        count = max(0, min(needed, window))
        task_ids = tasks_to_open(count, resample_tasks, trainable, counts.trainable_groups)
        dispatches = self._new_groups(session, run, config, task_ids, held_out=False)
        counts = counts.after_opening(len(task_ids), len(dispatches), trainable=True)
        report.opened_groups += len(task_ids)
        return dispatches, counts

    def _maybe_finish(self, run: Run, config: RunConfig, report: TickReport, draining: bool, counts: TickCounts) -> None:
        if counts.active_episodes or counts.outer_busy:
            if run.stop_requested and run.status == RunStatus.running:
                run.status = RunStatus.stopping
                report.status = run.status
            return
        if counts.outer_done >= config.run.max_outer_steps:
            run.status, run.status_message = RunStatus.finished, f"finished {counts.outer_done} outer steps"
        elif run.stop_requested:
            run.status, run.status_message = RunStatus.stopped, "stopped on request; `metarl resume` continues it"
        elif draining:
            run.status = RunStatus.stopped
        else:
            return
        run.finished_at = utcnow()
        report.status = run.status
        report.finished = True
        log.info("run %s %s", run.id, run.status.value)


def reconcile_interval_s(config: RunConfig) -> float:
    """Seconds between reconciler passes: a quarter of the shorter of the lease and the re-dispatch delay
    (so a lost stage is re-sent at most 25% later than those allow), never more often than the tick.

    Ticks also come on demand (metarl.store.tick_wakeup); the reconciler scans the run's active episodes,
    so it does not run on every one of them.
    """
    return max(config.window.tick_s, min(config.retries.lease_s, config.retries.redispatch_after_s) / 4)


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
