"""Pure rules of the outer-step claim: heartbeat interval, crash-loop cap, transient retries, error text."""

from __future__ import annotations

import pytest

from metarl.errors import MAX_ERROR_CHARS, PermanentBackendError, TransientBackendError, describe_error
from metarl.interfaces import OuterResult
from workers.heartbeat import heartbeat_interval
from workers.outer import (
    crash_loop_message,
    crash_looping,
    update_with_retries,
)


def test_heartbeat_interval_beats_three_times_per_lease_but_not_too_often() -> None:
    assert heartbeat_interval(30.0) == 10.0
    assert heartbeat_interval(1.0) == 0.5
    for lease in (1.0, 1.5, 2.0, 60.0, 3600.0):
        assert heartbeat_interval(lease) < lease


def test_crash_loop_cap_matches_the_stage_rule() -> None:
    assert not crash_looping(0, 3)
    assert not crash_looping(3, 3)
    assert crash_looping(4, 3)
    assert crash_looping(2, 1)


def test_crash_loop_message_names_step_count_cap_and_last_error() -> None:
    message = crash_loop_message(7, 4, 3, "MemoryError: out of memory")
    assert "outer step 7" in message and "4 times" in message and "max_stage_attempts = 3" in message
    assert message.endswith("last error: MemoryError: out of memory")
    assert "last error" not in crash_loop_message(7, 4, 3, None)


def test_describe_error_is_one_bounded_line() -> None:
    assert describe_error(ValueError("bad\n  value")) == "ValueError: bad value"
    long = describe_error(RuntimeError("x" * 10_000))
    assert len(long) == MAX_ERROR_CHARS and long.endswith("...")


def test_update_with_retries_retries_transient_errors_then_gives_up() -> None:
    slept: list[float] = []
    calls = {"n": 0}

    def flaky() -> OuterResult:
        calls["n"] += 1
        if calls["n"] < 3:
            raise TransientBackendError("503")
        return OuterResult(state_uri="s", metrics={})

    assert update_with_retries(flaky, 3, sleep=slept.append).state_uri == "s"
    assert calls["n"] == 3 and slept == [1.0, 4.0]

    def always() -> OuterResult:
        raise TransientBackendError("timeout")

    slept.clear()
    with pytest.raises(PermanentBackendError, match="gave up after 2 transient errors: TransientBackendError: timeout"):
        update_with_retries(always, 2, sleep=slept.append)
    assert slept == [1.0]


def test_update_with_retries_lets_other_errors_through_at_once() -> None:
    def broken() -> OuterResult:
        raise PermanentBackendError("auth")

    slept: list[float] = []
    with pytest.raises(PermanentBackendError, match="auth"):
        update_with_retries(broken, 5, sleep=slept.append)
    assert slept == []


def test_the_lease_renewed_first_is_the_one_due_first() -> None:
    from workers.heartbeat import LeaseKeeper, next_due

    early, late = (
        LeaseKeeper("postgresql://unused", lambda session: True, interval_s=1.0),
        LeaseKeeper("postgresql://unused", lambda session: True, interval_s=1.0),
    )
    assert next_due({late: 12.0, early: 10.5}) == (early, 10.5)
    assert next_due({}) == (None, float("inf"))
