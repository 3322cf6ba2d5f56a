"""The one retry backoff: how long to wait after the n-th failure in a row, as a pure function of a frozen policy."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_EXPONENT = 64
"""Failures past this many grow the delay no further (it is long capped by then); keeps the power finite."""


class Backoff(BaseModel):
    """Exponential backoff: `first_s` after the first failure, `factor` times longer after each further one, at most `max_s`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first_s: float = Field(ge=0.0, le=3600.0, description="Wait after the first failure")
    factor: float = Field(default=2.0, ge=1.0, le=100.0, description="Growth of the wait per further failure in a row")
    max_s: float = Field(ge=0.0, le=3600.0, description="Longest wait")


def backoff_delay(backoff: Backoff, failures: int) -> float:
    """Seconds to wait after the `failures`-th failure in a row (1-based; 0 or less counts as the first)."""
    exponent = min(max(failures, 1) - 1, MAX_EXPONENT)
    return min(backoff.max_s, backoff.first_s * backoff.factor**exponent)


WORKER_BACKOFF = Backoff(first_s=1.0, factor=4.0, max_s=60.0)
"""Retries of a transient backend error by the stage and outer workers: 1, 4, 16, then 60 s."""
