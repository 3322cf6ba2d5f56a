"""The Alembic migrations and the SQLAlchemy models agree."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from metarl.store import db
from metarl.store.records import Base

pytestmark = pytest.mark.integration


def test_models_match_migrations(pg_url):
    with db.get_engine(pg_url).connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_upgrade_is_idempotent(pg_url):
    db.upgrade(pg_url)
    assert db.current_revision(pg_url) is not None
