"""The floor chain: the plain chain plus the least durable bookkeeping an exactly-once stage needs.

`bench.pipeline_overhead` runs it as a third pass, to show what any design that records every
stage in PostgreSQL costs on the same machine, apart from how our pipeline does it. Each task:

1. claims its stage: one autocommit ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` of a claim row
   keyed by (episode, step) with a fresh token (a duplicate message finds the key taken and stops);
2. closes the claim and moves the episode: one autocommit statement, a compare-and-set on the
   claim's token and status and on the episode's step.

Two round trips and two commits per task message, on one psycopg connection per worker process;
no ORM, no run config, no records beyond these two rows. Everything else (queues, chain, counters,
the outer task per batch, kombu's own Redis transport) is the plain chain's, from `bench._sim_plain_chain`.
"""

from __future__ import annotations

import os
import uuid

import psycopg

from bench._sim_plain_chain import chain_app, count_episode, count_outer
from metarl.settings import DATABASE_ENV
from metarl.store import libpq_uri

TASK_PREFIX = "bench.floor"
SETUP_SQL = """
CREATE TABLE IF NOT EXISTS bench_floor_episodes (id integer PRIMARY KEY, step text NOT NULL);
CREATE TABLE IF NOT EXISTS bench_floor_claims (
    episode integer NOT NULL, step text NOT NULL, token uuid NOT NULL, status text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (episode, step)
);
TRUNCATE bench_floor_episodes, bench_floor_claims;
"""
CLAIM_SQL = """
INSERT INTO bench_floor_claims (episode, step, token, status) VALUES (%(episode)s, %(step)s, %(token)s, 'running')
ON CONFLICT DO NOTHING RETURNING token
"""
FINISH_AND_MOVE_SQL = """
WITH finished AS (
    UPDATE bench_floor_claims SET status = 'done'
    WHERE episode = %(episode)s AND step = %(step)s AND token = %(token)s AND status = 'running' RETURNING episode
)
UPDATE bench_floor_episodes SET step = %(to)s WHERE id = %(episode)s AND step = %(step)s AND EXISTS (SELECT 1 FROM finished)
RETURNING id
"""
STEPS = ("agent", "probe", "train", "poll", "eval", "done")
"""The steps an episode goes through, in order; each task moves its episode from its step to the next."""

app = chain_app()
_connection: list[psycopg.Connection] = []


def database() -> psycopg.Connection:
    """One autocommit connection per worker process, to the database the bench passes in DATABASE_ENV."""
    if not _connection:
        _connection.append(psycopg.connect(libpq_uri(os.environ[DATABASE_ENV]), autocommit=True))
    return _connection[0]


def next_step(step: str) -> str:
    """The step after `step` (pure)."""
    return STEPS[STEPS.index(step) + 1]


def claim_and_move(episode: int, step: str) -> bool:
    """Claim (episode, step), then close the claim and move the episode on; False when a claim or the move was refused."""
    connection = database()
    token = uuid.uuid4()
    if connection.execute(CLAIM_SQL, {"episode": episode, "step": step, "token": token}).fetchone() is None:
        return False
    moved = connection.execute(FINISH_AND_MOVE_SQL, {"episode": episode, "step": step, "token": token, "to": next_step(step)}).fetchone()
    return moved is not None


def prepare(database_url: str, episodes: int) -> None:
    """Create (or empty) the two tables and insert the episodes at their first step (the driver calls this before timing)."""
    with psycopg.connect(libpq_uri(database_url), autocommit=True) as connection:
        connection.execute(SETUP_SQL)
        with connection.cursor() as cursor:
            cursor.executemany("INSERT INTO bench_floor_episodes (id, step) VALUES (%s, %s)", [(episode, STEPS[0]) for episode in range(episodes)])


def finished_floor_episodes(database_url: str) -> int:
    """Episodes that went through every step, each step claimed and closed once (the driver checks this after a pass)."""
    with psycopg.connect(libpq_uri(database_url), autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM bench_floor_episodes e WHERE e.step = 'done'"
            " AND (SELECT count(*) FROM bench_floor_claims c WHERE c.episode = e.id AND c.status = 'done') = %(steps)s",
            {"steps": len(STEPS) - 1},
        ).fetchone()
    return int(row[0]) if row else 0


@app.task(name=f"{TASK_PREFIX}.agent", queue="agent")
def agent(episode: int) -> None:
    """The agent stage's claim and move."""
    claim_and_move(episode, "agent")


@app.task(name=f"{TASK_PREFIX}.probe", queue="probe")
def probe(episode: int) -> None:
    """The probe stage's claim and move."""
    claim_and_move(episode, "probe")


@app.task(name=f"{TASK_PREFIX}.train", queue="train")
def train(episode: int, poll: bool) -> None:
    """The train stage's submit (`poll` False) or poll message: each claims and moves once."""
    claim_and_move(episode, "poll" if poll else "train")


@app.task(name=f"{TASK_PREFIX}.eval", queue="eval")
def eval_(episode: int, episodes_per_batch: int) -> None:
    """The eval stage's claim and move; counts the finished episode and sends one outer task per full batch."""
    claim_and_move(episode, "eval")
    count_episode(app, TASK_PREFIX, episodes_per_batch)


@app.task(name=f"{TASK_PREFIX}.outer", queue="outer")
def outer(batch: int) -> None:
    """No-op stand-in for the outer update, as in the plain chain."""
    count_outer()
