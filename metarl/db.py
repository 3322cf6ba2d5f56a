"""Database engine, sessions and Alembic migrations (PostgreSQL only)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def normalise_url(url: str) -> str:
    """Use the psycopg 3 driver for plain postgresql:// URLs."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url[len("postgresql://") :]
    if url.startswith("postgres://"):
        return "postgresql+psycopg://" + url[len("postgres://") :]
    return url


_ENGINES: dict[str, Engine] = {}


def get_engine(url: str) -> Engine:
    """One pooled engine per URL per process."""
    engine = _ENGINES.get(url)
    if engine is None:
        engine = create_engine(normalise_url(url), pool_pre_ping=True, pool_size=5, max_overflow=5)
        _ENGINES[url] = engine
    return engine


def dispose_engines() -> None:
    """Forget pooled connections inherited from a parent process (call after fork)."""
    for engine in _ENGINES.values():
        engine.dispose(close=False)
    _ENGINES.clear()


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False, future=True)


@contextlib.contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on any error."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision` (idempotent); serialised by an advisory lock."""
    engine = get_engine(url)
    with engine.begin() as connection:
        connection.execute(text("SELECT pg_advisory_xact_lock(874221)"))
        config = alembic_config(url)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(url: str) -> str | None:
    with get_engine(url).connect() as connection:
        exists = connection.execute(text("SELECT to_regclass('alembic_version')")).scalar()
        if exists is None:
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
