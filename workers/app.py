"""The workers' Celery app: the shared app (metarl.messaging.celery_app) with the task modules, and their process set-up."""

from __future__ import annotations

import logging
import os
import threading

from celery.signals import worker_process_init

from metarl.errors import describe_error
from metarl.messaging.celery_app import VISIBILITY_TIMEOUT_S, make_app, transport_options
from metarl.messaging.queues import QUEUES, filesystem_folder
from metarl.settings import DATABASE_ENV

__all__ = ["QUEUES", "VISIBILITY_TIMEOUT_S", "app", "filesystem_folder", "make_app", "transport_options"]

log = logging.getLogger("metarl.worker")

TASK_MODULES = ("workers.stages", "workers.outer")

app = make_app(include=TASK_MODULES)


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    """After fork: forget the parent's pooled connections, then open this process's first one in the background."""
    from metarl.store import dispose_engines

    dispose_engines()
    url = os.environ.get(DATABASE_ENV)
    if url:
        threading.Thread(target=warm_database_pool, args=(url,), name="database-warm-up", daemon=True).start()


def warm_database_pool(url: str) -> None:
    """Connect before the first task needs it (a task that comes first connects itself); a database that is down is only logged:
    the tasks' own connections report it and the orchestrator pauses the run."""
    from metarl.store import StoreError, warm_pool

    try:
        warm_pool(url)
    except StoreError as err:
        log.warning("could not connect to the run database at worker start (tasks will try again): %s", describe_error(err))
