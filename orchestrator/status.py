"""`metarl status`: episodes per stage, queue depths, failures, costs, reward by outer step."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metarl.ledger import run_total_usd
from orchestrator.step_metrics import held_out_reward_by_version
from schemas.records import CostEntry, Episode, InnerJob, InnerJobStatus, OuterStep, ProbeAttempt, Reward, Run, Stage
from workers.queues import QUEUES, filesystem_folder

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
            log.warning("queue depths unknown: broker %s unreachable (%s)", _without_password(broker_url), err)
            return {queue: None for queue in QUEUES}
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=BROKER_TIMEOUT_S, socket_connect_timeout=BROKER_TIMEOUT_S)
    try:
        return {queue: int(client.llen(queue)) for queue in QUEUES}
    except redis.RedisError as err:
        log.warning("queue depths unknown: broker %s unreachable (%s)", _without_password(broker_url), err)
        return {queue: None for queue in QUEUES}
    finally:
        client.close()


def _without_password(url: str) -> str:
    parsed = urlparse(url)
    return url if parsed.password is None else url.replace(f":{parsed.password}@", ":***@", 1)


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
    return [int(answer[1:]) for answer in answers[len(commands) - len(queues):]]


def _filesystem_depth(folder: Path, queue: str) -> int:
    if not folder.exists():
        return 0
    return sum(1 for name in folder.iterdir() if name.name.endswith(f".{queue}.msg"))


def list_runs(session: Session) -> list[dict[str, Any]]:
    runs = session.execute(select(Run).order_by(Run.created_at.desc()).limit(50)).scalars().all()
    return [
        {
            "id": run.id,
            "name": run.name,
            "status": run.status.value,
            "policy_version": run.policy_version,
            "created_at": run.created_at.isoformat(),
            "cost_usd": round(run_total_usd(session, run.id), 4),
        }
        for run in runs
    ]


def run_status(session: Session, run_id: str, broker_url: str | None = None) -> dict[str, Any]:
    """Everything `metarl status RUN_ID` shows, as plain data (JSON-ready).

    Every query is one aggregate or a bounded list: a run of 100,000 episodes answers in a few
    hundred milliseconds (bench.scale). Per-status job counts use ix_inner_jobs_run_status; the
    cost total is summed from the per-source rows instead of a second pass over the ledger.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise LookupError(run_id)
    stages = dict(session.execute(select(Episode.stage, func.count()).where(Episode.run_id == run_id).group_by(Episode.stage)).all())
    failures = session.execute(
        select(Episode.id, Episode.stage, Episode.error).where(Episode.run_id == run_id, Episode.error.is_not(None)).order_by(Episode.id.desc()).limit(10)
    ).all()
    costs = session.execute(
        select(CostEntry.source, CostEntry.simulated, func.sum(CostEntry.amount_usd), func.count())
        .where(CostEntry.run_id == run_id)
        .group_by(CostEntry.source, CostEntry.simulated)
    ).all()
    steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
    held_out = held_out_reward_by_version(session, run_id)
    rewards = session.execute(
        select(
            func.count(Reward.id),
            func.avg(Reward.total),
            func.avg(Reward.job),
            func.avg(Reward.validation),
            func.avg(Reward.efficiency),
            func.avg(Reward.speed),
        )
        .join(Episode, Episode.id == Reward.episode_id)
        .where(Episode.run_id == run_id)
    ).one()
    jobs = dict(session.execute(select(InnerJob.status, func.count()).where(InnerJob.run_id == run_id).group_by(InnerJob.status)).all())
    attempts = session.execute(
        select(func.count(), func.count().filter(ProbeAttempt.passed.is_(True)))
        .join(Episode, Episode.id == ProbeAttempt.episode_id)
        .where(Episode.run_id == run_id)
    ).one()
    recent = session.execute(
        select(Episode.id, Episode.task_id, Episode.stage, Episode.policy_version, Reward.total, Reward.job, Reward.validation, Reward.efficiency, Reward.speed)
        .outerjoin(Reward, Reward.episode_id == Episode.id)
        .where(Episode.run_id == run_id)
        .order_by(Episode.id.desc())
        .limit(12)
    ).all()
    return {
        "run": {
            "id": run.id,
            "name": run.name,
            "status": run.status.value,
            "policy_version": run.policy_version,
            "message": run.status_message,
            "stop_requested": run.stop_requested,
            "created_at": run.created_at.isoformat(),
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        },
        "episodes_by_stage": {stage.value: int(stages.get(stage, 0)) for stage in Stage},
        "inner_jobs": {status.value: int(jobs.get(status, 0)) for status in InnerJobStatus},
        "probe_attempts": {"total": int(attempts[0] or 0), "passed": int(attempts[1] or 0)},
        "queue_depths": queue_depths(broker_url),
        "failures": [{"episode": e, "stage": s.value, "error": err} for e, s, err in failures],
        "costs": [
            {"source": source, "simulated": bool(simulated), "usd": float(total or 0), "entries": int(count)} for source, simulated, total, count in costs
        ],
        "cost_usd_total": float(sum((total or 0) for _, _, total, _ in costs)),
        "rewards": {
            "episodes": int(rewards[0] or 0),
            "total_mean": _f(rewards[1]),
            "job_mean": _f(rewards[2]),
            "validation_mean": _f(rewards[3]),
            "efficiency_mean": _f(rewards[4]),
            "speed_mean": _f(rewards[5]),
        },
        "recent_episodes": [
            {
                "episode": e,
                "task": t,
                "stage": s.value,
                "policy_version": v,
                "reward": _f(total),
                "job": _f(job),
                "validation": _f(val),
                "efficiency": _f(eff),
                "speed": _f(speed),
            }
            for e, t, s, v, total, job, val, eff, speed in recent
        ],
        "outer_steps": [
            {
                "step": step.step,
                "status": step.status.value,
                "version": step.policy_version_after,
                "groups": step.n_groups,
                "episodes": step.n_episodes,
                "dropped_stale": step.dropped_stale_groups,
                "reward_mean": step.metrics.get("reward_mean"),
                "held_out_reward": held_out.get(step.policy_version_before, step.metrics.get("held_out_reward_mean")),
                "cost_usd": step.metrics.get("cost_usd_total"),
            }
            for step in steps
        ],
    }


