"""The client-reusing Redis transport on a real Redis: messages go through whole, one client serves every synchronous command,
and dropped connections or a new pool are handled as kombu's own transport handles them."""

from __future__ import annotations

import uuid

import redis
from kombu import Connection, Exchange, Queue

from metarl.messaging.redis_broker import ClientReusingChannel, ClientReusingRedisTransport

MESSAGES = 40


def reusing_connection(redis_url: str) -> Connection:
    return Connection(redis_url, transport=ClientReusingRedisTransport)


def publish(connection: Connection, queue: Queue, bodies: list[dict[str, object]]) -> None:
    with connection.Producer() as producer:
        for body in bodies:
            producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue], serializer="json", retry=True)


def drain(connection: Connection, queue: Queue, limit: int) -> list[dict[str, object]]:
    """Take and ack up to `limit` messages, one basic_get at a time (each take and ack is a synchronous command on the channel)."""
    got: list[dict[str, object]] = []
    bound = queue(connection.default_channel)
    while len(got) < limit:
        message = bound.get(no_ack=False)
        if message is None:
            break
        got.append(message.decode())
        message.ack()
    return got


def fresh_queue() -> Queue:
    name = f"reuse-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def test_messages_round_trip_with_one_client_for_every_synchronous_command(redis_url: str) -> None:
    queue = fresh_queue()
    bodies = [{"episode": n, "text": "é" * n} for n in range(MESSAGES)]
    with reusing_connection(redis_url) as connection:
        channel = connection.default_channel
        assert isinstance(channel, ClientReusingChannel)
        publish(connection, queue, bodies)
        first = channel._create_client()
        assert drain(connection, queue, MESSAGES + 1) == bodies
        assert channel._create_client() is first
        assert channel._create_client(asynchronous=True) is not first  # the consumer's blocking client stays kombu's
        unacked = redis.Redis.from_url(redis_url)
        try:
            assert unacked.hlen(channel.unacked_key) == 0 and unacked.llen(queue.name) == 0
        finally:
            unacked.close()


def test_dropped_connections_and_a_new_pool_lose_no_message(redis_url: str) -> None:
    queue = fresh_queue()
    admin = redis.Redis.from_url(redis_url)
    try:
        with reusing_connection(redis_url) as connection:
            channel = connection.default_channel
            publish(connection, queue, [{"n": n} for n in range(10)])
            before = channel._create_client()
            killed = admin.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 1  # the channel's pooled connections were closed under it
            publish(connection, queue, [{"n": n} for n in range(10, 20)])
            assert channel._create_client() is before
            channel._disconnect_pools()  # what kombu does on a channel close and after a fork
            publish(connection, queue, [{"n": n} for n in range(20, 30)])
            assert channel._create_client() is not before
            assert drain(connection, queue, 31) == [{"n": n} for n in range(30)]
    finally:
        admin.close()
