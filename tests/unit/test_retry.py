"""The one retry backoff (metarl.domain.retry): the Runpod edge's and the workers' waits between tries."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from metarl.backends.runpod.provider import RetryPolicy
from metarl.domain.retry import WORKER_BACKOFF, Backoff, backoff_delay


def test_backoff_grows_by_its_factor_and_is_capped() -> None:
    backoff = Backoff(first_s=0.5, factor=2.0, max_s=3.0)
    assert [backoff_delay(backoff, n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_delay(backoff, 0) == backoff_delay(backoff, -3) == 0.5  # no failure yet counts as the first


def test_backoff_stays_finite_after_very_many_failures() -> None:
    assert backoff_delay(Backoff(first_s=1.0, factor=100.0, max_s=60.0), 10**9) == 60.0
    assert backoff_delay(Backoff(first_s=0.0, factor=100.0, max_s=60.0), 10**9) == 0.0


def test_the_workers_wait_1_4_16_then_60_seconds() -> None:
    assert [backoff_delay(WORKER_BACKOFF, n) for n in (1, 2, 3, 4, 5, 50)] == [1.0, 4.0, 16.0, 60.0, 60.0, 60.0]


def test_the_runpod_edge_doubles_its_configured_backoff() -> None:
    policy = RetryPolicy(backoff_s=1.0, max_backoff_s=15.0)
    assert [backoff_delay(policy.backoff, n) for n in (1, 2, 3, 4, 5, 6)] == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


def test_backoff_is_a_frozen_bounded_value() -> None:
    with pytest.raises(ValidationError):
        Backoff(first_s=1.0, factor=0.5, max_s=2.0)  # a factor below 1 would shrink the waits
    with pytest.raises(ValidationError):
        Backoff(first_s=-1.0, max_s=2.0)
    with pytest.raises(ValidationError):
        WORKER_BACKOFF.first_s = 0.0  # type: ignore[misc]
