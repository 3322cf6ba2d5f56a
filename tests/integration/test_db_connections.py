"""Pooled connections: one the server closed is replaced at checkout, with no round trip on healthy ones."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import event, exc, text

from metarl.store.db import dispose_engines, get_engine, normalise_url, observing_statements, run_sql, server_closed, session_scope, sql_transaction


def backend_pid(url: str) -> int:
    with session_scope(url) as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate_backend(admin: psycopg.Connection, pid: int) -> None:
    """Terminate a server backend and wait (at most 5 s) until it is gone: termination is asynchronous."""
    assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    deadline = time.monotonic() + 5.0
    while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_connection_the_server_closed_is_replaced_at_checkout(pg_url: str) -> None:
    dispose_engines()
    first = backend_pid(pg_url)
    assert backend_pid(pg_url) == first  # the pool hands back the same healthy connection
    with psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        terminate_backend(admin, first)
    replaced = backend_pid(pg_url)  # would raise OperationalError if the dead connection were used
    assert replaced != first
    dispose_engines()


def test_healthy_checkouts_send_nothing_before_the_transaction(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dispose_engines()
    engine = get_engine(pg_url)
    statements: list[str] = []
    pings: list[object] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: statements.append(statement))
    monkeypatch.setattr(engine.dialect, "do_ping", lambda connection: pings.append(connection) or True)
    for _ in range(3):
        with session_scope(pg_url) as session:
            session.execute(text("SELECT 42")).scalar_one()
    assert statements == ["SELECT 42"] * 3 and pings == []  # no pre-ping round trip per checkout
    with engine.connect() as connection:
        assert server_closed(connection.connection.dbapi_connection) is False
    dispose_engines()


def test_run_sql_raises_sqlalchemy_errors_and_drops_a_dead_connection(pg_url: str) -> None:
    dispose_engines()
    with session_scope(pg_url) as session:
        assert run_sql(session, "SELECT %(a)s::int + 1, 'x'", {"a": 41}).one() == (42, "x")
        assert run_sql(session, "SELECT 1 WHERE false", {}).first() is None
    with pytest.raises(exc.IntegrityError):
        with session_scope(pg_url) as session:
            run_sql(session, "CREATE TEMP TABLE unique_ids (id int PRIMARY KEY)", {})
            run_sql(session, "INSERT INTO unique_ids VALUES (1), (1)", {})
    first = backend_pid(pg_url)
    with pytest.raises(exc.OperationalError) as raised:
        with session_scope(pg_url) as session:
            with psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
                assert run_sql(session, "SELECT pg_backend_pid()", {}).scalar_one() == first
                terminate_backend(admin, first)
            run_sql(session, "SELECT 1", {})
    assert raised.value.connection_invalidated
    assert backend_pid(pg_url) != first  # the dead connection was not pooled again
    dispose_engines()


def test_statement_observers_see_run_sql_statements(pg_url: str) -> None:
    seen: list[str] = []
    with observing_statements(seen.append):
        with session_scope(pg_url) as session:
            run_sql(session, "SELECT 7", {})
        with sql_transaction(pg_url) as sql:
            run_sql(sql, "SELECT 9", {})
        with sql_transaction(pg_url, autocommit=True) as sql:
            run_sql(sql, "SELECT 10", {})
    with session_scope(pg_url) as session:
        run_sql(session, "SELECT 8", {})
    assert seen == ["SELECT 7", "SELECT 9", "COMMIT", "SELECT 10"]


def test_sql_transaction_commits_together_or_not_at_all(pg_url: str) -> None:
    dispose_engines()
    with sql_transaction(pg_url) as sql:
        run_sql(sql, "CREATE TABLE notes (id int PRIMARY KEY)", {})
        run_sql(sql, "INSERT INTO notes VALUES (1)", {})
    with pytest.raises(exc.IntegrityError):
        with sql_transaction(pg_url) as sql:
            run_sql(sql, "INSERT INTO notes VALUES (2)", {})
            run_sql(sql, "INSERT INTO notes VALUES (1)", {})
    with pytest.raises(RuntimeError):
        with sql_transaction(pg_url) as sql:
            run_sql(sql, "INSERT INTO notes VALUES (3)", {})
            raise RuntimeError("the caller failed after a statement")
    with sql_transaction(pg_url) as sql:
        run_sql(sql, "INSERT INTO notes VALUES (4)", {})
        sql.rollback()
    with session_scope(pg_url) as session:
        assert [row[0] for row in run_sql(session, "SELECT id FROM notes ORDER BY id", {})] == [1]
    dispose_engines()


def test_autocommit_commits_each_statement_and_the_pooled_connection_is_transactional_again(pg_url: str) -> None:
    dispose_engines()
    with sql_transaction(pg_url) as sql:
        run_sql(sql, "CREATE TABLE notes (id int PRIMARY KEY)", {})
    with pytest.raises(exc.IntegrityError):
        with sql_transaction(pg_url, autocommit=True) as sql:
            pid = run_sql(sql, "SELECT pg_backend_pid()", {}).scalar_one()
            run_sql(sql, "INSERT INTO notes VALUES (1)", {})
            run_sql(sql, "INSERT INTO notes VALUES (1)", {})
    with pytest.raises(RuntimeError):
        with sql_transaction(pg_url) as sql:  # the same pooled connection, in a transaction again
            assert run_sql(sql, "SELECT pg_backend_pid()", {}).scalar_one() == pid
            assert sql.dbapi_connection.autocommit is False
            run_sql(sql, "INSERT INTO notes VALUES (2)", {})
            raise RuntimeError("roll back")
    with session_scope(pg_url) as session:
        assert [row[0] for row in run_sql(session, "SELECT id FROM notes ORDER BY id", {})] == [1]
    dispose_engines()


def test_sql_transaction_drops_a_connection_the_server_closed(pg_url: str) -> None:
    dispose_engines()
    with sql_transaction(pg_url, autocommit=True) as sql:
        first = run_sql(sql, "SELECT pg_backend_pid()", {}).scalar_one()
    with psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        with pytest.raises(exc.OperationalError) as raised:
            with sql_transaction(pg_url) as sql:
                assert run_sql(sql, "SELECT pg_backend_pid()", {}).scalar_one() == first
                terminate_backend(admin, first)
                run_sql(sql, "SELECT 1", {})
    assert raised.value.connection_invalidated
    with sql_transaction(pg_url, autocommit=True) as sql:
        assert run_sql(sql, "SELECT pg_backend_pid()", {}).scalar_one() != first
    dispose_engines()
