"""The Celery app every process shares: broker URL from METARL_BROKER_URL, JSON only, late acks with idempotent tasks.

The orchestrator and the command line send with it; `workers.app` builds the workers' app with the task modules.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

from celery import Celery
from kombu import Queue
from kombu.transport import TRANSPORT_ALIASES

from metarl.messaging.queues import QUEUES, filesystem_folder
from metarl.settings import BROKER_ENV

VISIBILITY_TIMEOUT_S = 12 * 3600
REDIS_TRANSPORT = "metarl.messaging.redis_broker:ClientReusingRedisTransport"
"""The transport of `redis://` broker URLs: kombu's, with one redis-py client per channel (see metarl.messaging.redis_broker)."""
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


FILESYSTEM_TRANSPORT = "metarl.messaging.fs_broker:AtomicFilesystemTransport"
TRANSPORT_ALIASES["filesystem"] = FILESYSTEM_TRANSPORT  # filesystem:// URLs publish whole messages (see metarl.messaging.fs_broker)
TRANSPORT_ALIASES["redis"] = REDIS_TRANSPORT  # redis:// URLs keep one client per channel (see metarl.messaging.redis_broker)


def broker_transport(broker_url: str, stock_redis_transport: bool = False) -> str | None:
    """The kombu transport to name for a broker URL: None for the one its scheme's alias gives (ours for `redis://`),
    or kombu's own Redis transport when asked for stock (pure)."""
    return KOMBU_REDIS_TRANSPORT if stock_redis_transport and urlparse(broker_url).scheme == "redis" else None


def make_app(broker_url: str | None = None, *, stock_redis_transport: bool = False, include: tuple[str, ...] = ()) -> Celery:
    """Our Celery app; `include` names the task modules a worker loads (none to only send), `stock_redis_transport`
    keeps kombu's own Redis transport (the benchmarks' plain Celery chains)."""
    url = broker_url or os.environ.get(BROKER_ENV) or "redis://127.0.0.1:6379/0"
    celery_app = Celery("metarl", broker=url, include=list(include))
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
