"""The orchestrator loop: keeps the window full, forms outer batches, reconciles, finishes the run.

It keeps no state of its own: every tick reads the tables, so `resume` is just running the loop again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import Celery
from kombu.exceptions import OperationalError as BrokerUnreachable

from metarl.artifact_store import ArtifactStore, is_remote_root
from metarl.domain.batching import GroupView, groups_allowed_ahead, groups_to_open, oldest_fresh_version, plan_batch, tasks_to_open, window_failure_cause
from metarl.errors import HiddenEvalSecretFault
from metarl.learning.eval_secret import install_eval_secret, installed_fingerprint
from metarl.messaging.dispatch import send_outer, send_stage
from metarl.settings import host_name
from metarl.store import (
    DATABASE_UNREACHABLE,
    RunLock,
    RunTick,
    StageDispatch,
    TickCounts,
    TickWaiter,
    locked_tick,
    record_host,
    secret_disagreement,
    take_up_run,
    unreachable_reason,
    utcnow,
)
from metarl.store import create_run as insert_run
from orchestrator.reconciler import Reconciler
from schemas.run_config import RunConfig, StageDeadlines
from schemas.states import ENDED_RUN_STATUSES, RunStatus, Stage
from schemas.task_spec import TaskSpec

log = logging.getLogger("metarl.orchestrator")

MAX_OUTAGE_WAIT_S = 5.0


def create_run(database_url: str, config: RunConfig, task_specs: dict[str, TaskSpec]) -> str:
    """Insert the run row and policy version 0 (its state from the outer backend); return the run id.

    Under a local-folder artifact root, the root records that this host made the run (`ArtifactStore.mark_run`), so
    a worker on a host without that folder stops the run instead of failing its episodes.
    """
    from metarl.composition import outer_backend

    install_eval_secret(config.artifacts.root, create=not is_remote_root(config.artifacts.root))

    def initial_state(run_id: str) -> str | None:
        ArtifactStore(config.artifacts.root).mark_run(run_id)
        return outer_backend(config).initial_state(run_id, config)

    run_id = insert_run(database_url, config, task_specs, initial_state)
    record_orchestrator_host(database_url, run_id, config)
    return run_id


def record_orchestrator_host(database_url: str, run_id: str, config: RunConfig) -> None:
    """Install the deployment's secret and record this host's fingerprint; HiddenEvalSecretFault when there is none or the run's hosts disagree."""
    install_eval_secret(config.artifacts.root, create=not is_remote_root(config.artifacts.root))
    hosts = record_host(database_url, run_id, host_name(), "orchestrator", installed_fingerprint())
    disagreement = secret_disagreement(hosts)
    if disagreement is not None:
        raise HiddenEvalSecretFault(f"{disagreement}: give every host the same METARL_EVAL_SECRET, then `metarl resume {run_id}`")


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


class OrchestratorBusy(Exception):
    """Another orchestrator process holds this run."""


