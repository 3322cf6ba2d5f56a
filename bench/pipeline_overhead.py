"""Pipeline overhead: our bookkeeping against a plain Celery chain of the same no-op tasks.

    python -m bench.pipeline_overhead [--episodes 200] [--repeats 2] [--tick-s 0.5] [--train-processes 1] [--no-floor] [--no-reuse]

Needs Redis and PostgreSQL on 127.0.0.1 (METARL_BENCH_PG_ADMIN_URL and METARL_BENCH_REDIS_URL
override). It creates a scratch database (dropped afterwards), reserves a Redis database number with
the tests' lock scheme, and then, in the same process and on the same broker:

* **ours**: five real worker pools as subprocesses (`metarl.pools.WorkerPools`: one `celery worker
  -c 1` per queue) and the real orchestrator loop (`orchestrator.loop.Orchestrator`) run N episodes
  through agent -> probe -> train (submit, then one poll message) -> eval on the `sim` backends with
  every duration zero, no invalid jobs and no job failures, plus one outer update per batch. Every
  stage claims its row, records its result and moves the episode in PostgreSQL.
* **plain**: five worker processes started the same way, on the same Celery app configuration,
  run `bench._sim_plain_chain`: per episode the chain agent -> probe -> train submit -> train poll
  (sent with the same countdown) -> eval of no-op tasks, plus one no-op outer task per batch. Same
  number of task messages, same queues, same concurrency; no database.
* **floor** (skip with --no-floor): the plain chain whose every task also claims its step and
  moves its episode in PostgreSQL with two autocommit statements (`bench._sim_floor_chain`): the
  least any design that records every stage durably pays on this machine.
* **reuse** (skip with --no-reuse): the plain chain on the Redis transport our pipeline runs on
  (`metarl.messaging.redis_broker`, one redis-py client per channel), where plain and floor run on kombu's
  own (one client per publish, ack and event): ours over reuse is the bookkeeping alone.

The ratio is ours' wall time over the plain chain's for the same N. It has no target: the old
one (at most 1.5) is retired, because the ratio follows the machine as much as the pipeline
(BENCHMARKS.md, "Pipeline overhead"); the report's "target <= 1.5x: MEETS/MISSES" is kept for
comparison with earlier runs only. The table also gives where the time goes: mean worker time
per task (from the workers' logs), CPU seconds of the worker processes, of the orchestrator and of
the PostgreSQL backends, orchestrator ticks and their SQL statements, and database transactions
per episode.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from metarl.settings import BROKER_ENV, DATABASE_ENV
from schemas.run_config import WindowConfig

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_ENV = "METARL_BENCH_PG_ADMIN_URL"
REDIS_ENV = "METARL_BENCH_REDIS_URL"
DEFAULT_PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379"
REDIS_LOCK_PREFIX = "metarl-test-db-lock:"  # the same reservation scheme as tests/conftest.py
STAGES_PER_EPISODE = 5  # agent, probe, train submit, train poll (retry), eval
TARGET_RATIO = 1.5
TASK_LINE = re.compile(r"Task (?P<name>[\w.]+)\[[0-9a-f\-]+\] (?P<what>received|succeeded in (?P<secs>[0-9.eE\-]+)s|retry:)")


# -- settings and results ---------------------------------------------------------------------------


class BenchSettings(BaseModel):
    """What one benchmark invocation runs."""

    model_config = ConfigDict(extra="forbid")

    episodes: int = Field(default=200, ge=8, le=100_000, description="Episodes per pipeline; a multiple of group_size * groups_per_batch")
    group_size: int = Field(default=4, ge=1, le=64, description="Episodes per group")
    groups_per_batch: int = Field(default=2, ge=1, le=64, description="Complete groups per outer update")
    tick_s: float = Field(
        default=WindowConfig.model_fields["tick_s"].default, ge=0.01, le=60.0, description="Orchestrator tick period (window.tick_s; default the run config's)"
    )
    poll_interval_s: float = Field(default=0.01, ge=0.01, le=60.0, description="Train poll countdown in both pipelines")
    window: int | None = Field(default=None, ge=1, le=100_000, description="Episodes in flight (default: all of them)")
    repeats: int = Field(default=2, ge=1, le=10, description="Alternating plain/ours pairs")
    train_processes: int = Field(default=1, ge=1, le=8, description="Worker processes of the train pool in every pass (the other pools have one)")

    @property
    def episodes_per_batch(self) -> int:
        """Episodes consumed by one outer update."""
        return self.group_size * self.groups_per_batch

    @property
    def outer_steps(self) -> int:
        """Outer updates that N episodes make."""
        return self.episodes // self.episodes_per_batch


class TaskStat(BaseModel):
    """Worker-side numbers of one task name, from a Celery worker log."""

    model_config = ConfigDict(extra="forbid")

    received: int = Field(default=0, ge=0, description="Messages the worker received")
    succeeded: int = Field(default=0, ge=0, description="Executions that returned")
    retried: int = Field(default=0, ge=0, description="Executions that ended in self.retry")
    runtime_s: list[float] = Field(default_factory=list, description="Runtimes of the executions that returned")

    @property
    def mean_ms(self) -> float:
        """Mean runtime of the returned executions, in milliseconds (0 when none)."""
        return 1000.0 * statistics.fmean(self.runtime_s) if self.runtime_s else 0.0


class MachineCpu(BaseModel):
    """CPU seconds of the whole machine over an interval, all cores added up (from the `cpu` line of /proc/stat)."""

    model_config = ConfigDict(extra="forbid")

    busy_s: float = Field(ge=0.0, description="user, nice, system, irq and softirq time: every process, Redis, PostgreSQL and the kernel")
    idle_s: float = Field(ge=0.0, description="idle and iowait time: cores with nothing to run")
    steal_s: float = Field(ge=0.0, description="time the hypervisor gave this VM's cores to someone else (a noisy neighbour)")

    def since(self, before: MachineCpu) -> MachineCpu:
        """The CPU time between an earlier reading and this one."""
        return MachineCpu(busy_s=self.busy_s - before.busy_s, idle_s=self.idle_s - before.idle_s, steal_s=self.steal_s - before.steal_s)


class PhaseResult(BaseModel):
    """One timed pass of one pipeline."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=16, description="ours or plain")
    episodes: int = Field(ge=0, description="Episodes completed")
    outer_steps: int = Field(ge=0, description="Outer updates completed")
    wall_s: float = Field(gt=0.0, description="Seconds from the first dispatch to the last outer update seen done")
    tasks: int = Field(ge=0, description="Task messages the workers received")
    worker_cpu_s: float = Field(ge=0.0, description="CPU seconds of all worker processes during the pass")
    consumer_cpu_s: float | None = Field(
        default=None, ge=0.0, description="Of worker_cpu_s, the Celery consumers' (each worker's main process: receive, ack, events); the rest ran the tasks"
    )
    driver_cpu_s: float = Field(ge=0.0, description="CPU seconds of this process (orchestrator or chain driver) during the pass")
    machine: MachineCpu | None = Field(
        default=None, description="The whole machine's CPU time during the pass (/proc/stat: every process, Redis and the kernel included)"
    )
    postgres_cpu_s: float | None = Field(default=None, ge=0.0, description="CPU seconds of the PostgreSQL backends serving the scratch database (ours only)")
    db_commits: int | None = Field(default=None, ge=0, description="Transactions committed in the scratch database (ours only)")
    ticks: int | None = Field(default=None, ge=0, description="Orchestrator ticks (ours only)")
    tick_ms_mean: float | None = Field(default=None, ge=0.0, description="Mean time of one tick (ours only)")
    tick_sql: int | None = Field(default=None, ge=0, description="SQL statements the orchestrator ran (ours only)")
    task_stats: dict[str, TaskStat] = Field(default_factory=dict, description="Per task name, from the worker logs")

    @property
    def episodes_per_s(self) -> float:
        """Episodes per wall second."""
        return self.episodes / self.wall_s

    @property
    def tasks_per_s(self) -> float:
        """Task messages per wall second."""
        return self.tasks / self.wall_s


