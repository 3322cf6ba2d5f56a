"""The error every bad config file raises, without pydantic: `metarl` catches it in every command, `metarl status` included.

`schemas.base` re-exports both names; the problems it carries are `schemas.base.FieldProblem` models (anything
of the :class:`Problem` shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Problem(Protocol):
    """One problem with one field: what :class:`ConfigError` needs of it."""

    field: str
    message: str
    fix: str

    def model_dump(self) -> dict[str, str]: ...


def printable(text: str) -> str:
    """Escape control and other non-printable characters (terminal escapes, NUL, lone surrogates)."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


class ConfigError(ValueError):
    """A config file (run config, task spec, job.toml) is invalid; carries one entry per bad field."""

    def __init__(self, source: str, problems: Sequence[Problem]):
        self.source = source
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{printable(self.source)}: {len(self.problems)} problem(s)"]
        for problem in self.problems:
            lines.append(f"  - {printable(problem.field)}: {printable(problem.message)}. Fix: {printable(problem.fix)}")
        return "\n".join(lines)

    def as_dicts(self) -> list[dict[str, str]]:
        return [problem.model_dump() for problem in self.problems]
