"""The process's one renewal thread: every lease is renewed while its block runs, never after it, and a lost lease stops."""

from __future__ import annotations

import threading
import time

from workers.heartbeat import LeaseKeeper


class CountingKeeper(LeaseKeeper):
    """A lease whose renewal is counted instead of sent (and is lost at call `lose_at`, or takes `slow_s`)."""

    def __init__(self, interval_s: float, lose_at: int | None = None, slow_s: float = 0.0):
        super().__init__("postgresql://unused", lambda session: True, interval_s)
        self.calls = 0
        self.lose_at = lose_at
        self.slow_s = slow_s
        self.in_beat = threading.Event()

    def beat(self) -> bool:
        self.in_beat.set()
        time.sleep(self.slow_s)
        self.calls += 1
        self.in_beat.clear()
        if self.lose_at is not None and self.calls >= self.lose_at:
            self.lost.set()
            return False
        return True


def test_leases_are_renewed_while_their_blocks_run_and_not_after() -> None:
    short, long = CountingKeeper(0.05), CountingKeeper(0.05)
    with long:
        with short:
            time.sleep(0.4)
        ended_at = short.calls
        time.sleep(0.3)
    assert ended_at >= 3 and short.calls == ended_at, "renewed after its block ended"
    assert long.calls >= 8 and not long.lost.is_set()


def test_a_lost_lease_sets_lost_and_is_renewed_no_more() -> None:
    keeper = CountingKeeper(0.05, lose_at=2)
    with keeper:
        assert keeper.lost.wait(2.0)
        time.sleep(0.3)
    assert keeper.calls == 2


def test_ending_a_block_waits_for_its_renewal_under_way() -> None:
    keeper = CountingKeeper(0.05, slow_s=0.3)
    with keeper:
        assert keeper.in_beat.wait(2.0)
    assert keeper.calls == 1 and not keeper.in_beat.is_set(), "the block ended while its renewal was still running"


def test_a_block_shorter_than_the_interval_is_never_renewed() -> None:
    keepers = [CountingKeeper(0.5) for _ in range(50)]
    for keeper in keepers:
        with keeper:
            pass
    time.sleep(0.6)
    assert all(keeper.calls == 0 for keeper in keepers)


def test_a_renewal_the_database_failed_is_tried_again_and_a_refused_one_loses_the_lease() -> None:
    from metarl.store.errors import StoreError

    asked: list[str] = []
    answers: list[object] = [StoreError("the database went away"), True, False]

    def renew(url: str) -> bool:
        asked.append(url)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    keeper = LeaseKeeper("postgresql://db", renew, interval_s=1.0)
    assert keeper.beat() and not keeper.lost.is_set() and keeper.beats == 0, "a failed renewal is tried at the next beat"
    assert keeper.beat() and keeper.beats == 1
    assert not keeper.beat() and keeper.lost.is_set(), "a renewal the store refused means the lease was taken over"
    assert asked == ["postgresql://db"] * 3
