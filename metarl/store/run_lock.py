"""The advisory lock that makes one orchestrator process the only driver of a run.

It is a session-level PostgreSQL advisory lock held on a connection of its own for as long as the
orchestrator drives the run: a crashed orchestrator's lock goes with its connection, so `metarl
resume` can take the run over at once.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from metarl.store.db import DATABASE_UNREACHABLE, get_engine

LOCK_SALT = 0x5A5A
"""Mixed into every run's key; orchestrators of different versions must agree on it to exclude each other."""


def run_lock_key(run_id: str) -> int:
    """The advisory-lock key of a run: the first 15 hex digits of its UUID, salted (pure)."""
    return int(run_id.replace("-", "")[:15], 16) ^ LOCK_SALT


class RunLock:
    """The run's advisory lock on its own pooled connection (not in any transaction of the ticks)."""

    def __init__(self, database_url: str, run_id: str):
        self.database_url = database_url
        self.run_id = run_id
        self._connection: Connection | None = None

    @property
    def held(self) -> bool:
        return self._connection is not None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another session holds it."""
        connection = get_engine(self.database_url).connect()
        got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": run_lock_key(self.run_id)}).scalar()
        if not got:
            connection.close()
            return False
        connection.commit()
        self._connection = connection
        return True

    def keep_or_retake(self) -> bool:
        """After a database outage: keep the lock if its session survived, else take it again (False: another session has it now).

        A restarted server forgot the lock with its sessions. Raises DATABASE_UNREACHABLE errors while the
        database is still away.
        """
        if self._connection is not None:
            try:
                self._connection.execute(text("SELECT 1"))
                self._connection.commit()
                return True
            except DATABASE_UNREACHABLE:
                self._connection.invalidate()
                self._connection.close()
                self._connection = None
        return self.acquire()

    def release(self) -> None:
        """Close the lock's connection (the server releases the lock with its session)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
