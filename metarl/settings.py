"""Where the database and broker are: environment first, then the run config; none means embedded."""

from __future__ import annotations

import os
from pathlib import Path

DATABASE_ENV = "METARL_DATABASE_URL"
BROKER_ENV = "METARL_BROKER_URL"
HOME_ENV = "METARL_HOME"


def metarl_home() -> Path:
    """Folder of the embedded default's state (database files, broker queue, artifacts)."""
    return Path(os.environ.get(HOME_ENV, ".metarl")).resolve()


def database_url(config_value: str | None = None) -> str | None:
    return os.environ.get(DATABASE_ENV) or config_value


def broker_url(config_value: str | None = None) -> str | None:
    return os.environ.get(BROKER_ENV) or config_value
