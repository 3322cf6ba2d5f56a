"""Loads what the run report shows from the records of one run (the tables are made in metarl/report/tables.py)."""

from __future__ import annotations

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from metarl.report.tables import STAGES, CostLine, ReportData, RunInfo, StageDuration, StepRecord, pick_metrics
from metarl.store.db import psycopg_connection
from metarl.store.records import ClaimStatus, CostEntry, Episode, EpisodeGroup, Evaluation, InnerJob, OuterStep, Run, Stage, StageClaim
from metarl.store.status import run_status


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
