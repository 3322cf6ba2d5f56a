"""The Celery app. Broker URL from METARL_BROKER_URL; JSON only; late acks with idempotent tasks."""

from __future__ import annotations

import logging
import os
import threading
from urllib.parse import urlparse

from celery import Celery
from celery.signals import worker_process_init
from kombu import Queue
from kombu.transport import TRANSPORT_ALIASES

from metarl.errors import describe_error
from metarl.settings import BROKER_ENV, DATABASE_ENV
from workers.queues import QUEUES, filesystem_folder

__all__ = ["QUEUES", "VISIBILITY_TIMEOUT_S", "app", "filesystem_folder", "make_app", "transport_options"]

log = logging.getLogger("metarl.worker")

VISIBILITY_TIMEOUT_S = 12 * 3600
REDIS_TRANSPORT = "workers.redis_broker:ClientReusingRedisTransport"
"""The transport of `redis://` broker URLs: kombu's, with one redis-py client per channel (see workers.redis_broker)."""
KOMBU_REDIS_TRANSPORT = "kombu.transport.redis:Transport"
"""kombu's own Redis transport, which `make_app(stock_redis_transport=True)` names for the benchmarks' plain Celery chains."""


def transport_options(broker_url: str) -> dict[str, object]:
    folder = filesystem_folder(broker_url)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        control = folder / "control"
        control.mkdir(exist_ok=True)
        return {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(control), "polling_interval": 0.05}
    return {"visibility_timeout": VISIBILITY_TIMEOUT_S}


FILESYSTEM_TRANSPORT = "workers.fs_broker:AtomicFilesystemTransport"
TRANSPORT_ALIASES["filesystem"] = FILESYSTEM_TRANSPORT  # filesystem:// URLs publish whole messages (see workers.fs_broker)
TRANSPORT_ALIASES["redis"] = REDIS_TRANSPORT  # redis:// URLs keep one client per channel (see workers.redis_broker)


def broker_transport(broker_url: str, stock_redis_transport: bool = False) -> str | None:
    """The kombu transport to name for a broker URL: None for the one its scheme's alias gives (ours for `redis://`),
    or kombu's own Redis transport when asked for stock (pure)."""
    return KOMBU_REDIS_TRANSPORT if stock_redis_transport and urlparse(broker_url).scheme == "redis" else None


def make_app(broker_url: str | None = None, *, stock_redis_transport: bool = False) -> Celery:
    """Our Celery app; `stock_redis_transport` keeps kombu's own Redis transport (the benchmarks' plain Celery chains)."""
    url = broker_url or os.environ.get(BROKER_ENV) or "redis://127.0.0.1:6379/0"
    celery_app = Celery("metarl", broker=url, include=["workers.stages", "workers.outer"])
    celery_app.conf.update(
        broker_transport=broker_transport(url, stock_redis_transport),
        broker_transport_options=transport_options(url),
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue="agent",
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
    )
    return celery_app


app = make_app()


@worker_process_init.connect
def _fresh_connections(**_: object) -> None:
    """After fork: forget the parent's pooled connections, then open this process's first one in the background."""
    from metarl.db import dispose_engines

    dispose_engines()
    url = os.environ.get(DATABASE_ENV)
    if url:
        threading.Thread(target=warm_database_pool, args=(url,), name="database-warm-up", daemon=True).start()


def warm_database_pool(url: str) -> None:
    """Connect before the first task needs it (a task that comes first connects itself); a database that is down is only logged:
    the tasks' own connections report it and the orchestrator pauses the run."""
    from sqlalchemy.exc import SQLAlchemyError

    from metarl.db import warm_pool

    try:
        warm_pool(url)
    except SQLAlchemyError as err:
        log.warning("could not connect to the run database at worker start (tasks will try again): %s", describe_error(err))