class Orchestrator:
    """Lifecycle: setup (lock + checks) -> loop of ticks -> stop (release lock)."""

    def __init__(self, database_url: str, celery_app: Celery, run_id: str):
        self.database_url = database_url
        self.app = celery_app
        self.run_id = run_id
        self._lock = RunLock(database_url, run_id)
        self._first_tick = True
        self._reconciler = Reconciler()
        self._outages: dict[str, float] = {}

    def _acquire_lock(self) -> None:
        if not self._lock.acquire():
            raise OrchestratorBusy(f"another orchestrator is running run {self.run_id}")

    def _ensure_lock(self) -> None:
        """After a database outage: keep the run's advisory lock if its session survived, else take it again.

        A restarted server forgot the lock with its sessions; if another orchestrator took the run
        meanwhile, this one stops (OrchestratorBusy) rather than drive the run twice.
        """
        if not self._lock.keep_or_retake():
            raise OrchestratorBusy(f"another orchestrator is running run {self.run_id}")

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
        config = take_up_run(self.database_url, self.run_id)
        record_orchestrator_host(self.database_url, self.run_id, config)
        return config

    def stop(self) -> None:
        self._lock.release()

    def tick(self) -> TickReport:
        report = TickReport()
        dispatches: list[StageDispatch] = []
        outer_ids: list[int] = []
        with locked_tick(self.database_url, self.run_id) as tick:
            report.status = tick.status
            if tick.status in ENDED_RUN_STATUSES:
                report.finished = True
                return report
            config = tick.config()
            now = utcnow()
            tick.beat(now)
            orphans, orphan_steps = self._reconciler.pass_if_due(tick, config, now, startup=self._first_tick)
            dispatches += orphans
            outer_ids += orphan_steps
            counts = tick.counts()
            report.dropped_stale, resample_tasks = self._drop_stale_groups(tick, config)
            unscored = tick.drop_unscored_groups()
            resample_tasks += unscored
            counts = counts.after_dropping(report.dropped_stale + len(unscored))
            if self._fail_if_window_failed(tick, config, report):
                return report
            created, counts = self._maybe_create_outer_step(tick, config, counts)
            if created is not None:
                report.outer_step_created = created
                outer_ids.append(created)
            draining = tick.stop_requested or self._over_budget(tick, config, counts.spent_usd, report)
            if not draining:
                start, counts = self._open_start_set(tick, config, report, counts)
                held_out, counts = self._open_held_out_groups(tick, config, report, counts)
                trainable, counts = self._open_groups(tick, config, report, resample_tasks, counts)
                dispatches += start + held_out + trainable
            self._maybe_finish(tick, config, report, draining, counts)
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
                except DATABASE_UNREACHABLE as err:
                    self._outage("database", f"the database is unreachable ({unreachable_reason(err)}); retrying")
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
        from metarl.composition import release_train_resources
        from metarl.errors import MetarlError

        try:
            released = release_train_resources(config, self.run_id, self.database_url)
        except MetarlError as err:
            log.warning("run %s ended but its train resources could not be released (the train workers' reaper retries): %s", self.run_id, err)
            return
        if released:
            log.info("run %s ended: released %s train backend resource(s)", self.run_id, released)

    def _over_budget(self, tick: RunTick, config: RunConfig, spent: float, report: TickReport) -> bool:
        if spent < config.budget.max_run_usd:
            return False
        running = "running inner jobs are stopped" if config.budget.on_cap == "stop" else "running inner jobs finish"
        message = f"run budget ${config.budget.max_run_usd:.2f} reached (${spent:.2f} spent): no new episodes; {running}"
        if tick.status_message != message:
            tick.set_status_message(message)
            log.warning(message)
        report.messages.append(message)
        return True

    def _fail_if_window_failed(self, tick: RunTick, config: RunConfig, report: TickReport) -> bool:
        """Pause the run when the last window of trainable episodes all failed for one cause (no outer step can learn from them)."""
        window = config.window.in_flight
        cause = window_failure_cause(tick.recent_trainable_outcomes(window), window)
        if cause is None:
            return False
        tick.end(RunStatus.paused, utcnow(), f"paused: the last {window} episodes all failed, none scored, for one cause: {cause}")
        report.status, report.finished = tick.status, True
        log.error("run %s %s", tick.run_id, tick.status_message)
        return True

    def _drop_stale_groups(self, tick: RunTick, config: RunConfig) -> tuple[int, list[str]]:
        dropped = tick.drop_stale_groups(below_version=oldest_fresh_version(tick.policy_version, config.outer.max_steps_off_policy))
        resample = dropped if config.outer.stale_groups == "resample" else []
        return len(dropped), resample

    def _maybe_create_outer_step(self, tick: RunTick, config: RunConfig, counts: TickCounts) -> tuple[int | None, TickCounts]:
        if counts.outer_busy or counts.outer_steps >= config.run.max_outer_steps:
            return None, counts
        complete = tick.complete_groups()
        plan = plan_batch(
            [GroupView(g.group_id, g.policy_version) for g in complete], tick.policy_version, config.outer.max_steps_off_policy, config.outer.groups_per_batch
        )
        if not plan.batch:
            return None, counts
        sizes = {g.group_id: g.size for g in complete}
        episodes = sum(sizes[group_id] for group_id in plan.batch)
        step = counts.outer_steps + 1
        step_id = tick.create_outer_step(
            step=step, group_ids=plan.batch, n_episodes=episodes, dropped_stale_groups=counts.dropped_unrecorded, dispatched_at=utcnow()
        )
        log.info("outer step %s: %s groups, %s episodes, policy version %s", step, len(plan.batch), episodes, tick.policy_version)
        return step_id, counts.after_batching(len(plan.batch), counts.dropped_unrecorded)

    def _new_groups(self, tick: RunTick, config: RunConfig, task_ids: list[str], held_out: bool) -> list[StageDispatch]:
        """Open one group per task id, with its episodes at their first stage, in one statement; their first messages."""
        if not task_ids:
            return []
        size = (config.outer.held_out_group_size or config.outer.group_size) if held_out else config.outer.group_size
        episode_ids = tick.open_groups(task_ids, size=size, held_out=held_out, now=utcnow())
        return [StageDispatch(Stage.agent, episode_id, 1) for episode_id in episode_ids]

    def _open_start_set(self, tick: RunTick, config: RunConfig, report: TickReport, counts: TickCounts) -> tuple[list[StageDispatch], TickCounts]:
        """Once, at policy version 0: one evaluation-only group of `outer.start_set_group_size` per training family (the fixed start set)."""
        size = config.outer.start_set_group_size
        if size == 0 or tick.policy_version != 0 or tick.start_set_opened():
            return [], counts
        trainable = [task_id for task_id, spec in tick.task_specs.items() if not spec.get("held_out")]
        episode_ids = tick.open_groups(trainable, size=size, held_out=True, now=utcnow(), start_set=True)
        report.opened_groups += len(trainable)
        counts = counts.after_opening(len(trainable), len(episode_ids), trainable=False)
        return [StageDispatch(Stage.agent, episode_id, 1) for episode_id in episode_ids], counts

    def _open_held_out_groups(self, tick: RunTick, config: RunConfig, report: TickReport, counts: TickCounts) -> tuple[list[StageDispatch], TickCounts]:
        version = tick.policy_version
        if version % config.outer.held_out_eval_every != 0:
            return [], counts
        dispatches: list[StageDispatch] = []
        for task_id, spec in tick.task_specs.items():
            if not spec.get("held_out"):
                continue
            if not tick.held_out_group_exists(task_id, version):
                opened = self._new_groups(tick, config, [task_id], held_out=True)
                dispatches += opened
                counts = counts.after_opening(1, len(opened), trainable=False)
                report.opened_groups += 1
        return dispatches, counts

    def _open_groups(
        self, tick: RunTick, config: RunConfig, report: TickReport, resample_tasks: list[str], counts: TickCounts
    ) -> tuple[list[StageDispatch], TickCounts]:
        trainable = [task_id for task_id, spec in tick.task_specs.items() if not spec.get("held_out")]
        if not trainable:
            return [], counts
        needed = (config.run.max_outer_steps - counts.outer_steps) * config.outer.groups_per_batch - counts.waiting_groups
        window = groups_to_open(counts.active_episodes, config.window.in_flight, config.outer.group_size)
        ahead = groups_allowed_ahead(counts.waiting_groups, counts.outer_busy, config.outer.groups_per_batch, config.window.batches_ahead)
        count = max(0, min(needed, window, window if ahead is None else ahead))
        task_ids = tasks_to_open(count, resample_tasks, trainable, counts.trainable_groups)
        dispatches = self._new_groups(tick, config, task_ids, held_out=False)
        counts = counts.after_opening(len(task_ids), len(dispatches), trainable=True)
        report.opened_groups += len(task_ids)
        return dispatches, counts

    def _maybe_finish(self, tick: RunTick, config: RunConfig, report: TickReport, draining: bool, counts: TickCounts) -> None:
        if counts.active_episodes or counts.outer_busy:
            if tick.stop_requested and tick.status == RunStatus.running:
                tick.set_status(RunStatus.stopping)
                report.status = tick.status
            return
        if counts.outer_done >= config.run.max_outer_steps:
            tick.end(RunStatus.finished, utcnow(), f"finished {counts.outer_done} outer steps")
        elif tick.stop_requested:
            tick.end(RunStatus.stopped, utcnow(), "stopped on request; `metarl resume` continues it")
        elif draining:
            tick.end(RunStatus.stopped, utcnow())
        else:
            return
        report.status = tick.status
        report.finished = True
        log.info("run %s %s", tick.run_id, tick.status.value)


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
