"""Keep a claim alive while its work runs; notice when another worker took it over."""

from __future__ import annotations

import threading
from types import TracebackType

from sqlalchemy.exc import OperationalError

from metarl.claims import Claim, heartbeat
from metarl.db import session_scope


class Heartbeater:
    """Background thread renewing a claim every `interval_s` seconds."""

    def __init__(self, database_url: str, claim: Claim, interval_s: float):
        self.database_url = database_url
        self.claim = claim
        self.interval_s = interval_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{claim.claim_id}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with session_scope(self.database_url) as session:
                    if not heartbeat(session, self.claim):
                        self.lost.set()
                        return
            except OperationalError:
                continue

    def __enter__(self) -> "Heartbeater":
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
