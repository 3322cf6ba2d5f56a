"""PostgreSQL server administration for the tests' private servers and the benchmarks: databases, backends, statistics, sizes.

None of it touches the records' contents; `admin_url` is a URL of a database on the server to
connect to while creating or dropping another (usually `postgres`).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import create_engine, text

from metarl.store.db import get_engine
from metarl.store.migration_head import normalise_url


def quoted_name(name: str) -> str:
    """A database name as a quoted SQL identifier (pure)."""
    return '"' + name.replace('"', '""') + '"'


def _as_admin(admin_url: str, statement: str) -> None:
    admin = create_engine(normalise_url(admin_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(statement))
    finally:
        admin.dispose()


def create_database(admin_url: str, name: str) -> None:
    """Create database `name` on the server of `admin_url` (it must not exist)."""
    _as_admin(admin_url, f"CREATE DATABASE {quoted_name(name)}")


def drop_database(admin_url: str, name: str) -> None:
    """Drop database `name` on the server of `admin_url` if it exists, disconnecting its sessions."""
    _as_admin(admin_url, f"DROP DATABASE IF EXISTS {quoted_name(name)} WITH (FORCE)")


def close_pooled_connections(database_url: str) -> None:
    """Close this process's pooled connections to the database (their backends end and flush their statistics)."""
    get_engine(database_url).dispose()


def backend_pids(database_url: str) -> list[int]:
    """Server process ids of the sessions connected to the database."""
    with get_engine(database_url).connect() as connection:
        return list(connection.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")).scalars())


def committed_transactions(database_url: str) -> int:
    """Transactions committed in the database so far, per the server's statistics (a fresh snapshot of them)."""
    with get_engine(database_url).connect() as connection:
        connection.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(connection.execute(text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).scalar_one())


def table_sizes(database_url: str, tables: Iterable[str]) -> dict[str, int]:
    """pg_total_relation_size (heap + indexes + TOAST) of each table, in bytes."""
    with get_engine(database_url).connect() as connection:
        return {table: int(connection.execute(text("SELECT pg_total_relation_size(:t)"), {"t": table}).scalar_one()) for table in tables}


def vacuum_analyze(database_url: str) -> None:
    """VACUUM ANALYZE the whole database (outside a transaction)."""
    with get_engine(database_url).connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))
