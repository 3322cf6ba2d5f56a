"""Error classes, classified where they arise (never by matching strings in the core)."""

from __future__ import annotations

MAX_ERROR_CHARS = 2000
"""Longest error text stored on a claim, an outer step or a run."""


def bounded_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text` cut to `limit` characters, ending in "..." when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_error(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """`Type: message`, one line, bounded: what the records keep about the exception that ended an attempt."""
    return bounded_text(" ".join(f"{type(exc).__name__}: {exc}".split()), limit)


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


class PlatformFault(MetarlError):
    """Infrastructure failed, not the agent's job: an artifact a stage cannot read, a missing or disagreeing
    hidden-eval secret, an unreachable store. Never an episode failure: retried, then the run pauses with the cause."""

    retryable = True
    """False when retrying on the same deployment cannot help (a config fault): the run pauses at once."""


class ArtifactStoreUnavailable(PlatformFault):
    """The artifact store could not be read or written (unreachable, refused, a digest that does not match)."""


class ArtifactMissing(PlatformFault):
    """An artifact a stage needs is not in the store."""


class ArtifactStoreNotShared(PlatformFault):
    """A local-folder artifact root read from a host that does not share it."""

    retryable = False


class HiddenEvalSecretFault(PlatformFault):
    """This host has no hidden-eval secret, or not the one the run's other hosts hold."""

    retryable = False