class StageProfile(BaseModel):
    """Database work of one stage function, counted in-process (the worker's code path without Celery)."""

    model_config = ConfigDict(extra="forbid")

    calls: int = Field(ge=1, description="Stage executions replayed")
    statements: float = Field(ge=0.0, description="SQL statements per execution")
    transactions: float = Field(ge=0.0, description="Committed transactions per execution")
    checkouts: float = Field(ge=0.0, description="Connection-pool checkouts per execution (a local socket check each, no round trip)")
    wall_ms: float = Field(ge=0.0, description="Wall milliseconds per execution")
    cpu_ms: float = Field(ge=0.0, description="CPU milliseconds per execution (this process)")

    @property
    def round_trips(self) -> float:
        """Client/server round trips per execution: statements, and BEGIN and COMMIT of each transaction."""
        return self.statements + 2 * self.transactions


# -- pure helpers (unit-tested) -------------------------------------------------------------------


def validate_settings(settings: BenchSettings) -> list[str]:
    """Problems with a settings object, as sentences (empty when fine)."""
    problems = []
    if settings.episodes % settings.episodes_per_batch:
        problems.append(f"--episodes {settings.episodes} must be a multiple of group_size x groups_per_batch = {settings.episodes_per_batch}")
    return problems


def expected_tasks(episodes: int, episodes_per_batch: int) -> int:
    """Task messages one pass executes: five per episode plus one outer update per batch."""
    return STAGES_PER_EPISODE * episodes + episodes // episodes_per_batch


def parse_worker_log(text: str) -> dict[str, TaskStat]:
    """Per task name: received messages, returned and retried executions, runtimes (Celery's info log)."""
    stats: dict[str, TaskStat] = {}
    for match in TASK_LINE.finditer(text):
        stat = stats.setdefault(match["name"], TaskStat())
        what = match["what"]
        if what == "received":
            stat.received += 1
        elif what == "retry:":
            stat.retried += 1
        else:
            stat.succeeded += 1
            stat.runtime_s.append(float(match["secs"]))
    return stats


def merge_stats(parts: list[dict[str, TaskStat]]) -> dict[str, TaskStat]:
    """Add up per-task numbers of several logs (or several passes)."""
    merged: dict[str, TaskStat] = {}
    for part in parts:
        for name, stat in part.items():
            into = merged.setdefault(name, TaskStat())
            into.received += stat.received
            into.succeeded += stat.succeeded
            into.retried += stat.retried
            into.runtime_s.extend(stat.runtime_s)
    return merged


