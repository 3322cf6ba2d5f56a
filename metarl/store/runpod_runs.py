"""The run database as the Runpod train backend sees it (`metarl.interfaces.RunpodRuns`).

Each call is a unit of work of its own; the locks are PostgreSQL transaction-level advisory locks,
held by a transaction kept open for the caller's block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import func, select

from metarl.interfaces import BaseModelIdentity, CostItem, ReapView, RunState
from metarl.store.baselines import base_score_cached, base_score_key
from metarl.store.db import session_scope
from metarl.store.episodes import record_costs, run_config_of
from metarl.store.ledger import run_total_usd
from metarl.store.records import Episode, InnerJob, InnerJobStatus, Run, Stage
from schemas.task_spec import TaskSpec


class RunpodRunStore:
    """`RunpodRuns` on the run database at `database_url`."""

    def __init__(self, database_url: str):
        self.database_url = database_url
        self.name = database_url

    def record_costs(self, run_id: str, episode_id: int | None, items: list[CostItem]) -> None:
        with session_scope(self.database_url) as session:
            record_costs(session, run_id, episode_id, items, simulated=False)

    def run_total_usd(self, run_id: str) -> float:
        with session_scope(self.database_url) as session:
            return run_total_usd(session, run_id)

    def run_state(self, run_id: str) -> RunState | None:
        with session_scope(self.database_url) as session:
            run = session.get(Run, run_id)
            return None if run is None else RunState(status=run.status, stop_requested=run.stop_requested)

    def base_score_cached(self, task: TaskSpec, model_name: str, eval_backend: str, identity: BaseModelIdentity) -> bool:
        return base_score_cached(self.database_url, base_score_key(task, model_name, eval_backend, identity))

    @contextmanager
    def holding_lock(self, key: int) -> Iterator[None]:
        with session_scope(self.database_url) as session:
            session.execute(select(func.pg_advisory_xact_lock(key)))
            yield

    @contextmanager
    def trying_lock(self, key: int) -> Iterator[bool]:
        with session_scope(self.database_url) as session:
            yield bool(session.execute(select(func.pg_try_advisory_xact_lock(key))).scalar_one())

    def reap_view(self, run_key: str) -> ReapView | None:
        with session_scope(self.database_url) as session:
            runs = session.execute(select(Run).where(Run.id.like(f"{run_key}%"))).scalars().all()
            if len(runs) != 1:
                return None
            run = runs[0]
            live = session.execute(
                select(InnerJob.name)
                .join(Episode, Episode.id == InnerJob.episode_id)
                .where(
                    InnerJob.run_id == run.id,
                    InnerJob.status.in_((InnerJobStatus.launching, InnerJobStatus.running)),
                    Episode.stage == Stage.train,
                )
            ).scalars()
            return ReapView(run_id=run.id, status=run.status, config=run_config_of(run), live_jobs=frozenset(live))
