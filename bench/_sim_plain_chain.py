"""The plain Celery chain that `bench.pipeline_overhead` compares our pipeline against.

Worker side: `celery -A bench._sim_plain_chain:app worker -Q <queue> -c 1 ...`, one process per
queue, exactly as `metarl.pools.worker_command` starts our pools. The app is our own
`workers.app.make_app()` (same broker, serializer, late acks, prefetch 1, events) on kombu's own
Redis transport, stock Celery; with METARL_BENCH_CHAIN_TRANSPORT=ours (the bench's `reuse` pass)
it runs on our client-reusing transport instead (`metarl.messaging.redis_broker`), as our pipeline does, so
that the only difference from our pipeline is what the tasks do: here nothing, there the claims,
records and orchestrator bookkeeping.

One episode is the chain agent -> probe -> train (submit) -> train (poll) -> eval on the queues of
the same names; the poll link is sent with `countdown = poll_countdown_s`, as our train stage
submits an inner job and then sends itself a poll message `poll_interval_s` later, so both
pipelines execute five task messages per episode. The eval task increments a Redis counter (the driver's only way to
see the end without a result backend) and every `episodes_per_batch`-th completion sends one
`outer` task, as our orchestrator sends one outer update per batch of complete groups.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

from workers.app import make_app

TASK_PREFIX = "bench.plain"
DONE_KEY = "bench-plain:episodes-done"
OUTER_KEY = "bench-plain:outer-done"
CHAIN_TRANSPORT_ENV = "METARL_BENCH_CHAIN_TRANSPORT"
CHAIN_TRANSPORTS = ("stock", "ours")


def chain_app(transport: str | None = None, broker_url: str | None = None) -> Celery:
    """Our app (on `broker_url`, default METARL_BROKER_URL) with kombu's Redis transport (`stock`, the default) or ours (`ours`);
    the choice comes from CHAIN_TRANSPORT_ENV unless given."""
    choice = transport or os.environ.get(CHAIN_TRANSPORT_ENV) or "stock"
    if choice not in CHAIN_TRANSPORTS:
        raise SystemExit(f"error: {CHAIN_TRANSPORT_ENV} must be one of {', '.join(CHAIN_TRANSPORTS)}, not {choice!r}")
    return make_app(broker_url, stock_redis_transport=choice == "stock")


app = chain_app()
_client: list[redis.Redis] = []


def counter_client() -> redis.Redis:
    """One Redis client per worker process, on the broker's own database."""
    if not _client:
        _client.append(redis.Redis.from_url(app.conf.broker_url))
    return _client[0]


@app.task(name=f"{TASK_PREFIX}.agent", queue="agent")
def agent(episode: int) -> None:
    """No-op stand-in for the agent stage."""


@app.task(name=f"{TASK_PREFIX}.probe", queue="probe")
def probe(episode: int) -> None:
    """No-op stand-in for the probe stage."""


@app.task(name=f"{TASK_PREFIX}.train", queue="train")
def train(episode: int, poll: bool) -> None:
    """No-op stand-in for the train stage's submit message (`poll` False) and its poll message (True)."""


def count_episode(sender: Celery, prefix: str, episodes_per_batch: int) -> None:
    """Count one finished episode; each full batch sends one `<prefix>.outer` task (the floor chain counts with this too)."""
    done = counter_client().incr(DONE_KEY)
    if done % episodes_per_batch == 0:
        sender.send_task(f"{prefix}.outer", args=[done // episodes_per_batch], queue="outer")


def count_outer() -> None:
    """Count one outer task, so the driver sees the end."""
    counter_client().incr(OUTER_KEY)


@app.task(name=f"{TASK_PREFIX}.eval", queue="eval")
def eval_(episode: int, episodes_per_batch: int) -> None:
    """Count the finished episode; each full batch sends one outer task."""
    count_episode(app, TASK_PREFIX, episodes_per_batch)


@app.task(name=f"{TASK_PREFIX}.outer", queue="outer")
def outer(batch: int) -> None:
    """No-op stand-in for the outer update (counts itself so the driver sees the end)."""
    count_outer()
