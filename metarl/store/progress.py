"""What the live progress display of `metarl run` and `metarl resume` reads of a run, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from metarl.domain.transitions import TERMINAL_STAGES
from metarl.store.db import session_scope
from metarl.store.ledger import run_total_usd
from metarl.store.records import Episode, OuterStatus, OuterStep, Run
from metarl.store.status import newest_held_out
from metarl.store.step_metrics import held_out_reward_by_version


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


def read_progress(database_url: str, run_id: str) -> ProgressSnapshot:
    """The run's status, episodes ended, newest done outer step, rewards and cost."""
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        total, done = session.execute(select(func.count(), func.count().filter(Episode.stage.in_(TERMINAL_STAGES))).where(Episode.run_id == run_id)).one()
        last = session.execute(
            select(OuterStep).where(OuterStep.run_id == run_id, OuterStep.status == OuterStatus.done).order_by(OuterStep.step.desc()).limit(1)
        ).scalar_one_or_none()
        held_out = newest_held_out(held_out_reward_by_version(session, run_id))  # as `metarl status` reads it
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
        )
