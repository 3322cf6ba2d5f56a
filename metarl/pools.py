"""Spawning and stopping one Celery worker process per pool (embedded default and tests)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from metarl.settings import BROKER_ENV, DATABASE_ENV
from workers.queues import QUEUES

log = logging.getLogger("metarl.pools")


def worker_command(pool: str, concurrency: int = 1, autoscale: str | None = None, loglevel: str = "info") -> list[str]:
    """The Celery command line of one pool.

    `--without-mingle`: at start a worker otherwise waits about a second for neighbours to share
    revoked task ids and logical clocks; nothing here revokes tasks (duplicates are stopped by the
    claims), so a restarted pool goes straight to work (see bench.resume).
    """
    if pool not in QUEUES:
        raise ValueError(f"unknown pool {pool!r}: use one of {', '.join(QUEUES)}")
    command = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", pool, "-n", f"{pool}@%h", "-l", loglevel, "-E", "--without-mingle"]
    command += ["--autoscale", autoscale] if autoscale else ["-c", str(concurrency)]
    return command


MAX_POOL_PROCESSES = 64
"""Most worker processes `WorkerPools` starts for one pool."""


def pool_processes(pools: tuple[str, ...], concurrency: Mapping[str, int] | None) -> dict[str, int]:
    """Worker processes per pool: 1 unless `concurrency` names the pool (pure; ValueError names a bad pool or count and the fix)."""
    asked = dict(concurrency or {})
    unknown = sorted(set(asked) - set(pools))
    if unknown:
        raise ValueError(f"concurrency names pool(s) {', '.join(unknown)} that are not started here: use some of {', '.join(pools)}")
    for pool, count in asked.items():
        if not 1 <= count <= MAX_POOL_PROCESSES:
            raise ValueError(f"concurrency of pool {pool} is {count}: give 1 to {MAX_POOL_PROCESSES} worker processes")
    return {pool: asked.get(pool, 1) for pool in pools}


def signal_group(pgid: int, signum: int) -> None:
    """Signal a process group that may already be gone."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return


def stop_process_group(process: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float = 10.0) -> None:
    """SIGTERM a process group (warm shutdown), wait, then SIGKILL whatever is left of it."""
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(process.pid, signal.SIGKILL)
    process.wait()


class WorkerPools:
    """One Celery worker per pool (one process, or `concurrency[pool]`), each in its own process group; stopped warm, then killed.

    A supervisor thread restarts a pool whose worker exits on its own, as Docker's `restart:
    unless-stopped` does in services mode: Celery workers can die of a broker outage (kombu fails
    to restore its unacknowledged messages over the dead connection and the worker exits with
    "Unrecoverable error"), and a run whose pool is gone would otherwise wait forever. Pools killed
    or stopped through this object are not restarted.
    """

    def __init__(
        self,
        database_url: str,
        broker_url: str,
        log_dir: Path,
        pools: tuple[str, ...] = QUEUES,
        supervise_interval_s: float | None = 1.0,
        concurrency: Mapping[str, int] | None = None,
    ):
        self.env = dict(os.environ)
        self.env[DATABASE_ENV] = database_url
        self.env[BROKER_ENV] = broker_url
        self.log_dir = log_dir
        self.pools = pools
        self.concurrency = pool_processes(pools, concurrency)
        self.cwd: Path | None = None
        """The workers' working directory (None: this process's)."""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, int] = {}
        self.supervise_interval_s = supervise_interval_s
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    def command(self, pool: str) -> list[str]:
        """The command line of one pool's worker (its `concurrency` processes)."""
        return worker_command(pool, self.concurrency.get(pool, 1))

    def start(self) -> None:
        """Start every pool (and the supervisor)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for pool in self.pools:
            self.start_pool(pool)
        if self.supervise_interval_s and (self._supervisor is None or not self._supervisor.is_alive()):
            self._stopping.clear()
            self._supervisor = threading.Thread(target=self._supervise, name="worker-pool-supervisor", daemon=True)
            self._supervisor.start()

    def start_pool(self, pool: str) -> subprocess.Popen[bytes]:
        """Start (or restart) one pool."""
        with self._lock:
            log_file = open(self.log_dir / f"worker-{pool}.log", "ab")
            process = subprocess.Popen(
                self.command(pool), env=self.env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.cwd
            )
            log_file.close()
            self.processes[pool] = process
            return process

    def _supervise(self) -> None:
        while not self._stopping.wait(self.supervise_interval_s):
            self.restart_exited()

    def restart_exited(self) -> list[str]:
        """Restart every pool whose worker exited on its own; returns their names."""
        restarted = []
        with self._lock:
            if self._stopping.is_set():
                return restarted
            for pool, process in list(self.processes.items()):
                code = process.poll()
                if code is None:
                    continue
                signal_group(process.pid, signal.SIGKILL)
                self.restarts[pool] = self.restarts.get(pool, 0) + 1
                log.warning("worker pool %s exited with code %s; restarting it (restart %s)", pool, code, self.restarts[pool])
                self.start_pool(pool)
                restarted.append(pool)
        return restarted

    def kill_pool(self, pool: str) -> None:
        """SIGKILL the pool's whole process group (crash drills)."""
        with self._lock:
            process = self.processes.pop(pool)
        signal_group(process.pid, signal.SIGKILL)
        process.wait()

    def kill_all(self) -> None:
        """SIGKILL every pool's process group at once (crash drills); the supervisor keeps running for a later start()."""
        with self._lock:
            processes = list(self.processes.values())
            self.processes.clear()
        for process in processes:
            signal_group(process.pid, signal.SIGKILL)
        for process in processes:
            process.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the supervisor, then every pool: warm shutdown, SIGKILL after `timeout_s`."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=10)
            self._supervisor = None
        with self._lock:
            processes = list(self.processes.values())
            self.processes.clear()
        for process in processes:
            if process.poll() is None:
                signal_group(process.pid, signal.SIGTERM)
        for process in processes:
            stop_process_group(process, timeout_s)