def stage_of(task_name: str) -> str:
    """`metarl.stage.agent` / `bench.plain.eval` -> `agent` / `eval`: the stage a task stands for."""
    return task_name.rsplit(".", 1)[-1].rstrip("_").replace("update", "outer")


def overhead_ratio(ours_wall_s: float, plain_wall_s: float) -> float:
    """How many times longer our pipeline takes than the plain chain for the same episodes."""
    if ours_wall_s <= 0 or plain_wall_s <= 0:
        raise ValueError("wall times must be positive")
    return ours_wall_s / plain_wall_s


def pair_ratios(plain: list[PhaseResult], ours: list[PhaseResult]) -> list[float]:
    """The ratio of each alternating plain/ours pair: their spread shows how much the machine drifted during the bench."""
    return [overhead_ratio(mine.wall_s, theirs.wall_s) for theirs, mine in zip(plain, ours)]


def machine_busy_ratio(plain: list[PhaseResult], ours: list[PhaseResult]) -> float | None:
    """Median busy CPU of the whole machine in our passes over that of the plain passes; None without the readings."""
    plain_busy = [r.machine.busy_s for r in plain if r.machine and r.machine.busy_s > 0]
    ours_busy = [r.machine.busy_s for r in ours if r.machine and r.machine.busy_s > 0]
    if not plain_busy or not ours_busy:
        return None
    return statistics.median(ours_busy) / statistics.median(plain_busy)


def verdict(ratio: float, target: float = TARGET_RATIO) -> str:
    """`meets` or `misses` the target ratio."""
    return "meets" if ratio <= target else "misses"


def stat_cpu_s(stat_line: str, ticks_per_s: float) -> tuple[int, float]:
    """(process group, user+system CPU seconds) from one /proc/PID/stat line."""
    fields = stat_line[stat_line.rindex(")") + 2 :].split()
    # after "pid (comm) ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return int(fields[2]), (int(fields[11]) + int(fields[12])) / ticks_per_s


