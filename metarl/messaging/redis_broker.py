"""The Redis broker's transport: kombu's Redis transport with one synchronous client per channel instead of one per call.

kombu 5.7's Redis channel builds a new redis-py client for every publish, ack and task event
(`Channel.conn_or_acquire`), on the channel's shared connection pool; with redis-py 8 each client
builds its table of response callbacks, about 0.1 ms of CPU, and a task message costs about seven
of them between its sender and its worker. A redis-py client holds no connection of its own (its
commands check one out of the pool), so this channel keeps one client and hands it out instead:
the same commands on the same connections. When kombu drops the channel's pools (a close, a fork)
the client goes with them, and the next one is built on the new pool. The consumer's blocking
client (`asynchronous=True`) is kombu's, unchanged.

`workers.app` registers this class for `redis://` broker URLs (kombu's transport alias `redis`).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class ClientReusingChannel(kombu_redis.Channel):
    """A Redis channel whose synchronous commands share one redis-py client on the channel's connection pool."""

    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        if self._shared_client is None:
            self._shared_client = super()._create_client()
        return self._shared_client

    def _disconnect_pools(self) -> None:
        self._shared_client = None  # kombu drops the channel's pools here (channel close, fork): the next client gets the new pool
        super()._disconnect_pools()


class ClientReusingRedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with `ClientReusingChannel`."""

    Channel = ClientReusingChannel
