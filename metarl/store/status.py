"""`metarl status`: episodes per stage, queue depths, failures, costs, reward by outer step.

`run_status` reads a run's records with plain SQL on a psycopg connection, so `metarl status
RUN_ID` imports neither SQLAlchemy nor the record models (about a third of its time went to those
imports, bench.scale). The listing and the episode report, ORM reads, are in `report_data.py`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from metarl.messaging.queues import QUEUES, filesystem_folder
from schemas.states import InnerJobStatus, Stage
from schemas.urls import redacted_url

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("metarl.status")

BROKER_TIMEOUT_S = 2.0


class BrokerReplyError(Exception):
    """The broker answered a command with an error."""


def queue_depths(broker_url: str | None) -> dict[str, int | None]:
    """Messages waiting per queue (Redis LLEN, or files in the embedded broker folder).

    A broker that cannot be reached gives None for every queue (shown as unknown), so `metarl
    status` still answers from the database while the broker is down.
    """
    if broker_url is None:
        return {queue: None for queue in QUEUES}
    folder = filesystem_folder(broker_url)
    if folder is not None:
        return {queue: _filesystem_depth(folder, queue) for queue in QUEUES}
    if urlparse(broker_url).scheme == "redis":
        try:
            return dict(zip(QUEUES, _redis_llen(broker_url, QUEUES), strict=True))
        except (OSError, BrokerReplyError, ValueError) as err:
            log.warning("queue depths unknown: broker %s unreachable (%s)", without_password(broker_url), err)
            return {queue: None for queue in QUEUES}
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=BROKER_TIMEOUT_S, socket_connect_timeout=BROKER_TIMEOUT_S)
    try:
        return {queue: int(client.llen(queue)) for queue in QUEUES}
    except redis.RedisError as err:
        log.warning("queue depths unknown: broker %s unreachable (%s)", without_password(broker_url), err)
        return {queue: None for queue in QUEUES}
    finally:
        client.close()


def without_password(url: str) -> str:
    """The URL with its password (an http(s) URL's whole userinfo) and secret query values shown as *** (schemas.urls.redacted_url)."""
    return redacted_url(url)


def _redis_command(*parts: str) -> bytes:
    encoded = [part.encode() for part in parts]
    return b"*%d\r\n" % len(encoded) + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in encoded)


def _redis_llen(broker_url: str, queues: tuple[str, ...]) -> list[int]:
    """LLEN of each queue over one plain `redis://` connection (RESP, pipelined), without importing redis-py.

    redis-py's import alone (it pulls in OpenTelemetry) took about half a second here, a third of
    what `metarl status` cost; this is the only Redis command status needs.
    """
    parsed = urlparse(broker_url)
    commands: list[bytes] = []
    if parsed.password is not None:
        auth = [unquote(parsed.username), unquote(parsed.password)] if parsed.username else [unquote(parsed.password)]
        commands.append(_redis_command("AUTH", *auth))
    commands.append(_redis_command("SELECT", str(int(parsed.path.lstrip("/") or 0))))
    commands += [_redis_command("LLEN", queue) for queue in queues]
    with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=BROKER_TIMEOUT_S) as connection:
        connection.sendall(b"".join(commands))
        replies = connection.makefile("rb")
        answers = []
        for _ in commands:
            line = replies.readline()
            if not line.endswith(b"\r\n"):
                raise BrokerReplyError("connection closed before the reply")
            if line.startswith(b"-"):
                raise BrokerReplyError(line[1:].strip().decode("utf-8", "replace"))
            answers.append(line)
    return [int(answer[1:]) for answer in answers[len(commands) - len(queues) :]]


def _filesystem_depth(folder: Path, queue: str) -> int:
    if not folder.exists():
        return 0
    return sum(1 for name in folder.iterdir() if name.name.endswith(f".{queue}.msg"))


SHORT_ID_MIN_LENGTH = 8
"""Fewest characters of a run id that the runs table shows."""


def unique_prefix(run_id: str, neighbours: Iterable[str | None], minimum: int = SHORT_ID_MIN_LENGTH) -> str:
    """The shortest prefix of `run_id`, at least `minimum` long, that `metarl.store.run_ids.resolve_run_id` resolves to it (pure).

    `neighbours` are the ids just before and after it in case-insensitive byte order (None at
    either end): no other id shares a longer prefix with it.
    """
    own = run_id.lower()
    shared = max((len(os.path.commonprefix([own, other.lower()])) for other in neighbours if other is not None), default=0)
    return run_id[: max(minimum, shared + 1)]


