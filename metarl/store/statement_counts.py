"""Counting the database work of this process: statements, transactions and pool checkouts (the benchmarks' instrument).

Statements sent through a session or an engine connection are seen by SQLAlchemy's engine events;
those of `metarl.store.db.run_sql` and the commits of `metarl.store.db.sql_transaction` bypass them
and are seen through `metarl.store.db.observing_statements`. Both are counted, neither twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event

from metarl.store.db import get_engine, observing_statements


@dataclass
class DatabaseWork:
    """What this process sent to one database since the count started (or was reset)."""

    statements: int = 0
    transactions: int = 0
    """Commits."""
    checkouts: int = 0
    """Connections taken from the engine's pool."""

    def reset(self) -> None:
        """Start counting from zero again."""
        self.statements = self.transactions = self.checkouts = 0


@contextmanager
def counting_database_work(database_url: str) -> Iterator[DatabaseWork]:
    """Count the work this process sends to the database while the block runs."""
    engine = get_engine(database_url)
    work = DatabaseWork()

    def on_statement(*_: Any) -> None:
        work.statements += 1

    def on_commit(*_: Any) -> None:
        work.transactions += 1

    def on_checkout(*_: Any) -> None:
        work.checkouts += 1

    def on_observed(statement: str) -> None:
        if statement == "COMMIT":
            work.transactions += 1
        else:
            work.statements += 1

    pool = engine.pool
    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "commit", on_commit)
    event.listen(pool, "checkout", on_checkout)
    try:
        with observing_statements(on_observed):
            yield work
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "commit", on_commit)
        event.remove(pool, "checkout", on_checkout)
