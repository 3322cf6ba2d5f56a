"""Error classes, classified where they arise (never by matching strings in the core)."""

from __future__ import annotations


class MetarlError(Exception):
    """Base of all metarl errors."""


class TransientBackendError(MetarlError):
    """A retryable failure at the edge (timeout, 5xx, 429, lost connection)."""


class CapacityError(MetarlError):
    """The backend has no capacity right now (no GPUs of that type); the orchestrator decides what next."""


class PermanentBackendError(MetarlError):
    """A failure that retrying will not fix (bad job, auth failure); recorded and the episode fails."""


class BudgetExceeded(MetarlError):
    """A dollar cap was reached."""


class RunNotFound(MetarlError):
    """No run with that id."""
