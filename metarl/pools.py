"""Spawning and stopping one Celery worker process per pool (embedded default and tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from metarl.settings import BROKER_ENV, DATABASE_ENV
from workers.app import QUEUES


def worker_command(pool: str, concurrency: int = 1, autoscale: str | None = None, loglevel: str = "info") -> list[str]:
    if pool not in QUEUES:
        raise ValueError(f"unknown pool {pool!r}: use one of {', '.join(QUEUES)}")
    command = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", pool, "-n", f"{pool}@%h", "-l", loglevel, "-E"]
    command += ["--autoscale", autoscale] if autoscale else ["-c", str(concurrency)]
    return command


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
    """One worker process per pool, each in its own process group; stopped warm, then killed."""

    def __init__(self, database_url: str, broker_url: str, log_dir: Path, pools: tuple[str, ...] = QUEUES):
        self.env = dict(os.environ)
        self.env[DATABASE_ENV] = database_url
        self.env[BROKER_ENV] = broker_url
        self.log_dir = log_dir
        self.pools = pools
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for pool in self.pools:
            self.start_pool(pool)

    def start_pool(self, pool: str) -> subprocess.Popen[bytes]:
        log_file = open(self.log_dir / f"worker-{pool}.log", "ab")
        process = subprocess.Popen(worker_command(pool), env=self.env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log_file.close()
        self.processes[pool] = process
        return process

    def kill_pool(self, pool: str) -> None:
        """SIGKILL the pool's whole process group (crash drills)."""
        process = self.processes.pop(pool)
        signal_group(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                signal_group(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            stop_process_group(process, timeout_s)
        self.processes.clear()
