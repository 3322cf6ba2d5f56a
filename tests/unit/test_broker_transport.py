"""Which kombu transport a broker URL gets: ours for redis://, the scheme's own for anything else, kombu's when asked for stock."""

from __future__ import annotations

import pytest
from kombu.transport import TRANSPORT_ALIASES

from metarl.messaging.celery_app import KOMBU_REDIS_TRANSPORT, REDIS_TRANSPORT, broker_transport, make_app
from metarl.messaging.fs_broker import AtomicFilesystemTransport
from metarl.messaging.redis_broker import ClientReusingRedisTransport


@pytest.mark.parametrize(
    ("url", "stock", "expected"),
    [
        ("redis://127.0.0.1:6379/0", False, None),
        ("redis://:secret@redis.internal:6380/3", False, None),
        ("redis://127.0.0.1:6379/0", True, KOMBU_REDIS_TRANSPORT),
        ("rediss://127.0.0.1:6380/0", False, None),
        ("rediss://127.0.0.1:6380/0", True, None),
        ("sentinel://127.0.0.1:26379", False, None),
        ("filesystem:///tmp/metarl-broker", False, None),
    ],
)
def test_broker_transport(url: str, stock: bool, expected: str | None) -> None:
    assert broker_transport(url, stock) == expected


def test_apps_build_the_chosen_transport_without_connecting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert TRANSPORT_ALIASES["redis"] == REDIS_TRANSPORT
    with make_app("redis://:pw@127.0.0.1:1/3").connection() as connection:
        assert connection.as_uri(include_password=True) == "redis://:pw@127.0.0.1:1/3"  # what Flower reads the broker's kind from
    assert type(make_app("redis://127.0.0.1:1/0").connection_for_write().transport) is ClientReusingRedisTransport
    assert type(make_app("redis://127.0.0.1:1/0", stock_redis_transport=True).connection_for_write().transport) is not ClientReusingRedisTransport
    assert type(make_app(f"filesystem://{tmp_path}").connection_for_write().transport) is AtomicFilesystemTransport
