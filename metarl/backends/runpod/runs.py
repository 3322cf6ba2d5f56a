"""What the Runpod backend needs of the run database, as an interface: the store implements it
(`metarl.store.runpod_runs.RunpodRunStore`), the registry injects it (`metarl.composition`).

The backend itself holds no connection and no SQL: it bills pods, checks a run's budget and state,
serialises its pool and reaper across processes, and asks which of a run's jobs still live, through
these calls.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from metarl.interfaces import BaseModelIdentity, CostItem
from schemas.run_config import RunConfig
from schemas.states import RunStatus
from schemas.task_spec import TaskSpec


@dataclass(frozen=True)
class RunState:
    """What decides whether a run still launches jobs: its status and whether a stop was asked for."""

    status: RunStatus
    stop_requested: bool


@dataclass(frozen=True)
class ReapView:
    """What the orphan reaper needs of the run a pod's name leads to: the run, its config and its live jobs' names
    (launching or running, their episode still at train)."""

    run_id: str
    status: RunStatus
    config: RunConfig
    live_jobs: frozenset[str]


class RunpodRuns(Protocol):
    """The run database as the Runpod backend sees it."""

    name: str
    """Which database this is: a key for what a process keeps per database (the reaper's last run)."""

    def record_costs(self, run_id: str, episode_id: int | None, items: list[CostItem]) -> None:
        """Write charges to the ledger now, each once (a replayed charge is not billed again)."""
        ...

    def run_total_usd(self, run_id: str) -> float:
        """Dollars recorded for the run so far."""
        ...

    def run_state(self, run_id: str) -> RunState | None:
        """The run's status and stop request (None: no such run)."""
        ...

    def base_score_cached(self, task: TaskSpec, model_name: str, eval_backend: str, identity: BaseModelIdentity) -> bool:
        """Whether the base score of (task, model) with this eval backend and identity is stored."""
        ...

    def holding_lock(self, key: int) -> AbstractContextManager[None]:
        """Hold the cross-process lock `key` for the block (waiting for it)."""
        ...

    def trying_lock(self, key: int) -> AbstractContextManager[bool]:
        """Try the cross-process lock `key` without waiting: the block gets whether it holds it (and holds it to its end)."""
        ...

    def reap_view(self, run_key: str) -> ReapView | None:
        """The run whose id starts with `run_key` (a pod name's run part), or None when no single run of this database does."""
        ...
