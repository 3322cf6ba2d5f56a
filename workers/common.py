"""What every task module needs: the database URL and this worker's name."""

from __future__ import annotations

import os

from metarl.settings import DATABASE_ENV, host_name


def database_url() -> str:
    url = os.environ.get(DATABASE_ENV)
    if not url:
        raise RuntimeError(f"{DATABASE_ENV} is not set: workers need the run database")
    return url


def worker_name() -> str:
    return f"{host_name()}:{os.getpid()}"
