"""Run ids as users type them: a whole id or a unique prefix of one, resolved on a plain psycopg connection.

Every `metarl` command that takes a run id (status, resume, stop, report) resolves it with
:func:`resolve_run_id` before it reads or writes anything. It imports neither SQLAlchemy nor the
record models, so `metarl status RUN_ID` stays on its light path (`metarl.store.status`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from schemas.config_error import printable

if TYPE_CHECKING:
    import psycopg

RUN_ID_MAX_LENGTH = 36
"""`runs.id` is a UUID in its 36-character text form."""

SHOWN_MATCHES = 5
"""Ids listed in an ambiguous-prefix error."""

MATCHING_IDS_SQL = """
SELECT id FROM runs WHERE starts_with(lower(id), lower(%(prefix)s)) ORDER BY id = %(prefix)s DESC, created_at DESC, id LIMIT %(limit)s
"""
"""Runs whose id starts with the prefix, case-insensitively (ids are lower-case UUIDs): the run with exactly this id first, then newest first."""


class RunIdError(LookupError):
    """A run id that names no run, or a prefix shared by several runs."""

    def __init__(self, text: str, kind: Literal["unknown", "ambiguous"], matches: list[str]):
        self.text = text
        self.kind = kind
        self.matches = matches
        super().__init__(self.message())

    def message(self) -> str:
        """What went wrong and the fix, with the id escaped for the terminal."""
        shown = printable(self.text[:100])
        if self.kind == "unknown":
            return f"no run with id {shown}; `metarl status` lists runs"
        listed = ", ".join(self.matches[:SHOWN_MATCHES]) + (", ..." if len(self.matches) > SHOWN_MATCHES else "")
        return f"run id prefix {shown} is ambiguous: it starts the ids of several runs ({listed}); give more characters of the id"


def resolve_run_id(connection: psycopg.Connection, text: str) -> str:
    """The full id of the one run whose id is ``text`` or starts with it (case-insensitive).

    Raises :class:`RunIdError` ("unknown" when no run matches, and without a query for text that
    cannot start an id: empty, longer than an id, or with control characters; "ambiguous" when
    several runs match and none is ``text`` itself).
    """
    if not text or len(text) > RUN_ID_MAX_LENGTH or not text.isprintable():
        raise RunIdError(text, "unknown", [])
    rows = connection.execute(MATCHING_IDS_SQL, {"prefix": text, "limit": SHOWN_MATCHES + 1}).fetchall()
    matches = [str(row[0]) for row in rows]
    if text in matches:
        return text
    if len(matches) == 1:
        return matches[0]
    raise RunIdError(text, "ambiguous" if matches else "unknown", matches)
