"""What every task module needs: the database URL and this worker's name."""

from __future__ import annotations

import os
import socket

from metarl.settings import DATABASE_ENV


def database_url() -> str:
    url = os.environ.get(DATABASE_ENV)
    if not url:
        raise RuntimeError(f"{DATABASE_ENV} is not set: workers need the run database")
    return url


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
