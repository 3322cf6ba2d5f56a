"""Pooled connections: one the server closed is replaced at checkout, with no round trip on healthy ones."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import event, text

from metarl.db import dispose_engines, get_engine, normalise_url, server_closed, session_scope


def backend_pid(url: str) -> int:
    with session_scope(url) as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_connection_the_server_closed_is_replaced_at_checkout(pg_url: str) -> None:
    dispose_engines()
    first = backend_pid(pg_url)
    assert backend_pid(pg_url) == first  # the pool hands back the same healthy connection
    with psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (first,)).fetchone()[0]
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
