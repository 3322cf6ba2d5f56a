"""Where the database and broker are: environment first, then the run config; none means embedded. Which host this is,
and where it keeps its caches."""

from __future__ import annotations

import os
import socket
from pathlib import Path

DATABASE_ENV = "METARL_DATABASE_URL"
BROKER_ENV = "METARL_BROKER_URL"
HOME_ENV = "METARL_HOME"
HOST_ENV = "METARL_HOST_NAME"
CACHE_ENV = "METARL_CACHE_DIR"
MAX_HOST_NAME_CHARS = 128


def metarl_home() -> Path:
    """Folder of the embedded default's state (database files, broker queue, artifacts)."""
    return Path(os.environ.get(HOME_ENV, ".metarl")).resolve()


def database_url(config_value: str | None = None) -> str | None:
    return os.environ.get(DATABASE_ENV) or config_value


def broker_url(config_value: str | None = None) -> str | None:
    return os.environ.get(BROKER_ENV) or config_value


def host_name() -> str:
    """This host's name as workers record it (`METARL_HOST_NAME`, else the system's host name), printable and bounded."""
    name = os.environ.get(HOST_ENV) or socket.gethostname() or "localhost"
    return "".join(ch if ch.isprintable() else "?" for ch in name)[:MAX_HOST_NAME_CHARS]


def cache_dir() -> Path:
    """This host's cache folder (`METARL_CACHE_DIR`, else `~/.cache/metarl`): copies of artifacts, verified by digest."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).resolve() if configured else Path.home() / ".cache" / "metarl"
