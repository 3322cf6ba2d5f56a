"""Helpers for integration tests: fast sim configs and exactly-once checks on the records."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from schemas.records import ClaimStatus, CostEntry, Episode, InnerJob, OuterStep, ProbeAttempt, Reward, Stage, StageClaim

REPO = Path(__file__).resolve().parents[2]


def sim_config(
    tmp_path: Path,
    *,
    name: str = "itest",
    max_outer_steps: int = 2,
    train_median_s: float = 0.3,
    agent_median_s: float = 0.05,
    eval_median_s: float = 0.05,
    failure_rate: float = 0.05,
    lease_s: float = 3.0,
    redispatch_after_s: float = 3.0,
    in_flight: int = 8,
    extra: str = "",
) -> Path:
    """Write a fast simulator run config and return its path."""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""
[run]
name = "{name}"
seed = 7
tasks = ["addition", "reversal", "date_format"]
task_specs_dir = "{REPO / 'tasks_specs'}"
max_outer_steps = {max_outer_steps}

[backends.agent]
type = "sim"
duration = {{ median_s = {agent_median_s}, sigma = 0.3, max_s = 5.0 }}

[backends.train]
type = "sim"
duration = {{ median_s = {train_median_s}, sigma = 0.3, max_s = 30.0 }}
failure_rate = {failure_rate}
poll_interval_s = 0.2

[backends.eval]
type = "sim"
duration = {{ median_s = {eval_median_s}, sigma = 0.3, max_s = 5.0 }}

[backends.outer]
type = "sim"
duration = {{ median_s = 0.05, sigma = 0.1, max_s = 1.0 }}

[window]
in_flight = {in_flight}
tick_s = 0.2

[outer]
group_size = 2
groups_per_batch = 2

[artifacts]
root = "{tmp_path / 'artifacts'}"

[retries]
lease_s = {lease_s}
redispatch_after_s = {redispatch_after_s}
{extra}
"""
    )
    return path


def assert_exactly_once(session: Session, run_id: str, artifacts_root: Path | None = None) -> None:
    """Every episode finished once, one done claim per stage it passed, one inner job at most, no double billing."""
    episodes = session.execute(select(Episode).where(Episode.run_id == run_id)).scalars().all()
    assert episodes, "the run has no episodes"
    for episode in episodes:
        assert episode.stage in (Stage.done, Stage.failed), f"episode {episode.id} is stuck at {episode.stage}"
        claims = session.execute(select(StageClaim).where(StageClaim.episode_id == episode.id)).scalars().all()
        keys = [(c.stage, c.probe_attempt) for c in claims]
        assert len(keys) == len(set(keys)), f"episode {episode.id} has duplicate claims {keys}"
        assert all(c.status in (ClaimStatus.done, ClaimStatus.failed) for c in claims), f"episode {episode.id} has open claims"
        attempts = session.execute(select(func.count()).select_from(ProbeAttempt).where(ProbeAttempt.episode_id == episode.id)).scalar_one()
        assert attempts == episode.probe_attempt
        jobs = session.execute(select(InnerJob).where(InnerJob.episode_id == episode.id)).scalars().all()
        assert len(jobs) <= 1
        assert all(job.launch_count <= 1 for job in jobs), f"inner job of episode {episode.id} launched twice"
        rewards = session.execute(select(func.count()).select_from(Reward).where(Reward.episode_id == episode.id)).scalar_one()
        assert rewards == (1 if episode.stage == Stage.done else 0)
    keys = session.execute(select(CostEntry.idempotency_key).where(CostEntry.run_id == run_id)).scalars().all()
    assert len(keys) == len(set(keys))
    names = session.execute(select(InnerJob.name).where(InnerJob.run_id == run_id)).scalars().all()
    assert len(names) == len(set(names))
    cloud = sorted(path.stem for path in artifacts_root.glob("sim-cloud/*.json")) if artifacts_root else None
    if cloud is not None:
        assert cloud == sorted(names), "the simulated cloud's launches differ from the recorded inner jobs"
    steps = session.execute(select(OuterStep.step).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
    assert steps == list(range(1, len(steps) + 1))
