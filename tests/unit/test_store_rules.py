"""Pure rules of the store's orchestrator side: reconciler cutoffs, the run lock's key, how database errors are told."""

from __future__ import annotations

import datetime as dt

import psycopg
from sqlalchemy import exc

from metarl.store.db import DATABASE_UNREACHABLE, unreachable_reason
from metarl.store.reconcile import redispatch_cutoffs
from metarl.store.run_lock import run_lock_key
from metarl.store.status import driver_error_line

NOW = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


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
