"""Wake a run's orchestrator as soon as a tick has work, instead of at its next `window.tick_s`.

Work for a tick appears when a group of episodes completes (an outer step can be batched, window
slots free up) and when an outer update publishes a new policy version (the next step can start).
The transaction that makes the change also sends ``pg_notify(CHANNEL, payload)``; PostgreSQL
delivers it only if that transaction commits. The payload is the run id for a group (such requests
come in bursts and are answered together, at most one early tick per `MIN_WAKEUP_GAP_S`), and the
run id with `URGENT_SUFFIX` for a published version: only one outer step runs at a time, so the
next one waits on that tick, and it comes at once (at most one per outer update). The orchestrator LISTENs on its own connection and
ticks when a notification for its run arrives, or when `tick_s` passes, whichever is first: the
tick interval stays the fallback, so a lost notification (a listener reconnecting after a
database outage) only delays a tick.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Literal

import psycopg

from metarl.store.db import SqlTarget, run_sql
from metarl.store.migration_head import libpq_uri

log = logging.getLogger("metarl.orchestrator")

CHANNEL = "metarl_tick"
NOTIFY_SQL = "SELECT pg_notify('metarl_tick', %(payload)s)"
URGENT_SUFFIX = ":now"
"""Appended to the run id of a request that skips the gap between early ticks (a published policy version)."""
WAIT_SLICE_S = 0.25
"""Longest block on the listener at a time, so a stop request is seen within this."""
RECONNECT_AFTER_S = 5.0
DRAIN_S = 0.001
"""How long to look for notifications already queued (psycopg reads a timeout of 0 as none)."""
MIN_WAKEUP_GAP_S = 0.1
"""Least time between two early ticks: requests arriving sooner after one are answered together, by one tick at the end of the gap."""


def tick_payload(run_id: str, *, urgent: bool = False) -> str:
    """The notification payload of a tick request for this run (pure)."""
    return run_id + URGENT_SUFFIX if urgent else run_id


def request_tick(session: SqlTarget, run_id: str, *, urgent: bool = False) -> None:
    """Ask the run's orchestrator for a tick once the caller's transaction commits; `urgent` skips the gap between early ticks."""
    run_sql(session, NOTIFY_SQL, {"payload": tick_payload(run_id, urgent=urgent)})


Wake = Literal["gapped", "urgent"]


def wake_of(payload: str, run_id: str) -> Wake | None:
    """What a notification asks of this run's orchestrator: nothing (another run's), a gapped or an urgent tick (pure)."""
    if payload == run_id:
        return "gapped"
    if payload == run_id + URGENT_SUFFIX:
        return "urgent"
    return None


class TickWaiter:
    """Waits up to a tick interval, returning early when the run's orchestrator is asked for a tick."""

    def __init__(self, database_url: str, run_id: str, min_gap_s: float = MIN_WAKEUP_GAP_S):
        self.conninfo = libpq_uri(database_url)
        self.run_id = run_id
        self.min_gap_s = min_gap_s
        self.connection: psycopg.Connection | None = None
        self.failed_at: float | None = None
        self.woken_at = float("-inf")
        self.wakeups = 0

    def _listen(self) -> psycopg.Connection | None:
        if self.connection is not None:
            return self.connection
        if self.failed_at is not None and time.monotonic() - self.failed_at < RECONNECT_AFTER_S:
            return None
        try:
            self.connection = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
            self.connection.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as err:
            self._drop(err)
            return None
        self.failed_at = None
        return self.connection

    def _drop(self, err: psycopg.Error) -> None:
        if self.failed_at is None:
            log.info("tick wake-ups off until the database answers again (%s); ticking every tick_s", type(err).__name__)
        self.failed_at = time.monotonic()
        if self.connection is not None:
            self.connection.close()
        self.connection = None

    def wait(self, timeout_s: float, stop_event: threading.Event) -> bool:
        """Block until a tick is requested for this run (True), `timeout_s` passes or `stop_event` is set (False).

        A gapped request within `min_gap_s` of the last early return is held until the gap has
        passed (or an urgent request arrives), and the requests that arrive meanwhile are answered
        with it. An urgent request returns at once.
        """
        deadline = time.monotonic() + timeout_s
        while not stop_event.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            connection = self._listen()
            if connection is None:
                stop_event.wait(min(left, WAIT_SLICE_S))
                continue
            try:
                woken = self._next_wake(connection, min(left, WAIT_SLICE_S), urgent_only=False)
                if woken == "gapped":
                    held_until = min(self.woken_at + self.min_gap_s, deadline)
                    while (held_s := held_until - time.monotonic()) > 0 and self._next_wake(connection, held_s, urgent_only=True) is None:
                        pass
                    if stop_event.is_set():
                        return False
                if woken is not None:
                    self._drain(connection)
            except psycopg.Error as err:
                self._drop(err)
                continue
            if woken is not None:
                self.wakeups += 1
                self.woken_at = time.monotonic()
                return True
        return False

    def _next_wake(self, connection: psycopg.Connection, timeout_s: float, *, urgent_only: bool) -> Wake | None:
        """Read notifications for up to `timeout_s`; the first wake for this run (only an urgent one with `urgent_only`).

        The generator is closed before returning: while it is open it holds the connection.
        """
        notifications = connection.notifies(timeout=timeout_s)
        try:
            for notification in notifications:
                wake = wake_of(notification.payload, self.run_id)
                if wake == "urgent" or (wake is not None and not urgent_only):
                    return wake
            return None
        finally:
            notifications.close()

    def _drain(self, connection: psycopg.Connection) -> None:
        """Consume notifications already queued: one tick answers all of them."""
        for _ in connection.notifies(timeout=DRAIN_S):
            pass

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None
