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

from metarl.messaging.queues import QUEUES
from metarl.settings import BROKER_ENV, DATABASE_ENV, HOST_ENV

log = logging.getLogger("metarl.pools")


MAX_POOL_PROCESSES = 64
"""Most worker processes one pool runs (`WorkerPools`, `metarl worker --concurrency` and `--autoscale`)."""


def parse_autoscale(text: str) -> tuple[int, int]:
    """(max, min) worker processes of an `--autoscale MAX,MIN` value (Celery's order; `MAX` alone means a min of 0).

    Celery 5.7 sorts the two numbers (celery/bin/worker.py, `Autoscale.convert`), so `2,16` would
    silently start a pool of up to 16 processes for a user who asked for at most 2: a max below the
    min is refused here instead. ValueError names the problem and the fix.
    """
    parts = [part.strip() for part in text.split(",")]
    if len(parts) > 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"--autoscale {text!r} is not MAX,MIN: give two whole numbers, e.g. 8,2 (at most 8 and at least 2 processes)")
    largest, smallest = int(parts[0]), int(parts[1]) if len(parts) == 2 else 0
    if largest < smallest:
        raise ValueError(f"--autoscale {largest},{smallest} puts the max below the min (the order is MAX,MIN): did you mean {smallest},{largest}?")
    if not 1 <= largest <= MAX_POOL_PROCESSES:
        raise ValueError(f"--autoscale max is {largest}: give 1 to {MAX_POOL_PROCESSES} worker processes")
    return largest, smallest


def worker_command(pool: str, concurrency: int = 1, autoscale: str | None = None, loglevel: str = "info") -> list[str]:
    """The Celery command line of one pool: `concurrency` processes, or an `--autoscale MAX,MIN` range (checked by `parse_autoscale`).

    Only a pool started with `--autoscale` can be resized from Flower (`POST /api/worker/pool/autoscale`):
    Celery answers its `autoscale` control command with an error without it, and Flower turns that into 403.

    `--without-mingle`: at start a worker otherwise waits about a second for neighbours to share
    revoked task ids and logical clocks; nothing here revokes tasks (duplicates are stopped by the
    claims), so a restarted pool goes straight to work (see bench.resume).
    """
    if pool not in QUEUES:
        raise ValueError(f"unknown pool {pool!r}: use one of {', '.join(QUEUES)}")
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.app",
        "worker",
        "-Q",
        pool,
        "-n",
        f"{pool}@{os.environ[HOST_ENV] if os.environ.get(HOST_ENV) else '%h'}",
        "-l",
        loglevel,
        "-E",
        "--without-mingle",
    ]
    if autoscale:
        largest, smallest = parse_autoscale(autoscale)
        command += ["--autoscale", f"{largest},{smallest}"]
    else:
        command += ["-c", str(concurrency)]
    return command


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
        restarted: list[str] = []
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
