"""What a database needs before anything reads it, told without SQLAlchemy or Alembic: the URL's driver and the migrations' head.

`metarl.store.db` uses these; `metarl status` checks a database's revision with them before it reads the
records over a plain psycopg connection (`metarl.store.status`), so that it imports neither.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import migrations

if TYPE_CHECKING:
    import psycopg

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|None)\s*$", re.MULTILINE)


def normalise_url(url: str) -> str:
    """Use the psycopg 3 driver for plain postgresql:// URLs."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


def head_revision() -> str | None:
    """The single head of migrations/versions read from the files' `revision`/`down_revision` lines, without Alembic.

    None when it cannot be told that way (a file without those lines, a merge, several heads): the
    caller then asks Alembic.
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        if path.name == "__init__.py":
            continue
        found = {name: (single or double) for name, single, double in _REVISION_LINE.findall(path.read_text(encoding="utf-8"))}
        if "revision" not in found or "down_revision" not in found or not found["revision"]:
            return None
        revisions.add(found["revision"])
        if found["down_revision"]:
            parents.add(found["down_revision"])
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def revision_of(connection: psycopg.Connection) -> str | None:
    """The revision a database is at, on a psycopg connection (None: never migrated)."""
    registered = connection.execute("SELECT to_regclass('alembic_version')").fetchone()
    if registered is None or registered[0] is None:
        return None
    row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    return row[0] if row else None


def libpq_uri(database_url: str) -> str:
    """A SQLAlchemy PostgreSQL URL as the URI libpq reads (the `+driver` part dropped; percent-encoded parts stay as they are)."""
    scheme, _, rest = normalise_url(database_url).partition("://")
    return f"postgresql://{rest}" if scheme.startswith("postgresql") else database_url
