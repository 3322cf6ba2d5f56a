"""Exit codes of the `metarl` command, and the one-line errors that end a command with one."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metarl.store import RunIdError

EXIT_CONFIG_ERROR = 2
EXIT_NOT_FOUND = 3
EXIT_BUSY = 4
EXIT_FAILED_RUN = 1


def run_id_refused(err: RunIdError) -> int:
    """Say why a typed run id names no single run; the exit code (not found, or a usage error for an ambiguous prefix)."""
    print(f"error: {err.message()}", file=sys.stderr)
    return EXIT_NOT_FOUND if err.kind == "unknown" else EXIT_CONFIG_ERROR


def no_such_run(run_id: str) -> int:
    """Say that there is no run with this id (escaped for the terminal); the exit code."""
    from schemas.config_error import printable

    print(f"error: no run with id {printable(run_id)}; `metarl status` lists runs", file=sys.stderr)
    return EXIT_NOT_FOUND
