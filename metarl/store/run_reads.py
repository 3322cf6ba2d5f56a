"""Small reads of one run's records for the fault drills and the benchmarks: counts, ids, the run row. Each is one transaction."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select

from metarl.store.db import session_scope
from metarl.store.exactly_once import exactly_once_violations
from metarl.store.records import ClaimStatus, Episode, OuterStatus, OuterStep, Run, Stage, StageClaim


def count_episodes(database_url: str, run_id: str, stages: Iterable[Stage] | None = None) -> int:
    """Episodes of the run, optionally only those at `stages`."""
    statement = select(func.count()).select_from(Episode).where(Episode.run_id == run_id)
    if stages is not None:
        statement = statement.where(Episode.stage.in_(tuple(stages)))
    with session_scope(database_url) as session:
        return int(session.execute(statement).scalar_one())


def running_claims(database_url: str, run_id: str, stage: Stage | None = None) -> int:
    """Stage claims of the run that are held right now (status running)."""
    statement = select(func.count()).select_from(StageClaim).where(StageClaim.run_id == run_id, StageClaim.status == ClaimStatus.running)
    if stage is not None:
        statement = statement.where(StageClaim.stage == stage)
    with session_scope(database_url) as session:
        return int(session.execute(statement).scalar_one())


def closed_claims(database_url: str, run_id: str) -> int:
    """Stage claims of the run that closed (done or failed): the stage transitions so far."""
    with session_scope(database_url) as session:
        return int(
            session.execute(
                select(func.count()).select_from(StageClaim).where(StageClaim.run_id == run_id, StageClaim.status.in_((ClaimStatus.done, ClaimStatus.failed)))
            ).scalar_one()
        )


def first_transition_after(database_url: str, run_id: str, since: dt.datetime) -> dt.datetime | None:
    """When the first stage finished (its claim closed and the episode moved, one transaction) after `since`."""
    with session_scope(database_url) as session:
        return session.execute(
            select(func.min(StageClaim.finished_at)).where(
                StageClaim.run_id == run_id, StageClaim.finished_at > since, StageClaim.status.in_((ClaimStatus.done, ClaimStatus.failed))
            )
        ).scalar_one()


def run_record(database_url: str, run_id: str) -> Run:
    """The run's row (detached: read its columns, change nothing); AssertionError when there is no such run."""
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert run is not None, f"no run {run_id}"
        return run


@dataclass(frozen=True)
class InFlight:
    """A run's active episodes per stage and its held stage claims, read together."""

    episodes_by_stage: dict[str, int]
    held_claims: int


def in_flight(database_url: str, run_id: str) -> InFlight:
    """Active episodes per stage (agent, probe, train, eval) and stage claims held (running), in one transaction."""
    with session_scope(database_url) as session:
        stages = dict(
            session.execute(
                select(Episode.stage, func.count())
                .where(Episode.run_id == run_id, Episode.stage.in_((Stage.agent, Stage.probe, Stage.train, Stage.eval)))
                .group_by(Episode.stage)
            ).all()
        )
        held = session.execute(
            select(func.count()).select_from(StageClaim).where(StageClaim.run_id == run_id, StageClaim.status == ClaimStatus.running)
        ).scalar_one()
    return InFlight({stage.value: int(n) for stage, n in stages.items()}, int(held))


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: its status, episodes, claim takeovers and exactly-once breaches (`metarl.store.exactly_once`)."""

    status: str
    episodes: int
    takeovers: int
    violations: list[str]


def run_outcome(database_url: str, run_id: str, artifacts_root: Path | None = None) -> RunOutcome:
    """The run's outcome, read in one transaction."""
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert run is not None, f"no run {run_id}"
        status = run.status.value
        episodes = session.execute(select(func.count()).select_from(Episode).where(Episode.run_id == run_id)).scalar_one()
        takeovers = session.execute(select(func.coalesce(func.sum(StageClaim.takeovers), 0)).where(StageClaim.run_id == run_id)).scalar_one()
        violations = exactly_once_violations(session, run_id, artifacts_root)
    return RunOutcome(status, int(episodes), int(takeovers), violations)


def count_outer_steps(database_url: str, run_id: str, status: OuterStatus | None = None) -> int:
    """Outer steps of the run, optionally only those with `status`."""
    statement = select(func.count()).select_from(OuterStep).where(OuterStep.run_id == run_id)
    if status is not None:
        statement = statement.where(OuterStep.status == status)
    with session_scope(database_url) as session:
        return int(session.execute(statement).scalar_one())


def episode_ids(database_url: str, run_id: str) -> list[int]:
    """The run's episode ids, oldest first."""
    with session_scope(database_url) as session:
        return list(session.execute(select(Episode.id).where(Episode.run_id == run_id).order_by(Episode.id)).scalars())


def stage_claim_tokens(database_url: str, run_id: str, stage: Stage) -> dict[int, str]:
    """Episode id -> token of its claim on `stage` (one per episode for a stage run once, as the train submit)."""
    with session_scope(database_url) as session:
        return dict(session.execute(select(StageClaim.episode_id, StageClaim.token).where(StageClaim.run_id == run_id, StageClaim.stage == stage)).all())


def outer_step_ids(database_url: str, run_id: str) -> list[int]:
    """The run's outer step ids (in the order the database returns them)."""
    with session_scope(database_url) as session:
        return list(session.execute(select(OuterStep.id).where(OuterStep.run_id == run_id)).scalars())
