"""The outer-update task (queue `outer`, one at a time): claims its step, updates, saves the new version."""

from __future__ import annotations

import datetime as dt
import logging
import uuid

from celery import Task
from sqlalchemy import or_, select, update

from metarl.backends import registry
from metarl.backends.base import OuterBatchEpisode, PolicySample
from metarl.claims import utcnow
from metarl.db import session_scope
from metarl.episodes import record_costs, run_config_of
from orchestrator.step_metrics import outer_step_metrics
from schemas.records import Episode, EpisodeGroup, OuterStatus, OuterStep, PolicyVersion, ProbeAttempt, Reward, Run
from workers.app import app
from workers.common import database_url, worker_name

log = logging.getLogger("metarl.outer")


def claim_outer_step(outer_step_id: int, lease_s: float) -> str | None:
    """CAS the step from pending (or running with a dead heartbeat) to running under a new token."""
    token = str(uuid.uuid4())
    now = utcnow()
    with session_scope(database_url()) as session:
        taken = session.execute(
            update(OuterStep)
            .where(
                OuterStep.id == outer_step_id,
                or_(
                    OuterStep.status == OuterStatus.pending,
                    (OuterStep.status == OuterStatus.running) & (OuterStep.heartbeat_at < now - dt.timedelta(seconds=lease_s)),
                ),
            )
            .values(status=OuterStatus.running, worker=worker_name(), token=token, heartbeat_at=now)
            .returning(OuterStep.id)
        ).scalar_one_or_none()
    return token if taken is not None else None


@app.task(bind=True, name="metarl.outer.update", queue="outer", max_retries=None)
def outer_update(self: Task, outer_step_id: int) -> str:
    """Run one importance-sampling update on the step's batch and publish the next policy version."""
    url = database_url()
    with session_scope(url) as session:
        step = session.get(OuterStep, outer_step_id)
        if step is None:
            return "missing"
        run = session.get(Run, step.run_id)
        config = run_config_of(run)
    token = claim_outer_step(outer_step_id, config.retries.lease_s)
    if token is None:
        return "skipped"
    with session_scope(url) as session:
        step = session.get(OuterStep, outer_step_id)
        rows = session.execute(
            select(Episode.id, Episode.group_id, Episode.policy_version, Reward.total)
            .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
            .join(Reward, Reward.episode_id == Episode.id)
            .where(EpisodeGroup.outer_step_id == outer_step_id)
            .order_by(Episode.id)
        ).all()
        samples: dict[int, list[PolicySample]] = {}
        for attempt in session.execute(
            select(ProbeAttempt).where(ProbeAttempt.episode_id.in_([r[0] for r in rows])).order_by(ProbeAttempt.attempt)
        ).scalars():
            if attempt.policy_tokens is None:
                continue
            samples.setdefault(attempt.episode_id, []).append(
                PolicySample(tokens=attempt.policy_tokens, logprobs=attempt.behaviour_logprobs, prompt_length=attempt.prompt_length)
            )
        batch = [OuterBatchEpisode(episode_id=r[0], group_id=r[1], policy_version=r[2], reward=r[3], samples=samples.get(r[0], [])) for r in rows]
        run_id, step_no, before = step.run_id, step.step, step.policy_version_before
        base_state_uri = session.execute(
            select(PolicyVersion.state_uri).where(PolicyVersion.run_id == run_id, PolicyVersion.version == before)
        ).scalar_one_or_none()
    backend = registry.outer_backend(config)
    result = backend.update(run_id, step_no, before + 1, batch, config, base_state_uri)
    with session_scope(url) as session:
        metrics = outer_step_metrics(session, outer_step_id, run_id)
        metrics.update({f"backend_{key}": value for key, value in result.metrics.items()})
        finished = session.execute(
            update(OuterStep)
            .where(OuterStep.id == outer_step_id, OuterStep.token == token, OuterStep.status == OuterStatus.running)
            .values(status=OuterStatus.done, policy_version_after=before + 1, finished_at=utcnow(), metrics=metrics)
            .returning(OuterStep.id)
        ).scalar_one_or_none()
        if finished is None:
            session.rollback()
            return "taken over"
        session.add(PolicyVersion(run_id=run_id, version=before + 1, backend=backend.name, state_uri=result.state_uri, outer_step_id=outer_step_id))
        session.execute(update(Run).where(Run.id == run_id, Run.policy_version == before).values(policy_version=before + 1))
        record_costs(session, run_id, None, result.costs, backend.simulated)
    log.info("outer step %s done: policy version %s", step_no, before + 1)
    return "updated"