def _f(value: Any) -> float | None:
    return None if value is None else round(float(value), 4)


def episode_report(session: Session, episode_id: int) -> dict[str, Any]:
    """What happened to one episode and what it cost: stage claims, submissions, inner job, scores, reward, charges."""
    from schemas.records import Evaluation, StageClaim

    episode = session.get(Episode, episode_id)
    if episode is None:
        raise LookupError(episode_id)
    claims = session.execute(select(StageClaim).where(StageClaim.episode_id == episode_id).order_by(StageClaim.claimed_at)).scalars().all()
    attempts = session.execute(select(ProbeAttempt).where(ProbeAttempt.episode_id == episode_id).order_by(ProbeAttempt.attempt)).scalars().all()
    job = session.execute(select(InnerJob).where(InnerJob.episode_id == episode_id)).scalar_one_or_none()
    evaluation = session.execute(select(Evaluation).where(Evaluation.episode_id == episode_id)).scalar_one_or_none()
    reward = session.execute(select(Reward).where(Reward.episode_id == episode_id)).scalar_one_or_none()
    costs = session.execute(select(CostEntry).where(CostEntry.episode_id == episode_id).order_by(CostEntry.created_at)).scalars().all()
    return {
        "episode": {
            "id": episode.id,
            "run": episode.run_id,
            "task": episode.task_id,
            "group": episode.group_id,
            "policy_version": episode.policy_version,
            "held_out": episode.held_out,
            "stage": episode.stage.value,
            "probe_attempt": episode.probe_attempt,
            "dispatches": episode.dispatch_count,
            "error": episode.error,
        },
        "claims": [
            {"stage": c.stage.value, "attempt": c.probe_attempt, "status": c.status.value, "worker": c.worker, "takeovers": c.takeovers,
             "transient_failures": c.transient_failures, "seconds": _f(c.duration_s), "error": c.error}
            for c in claims
        ],
        "attempts": [
            {"attempt": a.attempt, "passed": a.passed, "model": a.model_name, "agent_tokens": a.agent_tokens, "errors": a.errors, "workspace": a.workspace_uri}
            for a in attempts
        ],
        "inner_job": None if job is None else {
            "name": job.name, "backend": job.backend, "simulated": job.simulated, "external_id": job.external_id, "status": job.status.value,
            "launch_count": job.launch_count, "train_seconds": _f(job.train_seconds), "checkpoint": job.checkpoint_uri, "error": job.error,
        },
        "evaluation": None if evaluation is None else {
            "backend": evaluation.backend, "simulated": evaluation.simulated, "base": evaluation.base_score, "trained": evaluation.trained_score,
            "ci": [evaluation.ci_low, evaluation.ci_high], "n": evaluation.n_items,
        },
        "reward": None if reward is None else {
            "total": reward.total, "job": reward.job, "validation": reward.validation, "efficiency": reward.efficiency, "speed": reward.speed,
            "raw_improvement": reward.raw_improvement,
        },
        "costs": [{"source": c.source, "description": c.description, "quantity": c.quantity, "unit": c.unit, "usd": float(c.amount_usd)} for c in costs],
        "cost_usd_total": float(sum(float(c.amount_usd) for c in costs)),
    }
