"""What the live progress display of `metarl run` and `metarl resume` reads of a run, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metarl.domain.transitions import TERMINAL_STAGES
from metarl.store.db import session_scope
from metarl.store.ledger import run_total_usd
from metarl.store.records import Episode, InnerJob, OuterStatus, OuterStep, Run, Stage
from metarl.store.status import newest_held_out
from metarl.store.step_metrics import held_out_reward_by_version
from schemas.states import SLOT_HOLDING_JOB_STATUSES


@dataclass(frozen=True)
class ProgressSnapshot:
    """The run as the progress display shows it ("?" and zeros for a run that is not there)."""

    status: str
    episodes_done: int
    episodes_total: int
    outer_step: int
    """The newest outer step that is done (0: none yet)."""
    max_outer_steps: int
    reward: float | None
    """Mean reward of that step's batch."""
    held_out: float | None
    """Mean reward of the held-out groups of `held_out_version`, the newest policy version with evaluated ones."""
    held_out_version: int | None
    cost_usd: float
    train_running: int = 0
    """The run's inner jobs that hold a slot of its train backend (launching or running)."""
    train_waiting: int = 0
    """The run's episodes at the train stage with no inner job yet: the backend's capacity was full when they asked."""
    slots_held_elsewhere: int = 0
    """Slots of the run's train backend held by other runs' inner jobs (0 unless some episode waits)."""


def train_slots(session: Session, run: Run, waiting: int) -> tuple[int, int]:
    """(running, held elsewhere) of `ProgressSnapshot` for the run's train backend; other runs are counted only while
    some of the run's episodes wait (`waiting` > 0), by the capacity count's own rule (`metarl_inner_job_holds_slot`,
    migration 0015: a job of a driven run, or one a worker still polls)."""
    running = session.scalar(select(func.count()).where(InnerJob.run_id == run.id, InnerJob.status.in_(SLOT_HOLDING_JOB_STATUSES))) or 0
    backend = (run.config.get("backends") or {}).get("train", {}).get("type")
    if not waiting or backend is None:
        return running, 0
    elsewhere = session.scalar(
        select(func.count())
        .select_from(InnerJob)
        .where(
            InnerJob.backend == backend,
            InnerJob.status.in_(SLOT_HOLDING_JOB_STATUSES),
            InnerJob.run_id != run.id,
            func.metarl_inner_job_holds_slot(InnerJob.id),
        )
    )
    return running, elsewhere or 0


def read_progress(database_url: str, run_id: str) -> ProgressSnapshot:
    """The run's status, episodes ended, newest done outer step, rewards, cost and its train backend's slots."""
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        has_job = select(InnerJob.id).where(InnerJob.episode_id == Episode.id).exists()
        total, done, waiting = session.execute(
            select(func.count(), func.count().filter(Episode.stage.in_(TERMINAL_STAGES)), func.count().filter(Episode.stage == Stage.train, ~has_job)).where(
                Episode.run_id == run_id
            )
        ).one()
        last = session.execute(
            select(OuterStep).where(OuterStep.run_id == run_id, OuterStep.status == OuterStatus.done).order_by(OuterStep.step.desc()).limit(1)
        ).scalar_one_or_none()
        held_out = newest_held_out(held_out_reward_by_version(session, run_id))  # as `metarl status` reads it
        running, elsewhere = train_slots(session, run, waiting) if run else (0, 0)
        return ProgressSnapshot(
            status=run.status.value if run else "?",
            episodes_done=done,
            episodes_total=total,
            outer_step=last.step if last else 0,
            max_outer_steps=run.config["run"]["max_outer_steps"] if run else 0,
            reward=last.metrics.get("reward_mean") if last else None,
            held_out=held_out["reward"] if held_out else None,
            held_out_version=held_out["policy_version"] if held_out else None,
            cost_usd=run_total_usd(session, run_id),
            train_running=running,
            train_waiting=waiting,
            slots_held_elsewhere=elsewhere,
        )
