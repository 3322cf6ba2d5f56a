"""The exactly-once checks on a run's records (the foundation's crash acceptance), for tests, drills and benchmarks.

After any crash and `metarl resume`, a finished run must hold: every episode once, ended (done or
failed); one claim per (episode, stage, probe attempt), none left open; one probe attempt row per
attempt (one fewer when the episode failed in the agent stage); at most one inner job per episode,
launched at most once, none left launching or running by an ended episode, and exactly the jobs
the simulated cloud saw launched (when its folder is given); one reward per finished episode; probe attempts and rewards under their episode's run id; no
idempotency key billed twice; the run's spend total equal to its ledger; outer steps numbered 1..n without gaps.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metarl.store.records import ClaimStatus, CostEntry, Episode, InnerJob, InnerJobStatus, OuterStep, ProbeAttempt, Reward, RunSpend, Stage, StageClaim

UNFINISHED_JOB_STATUSES = (InnerJobStatus.launching, InnerJobStatus.running)


def sim_cloud_launches(artifacts_root: Path) -> list[str]:
    """Names of the jobs the simulated cloud launched (one record file per launch, under `<root>/sim-cloud`)."""
    return sorted(path.stem for path in artifacts_root.glob("sim-cloud/*.json"))


def exactly_once_violations(session: Session, run_id: str, artifacts_root: Path | None = None) -> list[str]:
    """Every breach of the exactly-once rules in run `run_id`, as sentences; empty when the records are clean."""
    problems: list[str] = []
    episodes = session.execute(select(Episode).where(Episode.run_id == run_id)).scalars().all()
    if not episodes:
        return ["the run has no episodes"]
    claims_of: dict[int, list[StageClaim]] = {}
    for claim in session.execute(select(StageClaim).where(StageClaim.run_id == run_id)).scalars():
        claims_of.setdefault(claim.episode_id, []).append(claim)
    attempts_of = dict(
        session.execute(
            select(ProbeAttempt.episode_id, func.count())
            .join(Episode, Episode.id == ProbeAttempt.episode_id)
            .where(Episode.run_id == run_id)
            .group_by(ProbeAttempt.episode_id)
        ).all()
    )
    jobs_of: dict[int, list[InnerJob]] = {}
    for job in session.execute(select(InnerJob).where(InnerJob.run_id == run_id)).scalars():
        jobs_of.setdefault(job.episode_id, []).append(job)
    rewards_of = dict(
        session.execute(
            select(Reward.episode_id, func.count()).join(Episode, Episode.id == Reward.episode_id).where(Episode.run_id == run_id).group_by(Reward.episode_id)
        ).all()
    )
    for episode in episodes:
        if episode.stage not in (Stage.done, Stage.failed):
            problems.append(f"episode {episode.id} is stuck at {episode.stage.value}")
        claims = claims_of.get(episode.id, [])
        claim_keys = [(c.stage.value, c.probe_attempt) for c in claims]
        if len(claim_keys) != len(set(claim_keys)):
            problems.append(f"episode {episode.id} has duplicate claims {sorted(claim_keys)}")
        open_claims = [(c.stage.value, c.probe_attempt, c.status.value) for c in claims if c.status not in (ClaimStatus.done, ClaimStatus.failed)]
        if open_claims:
            problems.append(f"episode {episode.id} has open claims {open_claims}")
        attempts = int(attempts_of.get(episode.id, 0))
        failed_in_agent = episode.stage == Stage.failed and attempts == episode.probe_attempt - 1
        if attempts != episode.probe_attempt and not failed_in_agent:
            problems.append(f"episode {episode.id} is at probe attempt {episode.probe_attempt} but has {attempts} submission rows")
        jobs = jobs_of.get(episode.id, [])
        if len(jobs) > 1:
            problems.append(f"episode {episode.id} has {len(jobs)} inner jobs")
        if any(job.launch_count > 1 for job in jobs):
            problems.append(f"inner job of episode {episode.id} launched {max(job.launch_count for job in jobs)} times")
        unfinished = [job.status.value for job in jobs if job.status in UNFINISHED_JOB_STATUSES]
        if unfinished and episode.stage in (Stage.done, Stage.failed):
            problems.append(
                f"episode {episode.id} ended ({episode.stage.value}) with its inner job still {unfinished[0]}: it holds a slot of its backend for good"
            )
        rewards = int(rewards_of.get(episode.id, 0))
        expected = 1 if episode.stage == Stage.done else 0
        if rewards != expected:
            problems.append(f"episode {episode.id} ({episode.stage.value}) has {rewards} reward rows, expected {expected}")
    for table in (ProbeAttempt, Reward):  # the run id written on the row is its episode's (migration 0007)
        astray = session.execute(
            select(func.count()).select_from(table).join(Episode, Episode.id == table.episode_id).where(Episode.run_id == run_id, table.run_id != run_id)
        ).scalar_one()
        if astray:
            problems.append(f"{astray} {table.__tablename__} row(s) of this run's episodes carry another run id")
    keys = session.execute(select(CostEntry.idempotency_key).where(CostEntry.run_id == run_id)).scalars().all()
    if len(keys) != len(set(keys)):
        problems.append(f"{len(keys) - len(set(keys))} charge(s) billed twice under the same idempotency key")
    problems.extend(spend_violations(session, run_id))
    names = session.execute(select(InnerJob.name).where(InnerJob.run_id == run_id)).scalars().all()
    if len(names) != len(set(names)):
        problems.append("two inner jobs share a name")
    if artifacts_root is not None:
        cloud = sim_cloud_launches(artifacts_root)
        if cloud != sorted(names):
            extra, missing = sorted(set(cloud) - set(names)), sorted(set(names) - set(cloud))
            problems.append(
                f"the simulated cloud's launches differ from the recorded inner jobs (launched, not recorded: {extra[:5]}; recorded, not launched: {missing[:5]})"
            )
    steps = session.execute(select(OuterStep.step).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
    if steps != list(range(1, len(steps) + 1)):
        problems.append(f"outer steps are not numbered 1..n: {steps[:10]}")
    return problems


def spend_violations(session: Session, run_id: str) -> list[str]:
    """The run's `run_spend` row against the sum and count of its ledger lines (they must agree; migration 0008's triggers keep them so)."""
    ledger_usd, ledger_lines = session.execute(select(func.coalesce(func.sum(CostEntry.amount_usd), 0), func.count()).where(CostEntry.run_id == run_id)).one()
    kept = session.execute(select(RunSpend.amount_usd, RunSpend.entries).where(RunSpend.run_id == run_id)).one_or_none()
    kept_usd, kept_lines = kept if kept is not None else (0, 0)
    if (kept_usd, kept_lines) != (ledger_usd, ledger_lines):
        return [f"run_spend holds ${kept_usd} over {kept_lines} line(s), the ledger ${ledger_usd} over {ledger_lines}"]
    return []


def assert_exactly_once(session: Session, run_id: str, artifacts_root: Path | None = None) -> None:
    """Raise AssertionError listing every exactly-once breach in run `run_id` (see the module docstring)."""
    problems = exactly_once_violations(session, run_id, artifacts_root)
    if problems:
        shown = "\n  - ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise AssertionError(f"run {run_id} breaks exactly-once ({len(problems)} problem(s)):\n  - {shown}{more}")