RUN_SQL = "SELECT id, name, status, policy_version, status_message, stop_requested, created_at, finished_at FROM runs WHERE id = %(run_id)s"
EPISODES_BY_STAGE_SQL = "SELECT stage, count(*) FROM episodes WHERE run_id = %(run_id)s GROUP BY stage"
FAILURES_SQL = "SELECT id, stage, error FROM episodes WHERE run_id = %(run_id)s AND error IS NOT NULL ORDER BY id DESC LIMIT 10"
COSTS_SQL = "SELECT source, simulated, sum(amount_usd), count(*) FROM cost_ledger WHERE run_id = %(run_id)s GROUP BY source, simulated"
OUTER_STEPS_SQL = """
SELECT step, status, policy_version_before, policy_version_after, n_groups, n_episodes, dropped_stale_groups, metrics
FROM outer_steps WHERE run_id = %(run_id)s ORDER BY step
"""
REWARDS_SQL = "SELECT count(id), avg(total), avg(job), avg(validation), avg(efficiency), avg(speed) FROM rewards WHERE run_id = %(run_id)s"
INNER_JOBS_SQL = "SELECT status, count(*) FROM inner_jobs WHERE run_id = %(run_id)s GROUP BY status"
PROBE_ATTEMPTS_SQL = "SELECT count(*), count(*) FILTER (WHERE passed) FROM probe_attempts WHERE run_id = %(run_id)s"
RECENT_EPISODES_SQL = """
SELECT e.id, e.task_id, e.stage, e.policy_version, r.total, r.job, r.validation, r.efficiency, r.speed
FROM episodes e LEFT JOIN rewards r ON r.episode_id = e.id
WHERE e.run_id = %(run_id)s ORDER BY e.id DESC LIMIT 12
"""
HELD_OUT_REWARD_SQL = """
SELECT g.policy_version, avg(r.total)
FROM episode_groups g JOIN episodes e ON e.group_id = g.id JOIN rewards r ON r.episode_id = e.id
WHERE g.run_id = %(run_id)s AND g.held_out AND NOT g.start_set AND g.status = 'evaluated'
  AND (%(version)s::integer IS NULL OR g.policy_version = %(version)s::integer)
GROUP BY g.policy_version
"""
"""Mean reward of the evaluated held-out groups per policy version they were sampled under (a group's episodes share its version;
all versions when `version` is NULL); `metarl.store.step_metrics.held_out_reward_by_version` runs it on an ORM session."""
START_SET_SQL = """
SELECT count(e.id), count(r.id), avg(r.total)
FROM episode_groups g JOIN episodes e ON e.group_id = g.id LEFT JOIN rewards r ON r.episode_id = e.id
WHERE g.run_id = %(run_id)s AND g.start_set
"""
"""The run's start set: its episodes, how many have their reward, and their mean reward."""


def held_out_means(found: Iterable[tuple[Any, Any]]) -> dict[int, float]:
    """HELD_OUT_REWARD_SQL's rows as {policy version: mean reward} (pure)."""
    return {int(version): float(mean) for version, mean in found}


def run_status(connection: psycopg.Connection, run_id: str, broker_url: str | None = None) -> dict[str, Any]:
    """Everything `metarl status RUN_ID` shows, as plain data (JSON-ready), read on a psycopg connection.

    Every query is one aggregate or a bounded list over an index on the run id: a run of 100,000
    episodes answers in about two hundred milliseconds (bench.scale). The cost total is summed from
    the per-source rows instead of a second pass over the ledger.
    """

    def rows(sql: str, **extra: Any) -> list[tuple[Any, ...]]:
        return connection.execute(sql, {"run_id": run_id, **extra}).fetchall()

    found = rows(RUN_SQL)
    if not found:
        raise LookupError(run_id)
    (run_row,) = found
    stages = dict(rows(EPISODES_BY_STAGE_SQL))
    failures = rows(FAILURES_SQL)
    costs = rows(COSTS_SQL)
    steps = rows(OUTER_STEPS_SQL)
    held_out = held_out_means(rows(HELD_OUT_REWARD_SQL, version=None))
    (rewards,) = rows(REWARDS_SQL)
    jobs = dict(rows(INNER_JOBS_SQL))
    (attempts,) = rows(PROBE_ATTEMPTS_SQL)
    recent = rows(RECENT_EPISODES_SQL)
    (start,) = rows(START_SET_SQL)
    return status_document(run_row, stages, failures, costs, steps, held_out, rewards, jobs, attempts, recent, queue_depths(broker_url), start)


def read_run_status(database_url: str, run_id: str, broker_url: str | None = None) -> dict[str, Any]:
    """:func:`run_status` on a new psycopg connection of its own (what `metarl status RUN_ID` opens); LookupError when there is no such run."""
    import psycopg

    from metarl.store.migration_head import libpq_uri

    with psycopg.connect(libpq_uri(database_url)) as connection:
        return run_status(connection, run_id, broker_url)