def machine_cpu_of(proc_stat: str, ticks_per_s: float) -> MachineCpu:
    """The machine's CPU time so far from the text of /proc/stat (its first line: cpu user nice system idle iowait irq softirq steal ...)."""
    fields = [int(value) for value in proc_stat.split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
    return MachineCpu(busy_s=(user + nice + system + irq + softirq) / ticks_per_s, idle_s=(idle + iowait) / ticks_per_s, steal_s=steal / ticks_per_s)


def machine_cpu() -> MachineCpu:
    """The machine's CPU time so far (Linux /proc/stat)."""
    return machine_cpu_of(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def run_config_toml(settings: BenchSettings, specs_dir: Path, artifacts: Path, seed: int = 0) -> str:
    """The run config of our pass: sim backends with zero durations, no invalid jobs, no failures."""
    window = settings.window or settings.episodes
    return f"""
[run]
name = "bench-overhead"
seed = {seed}
tasks = ["addition", "reversal"]
task_specs_dir = "{specs_dir}"
max_outer_steps = {settings.outer_steps}

[backends.agent]
type = "sim"
duration = {{ median_s = 0.0, sigma = 0.0, max_s = 0.0 }}
invalid_rate = 0.0

[backends.train]
type = "sim"
duration = {{ median_s = 0.0, sigma = 0.0, max_s = 0.0 }}
failure_rate = 0.0
max_concurrent_jobs = 10000
poll_interval_s = {settings.poll_interval_s}

[backends.eval]
type = "sim"
duration = {{ median_s = 0.0, sigma = 0.0, max_s = 0.0 }}

[backends.outer]
type = "sim"
duration = {{ median_s = 0.0, sigma = 0.0, max_s = 0.0 }}

[window]
in_flight = {window}
tick_s = {settings.tick_s}

[outer]
group_size = {settings.group_size}
groups_per_batch = {settings.groups_per_batch}
max_steps_off_policy = {min(1000, settings.outer_steps + 1)}

[retries]
lease_s = 600
redispatch_after_s = 600

[budget]
max_run_usd = 1000000.0

[artifacts]
root = "{artifacts}"
"""


# -- services -------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database, dropped afterwards."""
    from metarl.store import create_database, dispose_engines, drop_database, upgrade_database

    name = f"metarl_bench_{uuid.uuid4().hex[:10]}"
    create_database(admin_url, name)
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade_database(url)
        yield url
    finally:
        dispose_engines()
        drop_database(admin_url, name)


@contextlib.contextmanager
def reserved_redis(base_url: str) -> Iterator[str]:
    """A Redis database number reserved like the tests do (lock key in db 0), flushed before and after."""
    import redis

    registry = redis.Redis.from_url(f"{base_url}/0")
    owner = f"bench:{os.getpid()}:{uuid.uuid4().hex}"
    number = next((n for n in range(1, 16) if registry.set(f"{REDIS_LOCK_PREFIX}{n}", owner, nx=True, ex=3600)), None)
    if number is None:
        registry.close()
        raise SystemExit("error: Redis databases 1-15 are all reserved by test sessions; try again later")
    url = f"{base_url}/{number}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
        if registry.get(f"{REDIS_LOCK_PREFIX}{number}") == owner.encode():
            registry.delete(f"{REDIS_LOCK_PREFIX}{number}")
        registry.close()


CHAIN_MODULES = {"plain": "bench._sim_plain_chain", "floor": "bench._sim_floor_chain", "reuse": "bench._sim_plain_chain"}
"""The Celery chains the bench runs beside ours: no-op tasks, the same with the least durable bookkeeping, and no-op tasks on our transport."""
CHAIN_TRANSPORT = {"plain": "stock", "floor": "stock", "reuse": "ours"}
"""Each chain's Redis transport (`bench._sim_plain_chain.chain_app`): kombu's own, or ours (`metarl.messaging.redis_broker`) as our pipeline uses."""


def chain_worker_command(pool: str, chain: str = "plain", processes: int = 1) -> list[str]:
    """Our pools' worker command line with a chain's app and node name (`plain-agent@host`, ...)."""
    from metarl.pools import worker_command

    command = worker_command(pool, processes)
    command[command.index("-A") + 1] = f"{CHAIN_MODULES[chain]}:app"
    command[command.index("-n") + 1] = f"{chain}-{pool}@%h"
    return command


def start_chain_pools(database_url: str, broker_url: str, log_dir: Path, chain: str, train_processes: int = 1):  # type: ignore[no-untyped-def]
    """WorkerPools whose processes run a chain's app (same flags and processes per queue as ours)."""
    from metarl.pools import WorkerPools

    class ChainPools(WorkerPools):
        """One chain worker per queue, started and stopped like ours."""

        def command(self, pool: str) -> list[str]:
            return chain_worker_command(pool, chain, self.concurrency[pool])

    from bench._sim_plain_chain import CHAIN_TRANSPORT_ENV

    pools = ChainPools(database_url, broker_url, log_dir, concurrency={"train": train_processes})
    pools.env[CHAIN_TRANSPORT_ENV] = CHAIN_TRANSPORT[chain]
    pools.cwd = REPO
    pools.start()
    return pools


def wait_for_workers(broker_url: str, names: set[str], timeout_s: float = 120.0) -> None:
    """Block until every named worker answers a ping (all pools consuming)."""
    from workers.app import make_app

    app = make_app(broker_url)
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while time.monotonic() < deadline:
        for reply in app.control.ping(timeout=1.0) or []:
            seen.update(name.split("@", 1)[0] for name in reply)
        if names <= seen:
            return
    raise SystemExit(f"error: workers {sorted(names - seen)} did not start within {timeout_s:.0f} s")


class GroupCpu(NamedTuple):
    """User+system CPU seconds of some process groups at one moment: all their processes, and their leaders alone."""

    total: float
    leaders: float

    def fields_since(self, before: GroupCpu) -> dict[str, float]:
        """The PhaseResult fields of the CPU spent between `before` and this reading."""
        return {"worker_cpu_s": self.total - before.total, "consumer_cpu_s": self.leaders - before.leaders}


def group_cpu_s(pgids: set[int]) -> GroupCpu:
    """User+system CPU seconds of every live process in these process groups: (all of them, the group leaders alone).

    A worker pool's group leader is its Celery consumer (`celery worker`, started in a new session);
    the other members are its pool processes, which run the tasks.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = leaders = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            pgid, cpu = stat_cpu_s((entry / "stat").read_text(), ticks)
        except (OSError, ValueError, IndexError):
            continue
        if pgid in pgids:
            total += cpu
            leaders += cpu if int(entry.name) == pgid else 0.0
    return GroupCpu(total, leaders)


def pids_cpu(pids: list[int]) -> dict[int, float]:
    """User+system CPU seconds of each of these processes that is still alive."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            out[pid] = stat_cpu_s(Path(f"/proc/{pid}/stat").read_text(), ticks)[1]
        except (OSError, ValueError, IndexError):
            continue
    return out


def postgres_backends(database_url: str) -> list[int]:
    """Server pids connected to the scratch database."""
    from metarl.store import backend_pids

    return backend_pids(database_url)


def committed_transactions(database_url: str, settle_s: float = 1.5) -> int:
    """Transactions committed in the scratch database so far (after letting backends flush their statistics)."""
    from metarl.store import close_pooled_connections, committed_transactions

    close_pooled_connections(database_url)  # closed connections flush their backends' statistics
    time.sleep(settle_s)
    return committed_transactions(database_url)


def read_logs(log_dir: Path) -> dict[str, TaskStat]:
    """Per task name over all worker logs of one pass."""
    return merge_stats([parse_worker_log(path.read_text(encoding="utf-8", errors="replace")) for path in sorted(log_dir.glob("worker-*.log"))])


# -- the two passes -------------------------------------------------------------------------------


def run_ours(settings: BenchSettings, database_url: str, broker_url: str, work: Path) -> PhaseResult:
    """N episodes through the real orchestrator and real worker pools on the zero-duration sim backends."""
    from metarl.pools import WorkerPools
    from metarl.runconfig import load_run
    from metarl.store import count_episodes, count_outer_steps, counting_database_work
    from orchestrator.loop import Orchestrator, TickReport, create_run
    from schemas.states import OuterStatus, RunStatus, Stage
    from workers.app import QUEUES, make_app

    config_path = work / "run.toml"
    config_path.write_text(run_config_toml(settings, REPO / "tasks_specs", work / "artifacts"), encoding="utf-8")
    config, specs = load_run(config_path)
    log_dir = work / "logs-ours"
    pools = WorkerPools(database_url, broker_url, log_dir, concurrency={"train": settings.train_processes})
    pools.start()
    try:
        wait_for_workers(broker_url, set(QUEUES))
        run_id = create_run(database_url, config, specs)
        tick_times: list[float] = []
        orchestrator = Orchestrator(database_url, make_app(broker_url), run_id)
        original_tick = orchestrator.tick

        def timed_tick() -> TickReport:
            started = time.perf_counter()
            report = original_tick()
            tick_times.append(time.perf_counter() - started)
            return report

        orchestrator.tick = timed_tick  # type: ignore[method-assign]
        pg_before = pids_cpu(postgres_backends(database_url))
        commits_before = committed_transactions(database_url)
        pgids = {process.pid for process in pools.processes.values()}
        cpu_before, driver_before, machine_before = group_cpu_s(pgids), time.process_time(), machine_cpu()
        started = time.perf_counter()
        with counting_database_work(database_url) as database_work:
            status = orchestrator.loop(threading.Event())
        wall = time.perf_counter() - started
        driver_cpu, machine = time.process_time() - driver_before, machine_cpu().since(machine_before)
        sql = database_work.statements
        worker_cpu = group_cpu_s(pgids).fields_since(cpu_before)
        pg_after = pids_cpu(postgres_backends(database_url))
        pg_cpu = sum(cpu - pg_before.get(pid, 0.0) for pid, cpu in pg_after.items())
        if status != RunStatus.finished:
            raise SystemExit(f"error: our run ended {status.value}, not finished")
        done = count_episodes(database_url, run_id, (Stage.done,))
        steps = count_outer_steps(database_url, run_id, OuterStatus.done)
    finally:
        pools.stop()
    # workers' backends flush their statistics when they exit; count the commits after the stop
    commits = committed_transactions(database_url) - commits_before
    stats = read_logs(log_dir)
    return PhaseResult(
        name="ours",
        episodes=done,
        outer_steps=steps,
        wall_s=wall,
        tasks=sum(s.received for s in stats.values()),
        **worker_cpu,
        driver_cpu_s=driver_cpu,
        machine=machine,
        postgres_cpu_s=max(0.0, pg_cpu),
        db_commits=max(0, commits),
        ticks=len(tick_times),
        tick_ms_mean=1000.0 * statistics.fmean(tick_times) if tick_times else 0.0,
        tick_sql=sql,
        task_stats=stats,
    )


def run_chain(settings: BenchSettings, database_url: str, broker_url: str, work: Path, chain: str = "plain") -> PhaseResult:
    """N Celery chains of the plain, floor or reuse tasks on the same broker, same queues, same worker processes."""
    import importlib

    import redis
    from celery import chain as celery_chain

    from bench._sim_floor_chain import finished_floor_episodes, prepare
    from bench._sim_plain_chain import DONE_KEY, OUTER_KEY, chain_app
    from workers.app import QUEUES

    prefix = importlib.import_module(CHAIN_MODULES[chain]).TASK_PREFIX
    log_dir = work / f"logs-{chain}"
    if chain == "floor":
        prepare(database_url, settings.episodes)
    pools = start_chain_pools(database_url, broker_url, log_dir, chain, settings.train_processes)
    client = redis.Redis.from_url(broker_url)
    try:
        wait_for_workers(broker_url, {f"{chain}-{q}" for q in QUEUES})
        client.delete(DONE_KEY, OUTER_KEY)
        app = chain_app(CHAIN_TRANSPORT[chain], broker_url)
        pgids = {process.pid for process in pools.processes.values()}
        pg_before = pids_cpu(postgres_backends(database_url)) if chain == "floor" else {}
        cpu_before, driver_before, machine_before = group_cpu_s(pgids), time.process_time(), machine_cpu()
        started = time.perf_counter()
        for episode in range(settings.episodes):
            celery_chain(
                app.signature(f"{prefix}.agent", args=(episode,), queue="agent", immutable=True),
                app.signature(f"{prefix}.probe", args=(episode,), queue="probe", immutable=True),
                app.signature(f"{prefix}.train", args=(episode, False), queue="train", immutable=True),
                app.signature(f"{prefix}.train", args=(episode, True), queue="train", immutable=True, countdown=settings.poll_interval_s),
                app.signature(f"{prefix}.eval", args=(episode, settings.episodes_per_batch), queue="eval", immutable=True),
            ).apply_async()
        deadline = time.monotonic() + 600
        while int(client.get(OUTER_KEY) or 0) < settings.outer_steps:
            if time.monotonic() > deadline:
                raise SystemExit(f"error: the {chain} chain did not finish within 600 s")
            time.sleep(0.005)
        wall = time.perf_counter() - started
        driver_cpu, machine = time.process_time() - driver_before, machine_cpu().since(machine_before)
        worker_cpu = group_cpu_s(pgids).fields_since(cpu_before)
        pg_cpu = sum(cpu - pg_before.get(pid, 0.0) for pid, cpu in pids_cpu(postgres_backends(database_url)).items()) if chain == "floor" else None
        episodes, steps = int(client.get(DONE_KEY) or 0), int(client.get(OUTER_KEY) or 0)
    finally:
        client.close()
        pools.stop()
    if chain == "floor":
        moved = finished_floor_episodes(database_url)
        if moved != settings.episodes:
            raise SystemExit(f"error: the floor chain moved {moved} of {settings.episodes} episodes through every step; see {log_dir}")
    stats = read_logs(log_dir)
    return PhaseResult(
        name=chain,
        episodes=episodes,
        outer_steps=steps,
        wall_s=wall,
        tasks=sum(s.received for s in stats.values()),
        **worker_cpu,
        driver_cpu_s=driver_cpu,
        machine=machine,
        postgres_cpu_s=max(0.0, pg_cpu) if pg_cpu is not None else None,
        task_stats=stats,
    )


def profile_stages(settings: BenchSettings, database_url: str, broker_url: str, work: Path, episodes: int = 8) -> dict[str, StageProfile]:
    """Replay the stage functions in this process on a fresh run and count their database work.

    No workers run; the stage functions are called directly (a train poll's self.retry raises
    celery's Retry without sending), and the messages they send stay in the reserved Redis database.
    """
    from celery.exceptions import Retry

    from metarl.runconfig import load_run
    from metarl.store import counting_database_work, episode_ids, outer_step_ids, stage_claim_tokens
    from orchestrator.loop import Orchestrator, create_run
    from schemas.states import Stage
    from workers import outer as outer_tasks
    from workers import stages
    from workers.app import make_app

    if stages.app.conf.broker_url != broker_url:
        raise SystemExit("error: the workers' app points at another broker; refusing to replay")
    profile_settings = settings.model_copy(update={"episodes": episodes})
    config_path = work / "profile.toml"
    config_path.write_text(run_config_toml(profile_settings, REPO / "tasks_specs", work / "profile-artifacts"), encoding="utf-8")
    config, specs = load_run(config_path)
    run_id = create_run(database_url, config, specs)
    orchestrator = Orchestrator(database_url, make_app(broker_url), run_id)
    orchestrator.setup()
    counting = contextlib.ExitStack()
    database_work = counting.enter_context(counting_database_work(database_url))
    profiles: dict[str, StageProfile] = {}

    def replay(name: str, calls: list[tuple[Any, tuple[int, ...], dict[str, str]]]) -> None:
        database_work.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        for function, args, kwargs in calls:
            try:
                function(*args, **kwargs)
            except Retry:
                pass
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        n = len(calls)
        profiles[name] = StageProfile(
            calls=n,
            statements=database_work.statements / n,
            transactions=database_work.transactions / n,
            checkouts=database_work.checkouts / n,
            wall_ms=1000 * wall / n,
            cpu_ms=1000 * cpu / n,
        )

    try:
        orchestrator.tick()
        ids = episode_ids(database_url, run_id)
        replay("agent", [(stages.agent_stage, (i, 1), {}) for i in ids])
        replay("probe", [(stages.probe_stage, (i, 1), {}) for i in ids])
        replay("train submit", [(stages.train_stage, (i, 1), {}) for i in ids])
        # a poll message carries the submit's claim token (self.retry passes it); direct calls do not
        tokens = stage_claim_tokens(database_url, run_id, Stage.train)
        replay("train poll", [(stages.train_stage, (i, 1), {"token": tokens[i]}) for i in ids])
        replay("eval", [(stages.eval_stage, (i, 1), {}) for i in ids])
        replay("tick", [(orchestrator.tick, (), {}) for _ in range(3)])
        step_ids = outer_step_ids(database_url, run_id)
        if step_ids:
            replay("outer", [(outer_tasks.outer_update, (step_id,), {}) for step_id in step_ids[:1]])
    finally:
        orchestrator.stop()
        counting.close()
    return profiles


# -- report ---------------------------------------------------------------------------------------


def per_stage_ms(result: PhaseResult) -> dict[str, float]:
    """Mean worker milliseconds per executed task message, by stage."""
    out: dict[str, float] = {}
    for name, stat in result.task_stats.items():
        executions = stat.succeeded + stat.retried
        if executions:
            # retried executions log no runtime; attribute the returned ones' total to all executions
            out[stage_of(name)] = 1000.0 * sum(stat.runtime_s) / executions
    return out


def cpu_ms_per_message(result: PhaseResult) -> tuple[float, float]:
    """Worker CPU milliseconds per task message: (Celery's consumer, the task process); (0, 0) without messages or the split."""
    if not result.tasks or result.consumer_cpu_s is None:
        return 0.0, 0.0
    consumer = 1000.0 * result.consumer_cpu_s / result.tasks
    return consumer, 1000.0 * result.worker_cpu_s / result.tasks - consumer


def cpu_ms_per_episode(result: PhaseResult) -> float:
    """CPU milliseconds per finished episode: workers, driver or orchestrator, and PostgreSQL where measured (Redis not counted)."""
    return 1000 * (result.worker_cpu_s + result.driver_cpu_s + (result.postgres_cpu_s or 0.0)) / max(1, result.episodes)


def comparison_lines(label: str, slower: list[PhaseResult], faster: list[PhaseResult], *notes: str) -> list[str]:
    """A ratio line (`label`: median wall times of `slower` over `faster`, then each pair's) and the notes that explain it."""
    ratio = overhead_ratio(statistics.median(r.wall_s for r in slower), statistics.median(r.wall_s for r in faster))
    return [f"ratio {label} (median wall time): {ratio:.2f}x; of each pair: " + ", ".join(f"{pair:.2f}x" for pair in pair_ratios(faster, slower)), *notes]


def worker_processes_line(train_processes: int) -> str:
    """How many worker processes each pass ran (the same in every pass)."""
    if train_processes == 1:
        return "5 worker processes (-c 1), one per queue, in every pass"
    return f"one worker per queue, -c 1 except the train pool's -c {train_processes}, in every pass"


def render(
    settings: BenchSettings,
    plain: list[PhaseResult],
    ours: list[PhaseResult],
    profiles: dict[str, StageProfile] | None = None,
    floor: list[PhaseResult] | None = None,
    reuse: list[PhaseResult] | None = None,
) -> str:
    """The printed report: machine, settings, throughput table, ratio, and where the time goes."""
    best_plain = min(plain, key=lambda r: r.wall_s)
    best_ours = min(ours, key=lambda r: r.wall_s)
    ratio = overhead_ratio(statistics.median(r.wall_s for r in ours), statistics.median(r.wall_s for r in plain))
    lines = [
        "Pipeline overhead: our bookkeeping against a plain Celery chain (zero-duration SIMULATOR backends)",
        f"date {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}  host {platform.node()}  cores {os.cpu_count()}  load {os.getloadavg()[0]:.2f}",
        f"episodes {settings.episodes}  group_size {settings.group_size}  groups_per_batch {settings.groups_per_batch}  outer steps {settings.outer_steps}  "
        f"window {settings.window or settings.episodes}  tick_s {settings.tick_s}  poll countdown {settings.poll_interval_s}s  repeats {settings.repeats}",
        f"tasks per pass: 5 per episode (agent, probe, train submit, train poll, eval) + 1 outer per batch = {expected_tasks(settings.episodes, settings.episodes_per_batch)}; "
        + worker_processes_line(settings.train_processes),
        "",
        f"{'pass':<8}{'wall s':>9}{'episodes/s':>12}{'tasks/s':>10}{'tasks':>8}{'worker CPU s':>14}{'driver CPU s':>14}{'PG CPU s':>10}"
        f"{'machine busy s':>16}{'idle s':>8}{'steal s':>9}",
    ]
    for result in [r for passes in zip(plain, floor or [None] * len(plain), ours, reuse or [None] * len(plain)) for r in passes if r is not None]:
        pg = f"{result.postgres_cpu_s:.1f}" if result.postgres_cpu_s is not None else "-"
        machine = (
            f"{result.machine.busy_s:>16.1f}{result.machine.idle_s:>8.1f}{result.machine.steal_s:>9.2f}" if result.machine else f"{'-':>16}{'-':>8}{'-':>9}"
        )
        lines.append(
            f"{result.name:<8}{result.wall_s:>9.2f}{result.episodes_per_s:>12.1f}{result.tasks_per_s:>10.1f}{result.tasks:>8}"
            f"{result.worker_cpu_s:>14.1f}{result.driver_cpu_s:>14.1f}{pg:>10}{machine}"
        )
    lines += [
        "",
        f"ratio ours/plain (median wall time): {ratio:.2f}x  target <= {TARGET_RATIO}x: {verdict(ratio).upper()}",
        "ratio of each pair: " + ", ".join(f"{pair:.2f}x" for pair in pair_ratios(plain, ours)),
    ]
    busy_ratio = machine_busy_ratio(plain, ours)
    if busy_ratio is not None:
        lines.append(
            f"ratio ours/plain of the machine's busy CPU (medians; every process, Redis and the kernel included): {busy_ratio:.2f}x "
            f"(a diagnostic beside the wall-time target: it leaves out idle cores and the machine's drift in speed)"
        )
    if floor:
        lines += comparison_lines(
            "floor/plain",
            floor,
            plain,
            "  floor = the plain chain plus the least durable bookkeeping of an exactly-once stage (a claim and a compare-and-set",
            "  move, two autocommit statements per task; bench/_sim_floor_chain.py): what any design recording every stage costs here",
        )
    if reuse:
        lines += comparison_lines(
            "ours/reuse",
            ours,
            reuse,
            "  reuse = the plain chain on the Redis transport ours runs on (metarl/messaging/redis_broker.py: one redis-py client per channel;",
            "  plain and floor run on kombu's own, a client per publish, ack and event): ours/reuse is the bookkeeping alone",
        )
    lines += [
        "",
        "where the time goes (best pass of each):",
        f"{'stage':<8}{'plain ms/task':>15}{'ours ms/task':>14}",
    ]
    plain_ms, ours_ms = per_stage_ms(best_plain), per_stage_ms(best_ours)
    for stage in ("agent", "probe", "train", "eval", "outer"):
        lines.append(f"{stage:<8}{plain_ms.get(stage, 0.0):>15.2f}{ours_ms.get(stage, 0.0):>14.2f}")
    episodes = max(1, best_ours.episodes)
    best_floor = min(floor, key=lambda r: r.wall_s) if floor else None
    best_reuse = min(reuse, key=lambda r: r.wall_s) if reuse else None
    best_passes = [best_plain, *([best_floor] if best_floor else []), *([best_reuse] if best_reuse else []), best_ours]
    lines += [
        f"orchestrator: {best_ours.ticks} ticks, {best_ours.tick_ms_mean:.1f} ms mean tick, {best_ours.tick_sql} SQL statements "
        f"({(best_ours.tick_sql or 0) / episodes:.1f} per episode), {best_ours.driver_cpu_s:.1f} CPU s",
        f"database: {best_ours.db_commits} transactions committed ({(best_ours.db_commits or 0) / episodes:.1f} per episode), "
        f"PostgreSQL backends {best_ours.postgres_cpu_s or 0.0:.1f} CPU s",
        f"CPU per episode: ours {cpu_ms_per_episode(best_ours):.1f} ms (workers + orchestrator + PostgreSQL), "
        + (f"floor {cpu_ms_per_episode(best_floor):.1f} ms (workers + driver + PostgreSQL), " if best_floor else "")
        + (f"reuse {cpu_ms_per_episode(best_reuse):.1f} ms, " if best_reuse else "")
        + f"plain {cpu_ms_per_episode(best_plain):.1f} ms (workers + driver; Redis not counted in any)",
        "worker CPU per task message, Celery's consumer (receive, ack, events) + the task process (task, next message): "
        + ", ".join(f"{r.name} " + "{:.2f} + {:.2f} ms".format(*cpu_ms_per_message(r)) for r in best_passes if r.consumer_cpu_s is not None),
    ]
    if profiles:
        lines += [
            "",
            "database work per execution (stage functions replayed in-process, no Celery; round trips = statements + 2 x transactions):",
            f"{'step':<14}{'calls':>6}{'statements':>12}{'transactions':>14}{'checkouts':>11}{'round trips':>13}{'wall ms':>9}{'CPU ms':>8}",
        ]
        for name, profile in profiles.items():
            lines.append(
                f"{name:<14}{profile.calls:>6}{profile.statements:>12.1f}{profile.transactions:>14.1f}{profile.checkouts:>11.1f}"
                f"{profile.round_trips:>13.1f}{profile.wall_ms:>9.1f}{profile.cpu_ms:>8.1f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run alternating plain/ours passes, print the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200, help="episodes per pass (a multiple of group size x groups per batch); lower it to scale down")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="rounds of passes, each plain, floor, ours, reuse in that order, less those skipped (default 2); ratios use the medians",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=WindowConfig.model_fields["tick_s"].default,
        help="orchestrator window.tick_s for our pass (default: the run config's default)",
    )
    parser.add_argument("--window", type=int, default=None, help="episodes in flight (default: all)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-batch", type=int, default=2)
    parser.add_argument(
        "--train-processes", type=int, default=1, help="worker processes of the train pool in every pass (default 1: its messages then run one after another)"
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the floor chain's pass (see bench/_sim_floor_chain.py)")
    parser.add_argument(
        "--no-reuse", action="store_true", help="skip the pass of the plain chain on our Redis transport (see metarl/messaging/redis_broker.py)"
    )
    args = parser.parse_args(argv)
    settings = BenchSettings(
        episodes=args.episodes,
        repeats=args.repeats,
        tick_s=args.tick_s,
        window=args.window,
        group_size=args.group_size,
        groups_per_batch=args.groups_per_batch,
        train_processes=args.train_processes,
    )
    problems = validate_settings(settings)
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 2
    import logging

    logging.basicConfig(level=logging.WARNING)
    plain: list[PhaseResult] = []
    floor: list[PhaseResult] = []
    ours: list[PhaseResult] = []
    reuse: list[PhaseResult] = []
    with (
        scratch_database(os.environ.get(PG_ADMIN_ENV, DEFAULT_PG_ADMIN)) as database_url,
        reserved_redis(os.environ.get(REDIS_ENV, DEFAULT_REDIS)) as broker_url,
        tempfile.TemporaryDirectory(prefix="metarl-bench-") as folder,
    ):
        # the workers' modules (and the replayed stage functions) read these when first imported
        os.environ[DATABASE_ENV], os.environ[BROKER_ENV] = database_url, broker_url
        if "workers.app" in sys.modules:
            raise SystemExit("error: workers.app was imported before the bench chose its broker")
        for index in range(settings.repeats):
            work = Path(folder) / f"pass-{index}"
            work.mkdir()
            plain.append(run_chain(settings, database_url, broker_url, work, "plain"))
            print(f"[{index + 1}/{settings.repeats}] plain {plain[-1].wall_s:.2f}s", file=sys.stderr, flush=True)
            if not args.no_floor:
                floor.append(run_chain(settings, database_url, broker_url, work, "floor"))
                print(f"[{index + 1}/{settings.repeats}] floor {floor[-1].wall_s:.2f}s", file=sys.stderr, flush=True)
            ours.append(run_ours(settings, database_url, broker_url, work))
            print(f"[{index + 1}/{settings.repeats}] ours {ours[-1].wall_s:.2f}s", file=sys.stderr, flush=True)
            if not args.no_reuse:
                reuse.append(run_chain(settings, database_url, broker_url, work, "reuse"))
                print(f"[{index + 1}/{settings.repeats}] reuse {reuse[-1].wall_s:.2f}s", file=sys.stderr, flush=True)
        profiles = profile_stages(settings, database_url, broker_url, Path(folder))
    print(render(settings, plain, ours, profiles, floor, reuse))
    return 0


if __name__ == "__main__":
    sys.exit(main())
