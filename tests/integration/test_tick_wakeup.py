"""Workers wake the orchestrator through PostgreSQL LISTEN/NOTIFY (real server): only on commit,
only for its own run, and with the tick interval as the fallback when the database is away."""

from __future__ import annotations

import threading
import time

from metarl.store.db import session_scope
from metarl.store.tick_wakeup import TickWaiter, request_tick

RUN = "0a1b2c3d-0000-4000-8000-000000000001"


def later(delay_s: float, action) -> threading.Thread:  # type: ignore[no-untyped-def]
    def run() -> None:
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def timed_wait(waiter: TickWaiter, timeout_s: float, stop: threading.Event | None = None) -> tuple[bool, float]:
    started = time.monotonic()
    woken = waiter.wait(timeout_s, stop or threading.Event())
    return woken, time.monotonic() - started


def test_a_committed_request_wakes_the_runs_orchestrator_early(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN)
    try:
        assert not timed_wait(waiter, 0.2)[0]  # connects and listens; nothing asked yet

        def commit_request() -> None:
            with session_scope(pg_url) as session:
                request_tick(session, RUN)

        later(0.3, commit_request)
        woken, waited = timed_wait(waiter, 5.0)
        assert woken and waited < 2.0, waited
        assert waiter.wakeups == 1
    finally:
        waiter.close()


def test_rolled_back_and_other_runs_requests_do_not_wake_it(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN)
    try:
        timed_wait(waiter, 0.1)

        def rolled_back_request() -> None:
            with session_scope(pg_url) as session:
                request_tick(session, RUN)
                session.rollback()

        def other_runs_request() -> None:
            with session_scope(pg_url) as session:
                request_tick(session, "ffffffff-0000-4000-8000-000000000002")

        later(0.2, rolled_back_request)
        later(0.4, other_runs_request)
        woken, waited = timed_wait(waiter, 1.2)
        assert not woken and waited >= 1.1
    finally:
        waiter.close()


def test_requests_queued_during_a_tick_give_one_early_tick(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN)
    try:
        timed_wait(waiter, 0.1)
        for _ in range(5):  # five groups completing while the orchestrator was busy ticking
            with session_scope(pg_url) as session:
                request_tick(session, RUN)
        time.sleep(0.5)  # the tick itself: the server delivers the five meanwhile (a loaded machine can take a while)
        assert timed_wait(waiter, 2.0)[0]
        woken, waited = timed_wait(waiter, 0.8)
        assert not woken and waited >= 0.7, "the queued requests should have been answered by the one tick"
    finally:
        waiter.close()


def test_requests_sooner_than_the_gap_after_an_early_tick_wait_for_the_gap_and_share_one_tick(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN, min_gap_s=0.5)
    try:
        timed_wait(waiter, 0.1)
        with session_scope(pg_url) as session:
            request_tick(session, RUN)
        assert timed_wait(waiter, 2.0)[0]
        for delay_s in (0.05, 0.15):  # two more groups complete right after that tick
            later(delay_s, lambda: request_tick_now(pg_url))
        woken, waited = timed_wait(waiter, 2.0)
        assert woken and 0.4 <= waited < 1.5, waited  # held to the end of the gap
        woken, waited = timed_wait(waiter, 0.8)
        assert not woken and waited >= 0.7, "both requests should have been answered by the one held tick"
    finally:
        waiter.close()


def request_tick_now(pg_url: str, *, urgent: bool = False) -> None:
    with session_scope(pg_url) as session:
        request_tick(session, RUN, urgent=urgent)


def test_an_urgent_request_is_not_held_by_the_gap(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN, min_gap_s=1.0)
    try:
        timed_wait(waiter, 0.1)
        request_tick_now(pg_url)
        assert timed_wait(waiter, 2.0)[0]
        later(0.05, lambda: request_tick_now(pg_url, urgent=True))  # a policy version published right after that tick
        woken, waited = timed_wait(waiter, 3.0)
        assert woken and waited < 0.6, waited
    finally:
        waiter.close()


def test_an_urgent_request_ends_the_hold_of_a_gapped_one(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN, min_gap_s=1.5)
    try:
        timed_wait(waiter, 0.1)
        request_tick_now(pg_url)
        assert timed_wait(waiter, 2.0)[0]
        later(0.05, lambda: request_tick_now(pg_url))  # a group completes: held to the end of the gap...
        later(0.3, lambda: request_tick_now(pg_url, urgent=True))  # ...until a version is published
        woken, waited = timed_wait(waiter, 3.0)
        assert woken and 0.25 <= waited < 1.0, waited
        woken, waited = timed_wait(waiter, 0.5)
        assert not woken, "the held request should have been answered by the urgent tick"
    finally:
        waiter.close()


def test_another_runs_urgent_request_does_not_wake_it(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN)
    try:
        timed_wait(waiter, 0.1)

        def other_runs_urgent_request() -> None:
            with session_scope(pg_url) as session:
                request_tick(session, "ffffffff-0000-4000-8000-000000000002", urgent=True)

        later(0.2, other_runs_urgent_request)
        woken, waited = timed_wait(waiter, 0.8)
        assert not woken and waited >= 0.7
    finally:
        waiter.close()


def test_a_stop_request_ends_the_wait(pg_url: str) -> None:
    waiter = TickWaiter(pg_url, RUN)
    stop = threading.Event()
    try:
        later(0.3, stop.set)
        woken, waited = timed_wait(waiter, 10.0, stop)
        assert not woken and waited < 2.0
    finally:
        waiter.close()


def test_without_a_database_it_waits_the_tick_interval(pg_url: str) -> None:
    waiter = TickWaiter("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", RUN)
    woken, waited = timed_wait(waiter, 0.6)
    assert not woken and 0.55 <= waited < 3.0
    assert waiter.connection is None and waiter.failed_at is not None