class DatabaseUnreachable(Exception):
    """The run database could not be reached; `reason` is what the driver said, in one line."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def driver_error_line(err: BaseException) -> str:
    """The first line of a driver error's text, or its type's name when it has none (pure)."""
    said = str(err).strip()
    return said.splitlines()[0] if said else type(err).__name__


@dataclass(frozen=True)
class RunStatusRead:
    """The run a typed id resolved to, and its status (None: the run was gone by the time it was read)."""

    run_id: str
    status: dict[str, Any] | None


def read_run_status_at_head(database_url: str, run_id_text: str, broker_url: str | None) -> RunStatusRead | None:
    """`metarl status RUN_ID` over one psycopg connection, with no SQLAlchemy import; None when the database is behind the migrations.

    Resolves the id as typed (`metarl.store.run_ids.resolve_run_id`, whose RunIdError it raises) and
    reads :func:`run_status` on the same connection. Raises DatabaseUnreachable when it cannot connect.
    """
    import psycopg

    from metarl.store.migration_head import head_revision, libpq_uri, revision_of
    from metarl.store.run_ids import resolve_run_id

    try:
        with psycopg.connect(libpq_uri(database_url), connect_timeout=10) as connection:
            head = head_revision()
            if head is None or revision_of(connection) != head:
                return None
            run_id = resolve_run_id(connection, run_id_text)
            try:
                return RunStatusRead(run_id, run_status(connection, run_id, broker_url))
            except LookupError:
                return RunStatusRead(run_id, None)
    except psycopg.OperationalError as err:
        raise DatabaseUnreachable(driver_error_line(err)) from err


def status_document(
    run_row: tuple[Any, ...],
    stages: dict[str, int],
    failures: list[tuple[Any, ...]],
    costs: list[tuple[Any, ...]],
    steps: list[tuple[Any, ...]],
    held_out: dict[int, float],
    rewards: tuple[Any, ...],
    jobs: dict[str, int],
    attempts: tuple[Any, ...],
    recent: list[tuple[Any, ...]],
    depths: dict[str, int | None],
    start: tuple[Any, ...] = (0, 0, None),
) -> dict[str, Any]:
    """The status of a run from the rows of the queries above (pure)."""
    run_id, name, status, policy_version, message, stop_requested, created_at, finished_at = run_row
    return {
        "run": {
            "id": run_id,
            "name": name,
            "status": status,
            "policy_version": policy_version,
            "message": message,
            "stop_requested": stop_requested,
            "created_at": created_at.isoformat(),
            "finished_at": finished_at.isoformat() if finished_at else None,
        },
        "episodes_by_stage": {stage.value: int(stages.get(stage.value, 0)) for stage in Stage},
        "inner_jobs": {job_status.value: int(jobs.get(job_status.value, 0)) for job_status in InnerJobStatus},
        "probe_attempts": {"total": int(attempts[0] or 0), "passed": int(attempts[1] or 0)},
        "queue_depths": depths,
        "failures": [{"episode": e, "stage": s, "error": err} for e, s, err in failures],
        "costs": [
            {"source": source, "simulated": bool(simulated), "usd": float(total or 0), "entries": int(count)} for source, simulated, total, count in costs
        ],
        "cost_usd_total": float(sum((total or 0) for _, _, total, _ in costs)),
        "rewards": {
            "episodes": int(rewards[0] or 0),
            "total_mean": optional_float(rewards[1]),
            "job_mean": optional_float(rewards[2]),
            "validation_mean": optional_float(rewards[3]),
            "efficiency_mean": optional_float(rewards[4]),
            "speed_mean": optional_float(rewards[5]),
        },
        "recent_episodes": [
            {
                "episode": e,
                "task": t,
                "stage": s,
                "policy_version": v,
                "reward": optional_float(total),
                "job": optional_float(job),
                "validation": optional_float(val),
                "efficiency": optional_float(eff),
                "speed": optional_float(speed),
            }
            for e, t, s, v, total, job, val, eff, speed in recent
        ],
        "outer_steps": [outer_step_line(step, held_out) for step in steps],
        "held_out_latest": newest_held_out(held_out),
        "start_set": {"episodes": int(start[0] or 0), "rewarded": int(start[1] or 0), "reward_mean": optional_float(start[2])},
    }


def newest_held_out(held_out: dict[int, float]) -> dict[str, Any] | None:
    """The newest policy version with an evaluated held-out mean, and that mean (None: none yet; pure)."""
    if not held_out:
        return None
    version = max(held_out)
    return {"policy_version": version, "reward": held_out[version]}


def outer_step_line(step_row: tuple[Any, ...], held_out: dict[int, float]) -> dict[str, Any]:
    """One row of OUTER_STEPS_SQL as the status shows it (pure).

    The held-out reward is that of the step's starting version (`held_out_version`, None with no
    reward): one found in the records wins over the one stored when the step ran.
    """
    step, status, before, after, groups, episodes, dropped, metrics = step_row
    metrics = metrics or {}
    held_out_reward = held_out.get(before, metrics.get("held_out_reward_mean"))
    return {
        "step": step,
        "status": status,
        "version": after,
        "groups": groups,
        "episodes": episodes,
        "dropped_stale": dropped,
        "reward_mean": metrics.get("reward_mean"),
        "held_out_reward": held_out_reward,
        "held_out_version": None if held_out_reward is None else before,
        "cost_usd": metrics.get("cost_usd_total"),
    }


def optional_float(value: Any) -> float | None:
    """A database number as a float rounded to 4 places (None stays None)."""
    return None if value is None else round(float(value), 4)
