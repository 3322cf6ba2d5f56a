"""Queue names and the embedded broker's folder: light constants that status and metrics read without importing Celery."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

QUEUES = ("agent", "probe", "train", "eval", "outer")


def filesystem_folder(broker_url: str) -> Path | None:
    """`filesystem:///abs/folder` -> the folder used for both directions of the kombu filesystem transport."""
    if not broker_url.startswith("filesystem://"):
        return None
    return Path(urlparse(broker_url).path or "/tmp/metarl-broker")
