"""Keep a claim alive while its work runs; notice when another worker took it over.

A :class:`LeaseKeeper` renews any lease (a stage claim, an outer step) from a background thread
while the work runs in the task's own thread; :class:`Heartbeater` is the one for stage claims.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Self

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from metarl.claims import Claim, heartbeat
from metarl.db import session_scope

MIN_HEARTBEAT_INTERVAL_S = 0.5
BEATS_PER_LEASE = 3


def heartbeat_interval(lease_s: float) -> float:
    """Seconds between renewals: three per lease, so two missed beats still keep the claim; at most two a second."""
    return max(MIN_HEARTBEAT_INTERVAL_S, lease_s / BEATS_PER_LEASE)


class LeaseKeeper:
    """Background thread calling `renew(session)` every `interval_s` seconds until the block ends.

    `renew` returns False when the lease is no longer ours (taken over, finished elsewhere): the
    thread then sets `lost` and stops. A database that is briefly unreachable is retried at the
    next beat; the caller's own compare-and-set at the end decides what counts.
    """

    def __init__(self, database_url: str, renew: Callable[[Session], bool], interval_s: float, name: str = "lease"):
        self.database_url = database_url
        self.renew = renew
        self.interval_s = interval_s
        self.lost = threading.Event()
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{name}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with session_scope(self.database_url) as session:
                    if not self.renew(session):
                        self.lost.set()
                        return
            except OperationalError:
                continue
            self.beats += 1

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Heartbeater(LeaseKeeper):
    """Background thread renewing a stage claim every `interval_s` seconds."""

    def __init__(self, database_url: str, claim: Claim, interval_s: float):
        super().__init__(database_url, lambda session: heartbeat(session, claim), interval_s, name=str(claim.claim_id))
        self.claim = claim
