"""ORM reads for people: what the run report shows (the tables are made in metarl/report/tables.py), the run listing, one episode's story."""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from metarl.report.tables import STAGES, CostLine, ReportData, RunInfo, StageDuration, StepRecord, pick_metrics
from metarl.store.db import psycopg_connection
from metarl.store.records import ClaimStatus, CostEntry, Episode, EpisodeGroup, Evaluation, InnerJob, OuterStep, Run, Stage, StageClaim
from metarl.store.status import optional_float, run_status, unique_prefix


def load_report_data(session: Session, run_id: str) -> ReportData:
    """Header, costs, outer steps and stage durations of one run; LookupError if there is no such run."""
    status = run_status(psycopg_connection(session), run_id)  # in the session's transaction
    run = session.get(Run, run_id)
    steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
    held_out = {line["step"]: line["held_out_reward"] for line in status["outer_steps"]}
    return ReportData(
        run=RunInfo(
            id=status["run"]["id"],
            name=status["run"]["name"],
            status=status["run"]["status"],
            policy_version=status["run"]["policy_version"],
            created_at=status["run"]["created_at"],
            finished_at=status["run"]["finished_at"],
            message=status["run"]["message"],
        ),
        simulated=is_simulated(session, run_id),
        artifacts_root=(run.config.get("artifacts") or {}).get("root") if run is not None else None,
        episodes_by_stage=status["episodes_by_stage"],
        costs=[CostLine(**line) for line in status["costs"]],
        cost_usd_total=status["cost_usd_total"],
        steps=[
            StepRecord(
                step=step.step,
                status=step.status.value,
                n_episodes=step.n_episodes,
                policy_version_after=step.policy_version_after,
                metrics=with_held_out(pick_metrics(step.metrics or {}), held_out.get(step.step)),
            )
            for step in steps
        ],
        durations=stage_durations(session, run_id),
    )


def with_held_out(metrics: dict[str, float | None], held_out_reward: float | None) -> dict[str, float | None]:
    """The step's metrics with the held-out reward `metarl status` reads from the records, when there is one."""
    if held_out_reward is None:
        return metrics
    return {**metrics, "held_out_reward_mean": held_out_reward}


def stage_durations(session: Session, run_id: str) -> list[StageDuration]:
    """Seconds of every finished (done) agent, probe, train and eval claim of the episodes batched into an outer step."""
    rows = session.execute(
        select(OuterStep.step, StageClaim.stage, StageClaim.duration_s)
        .join(EpisodeGroup, EpisodeGroup.outer_step_id == OuterStep.id)
        .join(Episode, Episode.group_id == EpisodeGroup.id)
        .join(StageClaim, StageClaim.episode_id == Episode.id)
        .where(
            OuterStep.run_id == run_id,
            StageClaim.status == ClaimStatus.done,
            StageClaim.duration_s.is_not(None),
            StageClaim.stage.in_([Stage(name) for name in STAGES]),
        )
        .order_by(OuterStep.step, StageClaim.id)
    ).all()
    return [StageDuration(step=step, stage=stage.value, seconds=max(0.0, seconds or 0.0)) for step, stage, seconds in rows]  # type: ignore[arg-type]  # the query keeps STAGES only


def is_simulated(session: Session, run_id: str) -> bool:
    """Whether any inner job, evaluation or charge of the run came from a simulator."""
    simulated_eval = exists().where(Evaluation.simulated.is_(True), Evaluation.episode_id == Episode.id, Episode.run_id == run_id)
    simulated_job = exists().where(InnerJob.simulated.is_(True), InnerJob.run_id == run_id)
    simulated_cost = exists().where(CostEntry.simulated.is_(True), CostEntry.run_id == run_id)
    return bool(session.execute(select(or_(simulated_eval, simulated_job, simulated_cost))).scalar_one())


def list_runs(session: Session) -> list[dict[str, Any]]:
    """The 50 newest runs, each with `short_id`: the id's shortest unique prefix (:func:`unique_prefix`)."""
    from sqlalchemy import func, select

    from metarl.store.ledger import run_total_usd
    from metarl.store.records import Run

    in_order = func.lower(Run.id).collate("C")
    neighbours = select(
        Run.id.label("id"), func.lag(Run.id).over(order_by=in_order).label("before"), func.lead(Run.id).over(order_by=in_order).label("after")
    ).subquery()
    found = session.execute(
        select(Run, neighbours.c.before, neighbours.c.after).join(neighbours, neighbours.c.id == Run.id).order_by(Run.created_at.desc()).limit(50)
    ).all()
    return [
        {
            "id": run.id,
            "short_id": unique_prefix(run.id, (before, after)),
            "name": run.name,
            "status": run.status.value,
            "policy_version": run.policy_version,
            "created_at": run.created_at.isoformat(),
            "cost_usd": round(run_total_usd(session, run.id), 4),
        }
        for run, before, after in found
    ]


def episode_report(session: Session, episode_id: int) -> dict[str, Any]:
    """What happened to one episode and what it cost: stage claims, submissions, inner job, scores, reward, charges."""
    from sqlalchemy import select

    from metarl.store.records import CostEntry, Episode, Evaluation, InnerJob, ProbeAttempt, Reward, StageClaim

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
            {
                "stage": c.stage.value,
                "attempt": c.probe_attempt,
                "status": c.status.value,
                "worker": c.worker,
                "takeovers": c.takeovers,
                "transient_failures": c.transient_failures,
                "seconds": optional_float(c.duration_s),
                "error": c.error,
            }
            for c in claims
        ],
        "attempts": [
            {
                "attempt": a.attempt,
                "passed": a.passed,
                "model": a.model_name,
                "agent_tokens": a.agent_tokens,
                "errors": a.errors,
                "workspace": a.workspace_uri,
                "isolation": a.isolation,
            }
            for a in attempts
        ],
        "inner_job": None
        if job is None
        else {
            "name": job.name,
            "backend": job.backend,
            "simulated": job.simulated,
            "external_id": job.external_id,
            "status": job.status.value,
            "launch_count": job.launch_count,
            "train_seconds": optional_float(job.train_seconds),
            "checkpoint": job.checkpoint_uri,
            "error": job.error,
        },
        "evaluation": None
        if evaluation is None
        else {
            "backend": evaluation.backend,
            "simulated": evaluation.simulated,
            "base": evaluation.base_score,
            "trained": evaluation.trained_score,
            "ci": [evaluation.ci_low, evaluation.ci_high],
            "n": evaluation.n_items,
        },
        "reward": None
        if reward is None
        else {
            "total": reward.total,
            "job": reward.job,
            "validation": reward.validation,
            "efficiency": reward.efficiency,
            "speed": reward.speed,
            "raw_improvement": reward.raw_improvement,
        },
        "costs": [{"source": c.source, "description": c.description, "quantity": c.quantity, "unit": c.unit, "usd": float(c.amount_usd)} for c in costs],
        "cost_usd_total": float(sum(float(c.amount_usd) for c in costs)),
    }
