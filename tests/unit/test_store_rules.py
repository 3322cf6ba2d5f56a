"""Pure rules of the store's orchestrator and bench side: reconciler cutoffs, the run lock's key, how database errors are told, copy statements."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest
from sqlalchemy import exc

from metarl.store.db import DATABASE_UNREACHABLE, unreachable_reason
from metarl.store.reconcile import redispatch_cutoffs
from metarl.store.records import OuterStep, ProbeAttempt
from metarl.store.replicate import COPIES, SHIFTED, copy_statement, table_of
from metarl.store.run_lock import run_lock_key
from metarl.store.server import quoted_name
from metarl.store.status import driver_error_line

NOW = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_a_pass_resends_unclaimed_work_dispatched_longer_ago_than_the_redispatch_delay_and_claims_silent_for_a_lease() -> None:
    cutoffs = redispatch_cutoffs(NOW, redispatch_after_s=30.0, lease_s=90.0, startup=False)
    assert cutoffs.unclaimed_before == NOW - dt.timedelta(seconds=30)
    assert cutoffs.stale_before == NOW - dt.timedelta(seconds=90)


def test_at_startup_every_unclaimed_item_is_resent_but_a_live_claim_still_gets_its_lease() -> None:
    cutoffs = redispatch_cutoffs(NOW, redispatch_after_s=30.0, lease_s=90.0, startup=True)
    assert cutoffs.unclaimed_before == NOW
    assert cutoffs.stale_before == NOW - dt.timedelta(seconds=90)


def test_a_run_lock_key_is_a_postgres_bigint_fixed_by_the_run_id() -> None:
    highest = run_lock_key("ffffffff-ffff-ffff-ffff-ffffffffffff")
    assert 0 <= highest < 2**63
    run = "0d8a3f6e-1c2b-4e5f-9a7b-3c4d5e6f7a8b"
    assert run_lock_key(run) == run_lock_key(run)
    assert run_lock_key(run) != run_lock_key("1d8a3f6e-1c2b-4e5f-9a7b-3c4d5e6f7a8b")


def test_an_unreachable_database_is_told_by_the_driver_error_and_a_bounded_message() -> None:
    err = exc.OperationalError("SELECT 1", {}, psycopg.OperationalError("  server closed the connection unexpectedly  "))
    assert isinstance(err, DATABASE_UNREACHABLE)
    assert unreachable_reason(err) == "OperationalError: server closed the connection unexpectedly"
    long = exc.InterfaceError("SELECT 1", {}, psycopg.InterfaceError("x" * 500))
    assert isinstance(long, DATABASE_UNREACHABLE)
    assert unreachable_reason(long) == "InterfaceError: " + "x" * 200


def test_a_driver_error_is_told_in_its_first_line_or_by_its_type() -> None:
    assert driver_error_line(psycopg.OperationalError('connection failed: Connection refused\n\tIs the server running on "127.0.0.1"?')) == (
        "connection failed: Connection refused"
    )
    assert driver_error_line(psycopg.OperationalError("")) == "OperationalError"


def test_a_copy_takes_every_column_of_the_record_and_changes_only_the_named_ones() -> None:
    table = table_of(ProbeAttempt)
    statement = copy_statement(table, {"id": "id + :o", "episode_id": "episode_id + :oe"})
    inserted, selected = statement.removeprefix("INSERT INTO probe_attempts (").split(") SELECT ")
    columns = [column.name for column in table.c]
    assert inserted.split(", ") == columns and "isolation" in columns
    values, source = selected.rsplit(" FROM ", 1)
    assert source == "t_probe_attempts"
    assert values.split(", ") == ["id + :o" if c == "id" else "episode_id + :oe" if c == "episode_id" else c for c in columns]


def test_a_shifted_column_names_itself_and_an_unknown_column_is_refused() -> None:
    statement = copy_statement(table_of(OuterStep), {"step": SHIFTED})
    assert ", step + :shift, " in statement
    with pytest.raises(ValueError, match="outer_steps has no column"):
        copy_statement(table_of(OuterStep), {"steps": SHIFTED})


def test_every_copied_table_names_only_its_own_columns_and_gets_new_ids() -> None:
    for table, changed in COPIES:
        assert changed["id"] == "id + :o"
        copy_statement(table, changed)


def test_a_database_name_is_quoted_as_an_identifier() -> None:
    assert quoted_name("metarl_bench_1") == '"metarl_bench_1"'
    assert quoted_name('odd"name') == '"odd""name"'
