"""Keep a claim alive while its work runs; notice when another worker took it over.

A :class:`LeaseKeeper` renews any lease (a stage claim, an outer step) while the work runs in the
task's own thread; :class:`Heartbeater` is the one for stage claims. The renewals of every lease
of a process are made by one background thread (:class:`Renewals`), not a thread per lease: most
stage messages end long before their first beat, and starting and joining a thread for each of
them cost more than the bookkeeping they guard.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self

from metarl.store import Claim, StoreError, renew_claim

MIN_HEARTBEAT_INTERVAL_S = 0.5
BEATS_PER_LEASE = 3


def heartbeat_interval(lease_s: float) -> float:
    """Seconds between renewals: three per lease, so two missed beats still keep the claim; at most two a second."""
    return max(MIN_HEARTBEAT_INTERVAL_S, lease_s / BEATS_PER_LEASE)


def next_due(due: dict[LeaseKeeper, float]) -> tuple[LeaseKeeper | None, float]:
    """The lease to renew first and when (pure; (None, inf) when there is none)."""
    if not due:
        return None, float("inf")
    keeper = min(due, key=due.__getitem__)
    return keeper, due[keeper]


class Renewals:
    """The process's renewal thread: each registered lease is renewed every `interval_s` seconds until it is removed or lost.

    One renewal runs at a time. Removing a lease waits for its renewal in progress, so none runs
    after the lease's block has ended.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: dict[LeaseKeeper, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._changed:
            self._due[keeper] = time.monotonic() + keeper.interval_s
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="lease-renewals", daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._changed:
            keeper.ended = True
            self._due.pop(keeper, None)
        with keeper.renewing:  # a renewal already under way finishes first
            pass

    def _loop(self) -> None:
        while True:
            with self._changed:
                keeper, at = next_due(self._due)
                wait_s = at - time.monotonic()
                if keeper is None or wait_s > 0:
                    self._changed.wait(None if keeper is None else wait_s)
                    continue
                self._due[keeper] = time.monotonic() + keeper.interval_s
                keeper.renewing.acquire()  # taken under the lock: `remove` then waits for this renewal
            renewed = False
            try:
                renewed = keeper.ended or keeper.beat()
            finally:  # a lease that was lost (or whose renewal raised) is due no more
                if not renewed:
                    with self._changed:
                        self._due.pop(keeper, None)
                keeper.renewing.release()


_renewals: dict[int, Renewals] = {}


def process_renewals() -> Renewals:
    """This process's renewal thread (a forked pool process gets its own: threads do not survive a fork)."""
    pid = os.getpid()
    renewals = _renewals.get(pid)
    if renewals is None:
        _renewals.clear()
        renewals = _renewals[pid] = Renewals()
    return renewals


class LeaseKeeper:
    """Renews a lease with `renew(database_url)` (a store function: one statement) every `interval_s` seconds while the block runs.

    `renew` returns False when the lease is no longer ours (taken over, finished elsewhere): then
    `lost` is set and renewals stop. A database that is briefly unreachable is retried at the next
    beat; the caller's own compare-and-set at the end decides what counts.
    """

    def __init__(self, database_url: str, renew: Callable[[str], bool], interval_s: float):
        self.database_url = database_url
        self.renew = renew
        self.interval_s = interval_s
        self.lost = threading.Event()
        self.beats = 0
        self.ended = False
        self.renewing = threading.Lock()

    def beat(self) -> bool:
        """Renew once; False when the lease was lost (no more beats are due)."""
        try:
            renewed = self.renew(self.database_url)
        except StoreError:  # the database is away or dropped the connection: try again at the next beat
            return True
        if not renewed:
            self.lost.set()
            return False
        self.beats += 1
        return True

    def __enter__(self) -> Self:
        process_renewals().add(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        process_renewals().remove(self)


class Heartbeater(LeaseKeeper):
    """Renews a stage claim every `interval_s` seconds while its work runs."""

    def __init__(self, database_url: str, claim: Claim, interval_s: float):
        super().__init__(database_url, lambda url: renew_claim(url, claim), interval_s)
        self.claim = claim
