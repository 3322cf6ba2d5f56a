"""What the Prometheus exporter (`metarl.metrics`) reads on every scrape: cheap aggregates over all runs, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select

from metarl.store.db import session_scope
from metarl.store.records import ClaimStatus, CostEntry, Episode, Run, StageClaim


@dataclass(frozen=True)
class StageEpisodes:
    """Episodes of one run at one stage."""

    run_name: str
    run_id: str
    stage: str
    episodes: int


@dataclass(frozen=True)
class RunPolicyVersion:
    """A run's policy version: the current one while it runs, the last one once it ended."""

    run_name: str
    run_id: str
    policy_version: int


@dataclass(frozen=True)
class CostTotal:
    """Dollars in the cost ledger from one source, simulated or not."""

    source: str
    simulated: bool
    usd: float


@dataclass(frozen=True)
class StageLatencies:
    """Durations of the finished (done) claims of one stage: how many, their sum, and how many took at most each bucket bound."""

    stage: str
    claims: int
    seconds: float
    at_most: tuple[int, ...]
    """One count per bound of the `buckets` passed to :func:`read_metrics`, in that order."""


@dataclass(frozen=True)
class MetricsReading:
    """One scrape's reads of the records."""

    stage_episodes: list[StageEpisodes]
    policy_versions: list[RunPolicyVersion]
    costs: list[CostTotal]
    latencies: list[StageLatencies]


def read_metrics(database_url: str, buckets: Sequence[float]) -> MetricsReading:
    """Episodes per run and stage, policy versions, cost totals and stage latency histograms with these bucket bounds (seconds)."""
    with session_scope(database_url) as session:
        stages = [
            StageEpisodes(run_name, run_id, stage.value, count)
            for run_name, run_id, stage, count in session.execute(
                select(Run.name, Run.id, Episode.stage, func.count()).join(Run, Run.id == Episode.run_id).group_by(Run.name, Run.id, Episode.stage)
            ).all()
        ]
        versions = [
            RunPolicyVersion(run_name, run_id, policy_version)
            for run_name, run_id, policy_version in session.execute(select(Run.name, Run.id, Run.policy_version)).all()
        ]
        costs = [
            CostTotal(source, bool(simulated), float(total or 0))
            for source, simulated, total in session.execute(
                select(CostEntry.source, CostEntry.simulated, func.sum(CostEntry.amount_usd)).group_by(CostEntry.source, CostEntry.simulated)
            ).all()
        ]
        finished = (StageClaim.status == ClaimStatus.done) & StageClaim.duration_s.is_not(None)
        columns = [func.count().filter(StageClaim.duration_s <= bound) for bound in buckets]
        latencies = [
            StageLatencies(stage.value, int(total), float(seconds or 0.0), tuple(int(value) for value in cumulative))
            for stage, total, seconds, *cumulative in session.execute(
                select(StageClaim.stage, func.count(), func.coalesce(func.sum(StageClaim.duration_s), 0.0), *columns).where(finished).group_by(StageClaim.stage)
            ).all()
        ]
    return MetricsReading(stages, versions, costs, latencies)
