"""The unit of work a stage message starts with: its claim, and what the stage reads with it.

On one pooled connection in autocommit (`workers.stages` calls :func:`claim_stage_work`):

1. the episode's stage row with the run's config and the task spec, and the plain claim (a first
   claim, or this worker's continuation): one statement (`metarl.store.episodes.stage_row_and_claim`);
2. when the plain claim did not apply (a duplicate message, a takeover): the claim rules, one
   statement (`metarl.store.claims.claim_stage`);
3. the stage's loader, with :class:`ClaimReads`: the reads (or the inner job's creation) its work needs.

The claim rules themselves are `metarl.store.claims`; the move that ends the stage is
`metarl.store.episodes.move_episode`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from metarl.interfaces import BaseScoreKey, EpisodeContext
from metarl.store.baselines import cached_baseline
from metarl.store.claims import Claim, ClaimRefused, claim_stage, heartbeat
from metarl.store.db import SqlTarget, run_sql, session_scope, sql_transaction
from metarl.store.episodes import StageRow, config_and_task, stage_context, stage_row_and_claim
from metarl.store.inner_jobs import CreationBlock, InnerJobRow, create_within_limits
from metarl.store.records import Stage
from schemas.run_config import RunConfig
from schemas.states import ENDED_RUN_STATUSES
from schemas.task_spec import TaskSpec

Loaded = TypeVar("Loaded")


@dataclass(frozen=True)
class StageClaimed:
    """A stage this worker now holds, with what was read with its claim (`ctx`: the backends' view of the episode)."""

    row: StageRow
    claim: Claim
    config: RunConfig
    task: TaskSpec
    ctx: EpisodeContext


@dataclass(frozen=True)
class StageSkipped:
    """Why a stage message does nothing: no such episode, the episode is elsewhere, its run ended, or the claim was refused."""

    reason: str


@dataclass(frozen=True)
class StageWork(Generic[Loaded]):
    """A claimed stage and what its loader returned."""

    claimed: StageClaimed
    loaded: Loaded | None


class ClaimReads:
    """What a stage's loader does on its claim's connection (in autocommit: each call is one statement of its own)."""

    __slots__ = ("_sql",)

    def __init__(self, sql: SqlTarget):
        self._sql = sql

    def create_inner_job(
        self, *, run_id: str, episode_id: int, name: str, backend: str, simulated: bool, model_name: str, max_usd: float, capacity: int
    ) -> InnerJobRow | CreationBlock:
        """`metarl.store.inner_jobs.create_within_limits` (the backend's advisory lock is held only while the statement runs)."""
        return create_within_limits(
            self._sql,
            run_id=run_id,
            episode_id=episode_id,
            name=name,
            backend=backend,
            simulated=simulated,
            model_name=model_name,
            max_usd=max_usd,
            capacity=capacity,
        )

    def cached_base_score(self, key: BaseScoreKey) -> float | None:
        """`metarl.store.baselines.cached_baseline`: the stored base score for `key`, if any."""
        return cached_baseline(self._sql, key)


StageLoader = Callable[[ClaimReads, StageClaimed], Loaded]
"""What a stage reads (or creates) after its claim, on the claim's connection."""


def claim_stage_work(
    database_url: str,
    *,
    stage: Stage,
    episode_id: int,
    probe_attempt: int,
    token: str | None,
    worker: str,
    load: StageLoader[Loaded] | None = None,
) -> StageWork[Loaded] | StageSkipped:
    """Claim the stage (see the module docstring) and run `load` with the claim's reads; or say why the message is skipped."""
    with sql_transaction(database_url, autocommit=True) as sql:
        row, claim = stage_row_and_claim(sql, episode_id=episode_id, stage=stage, probe_attempt=probe_attempt, worker=worker, token=token)
        if row is None:
            return StageSkipped("no such episode")
        if row.stage != stage or row.probe_attempt != probe_attempt:
            return StageSkipped(f"episode is elsewhere ({row.stage.value}, attempt {row.probe_attempt})")
        if row.run_status in ENDED_RUN_STATUSES:
            return StageSkipped(f"its run is {row.run_status.value}")
        config, task = config_and_task(row)
        if claim is None:  # a duplicate message or a takeover: the claim rules decide
            try:
                claim = claim_stage(
                    sql,
                    run_id=row.run_id,
                    episode_id=episode_id,
                    stage=stage,
                    probe_attempt=probe_attempt,
                    worker=worker,
                    lease_s=config.retries.lease_s,
                    token=token,
                )
            except ClaimRefused as refused:
                return StageSkipped(refused.reason)
        claimed = StageClaimed(row=row, claim=claim, config=config, task=task, ctx=stage_context(row, config, task))
        return StageWork(claimed, load(ClaimReads(sql), claimed) if load is not None else None)


NOTE_CLAIM_WAIT_SQL = "UPDATE stage_claims SET error = %(error)s WHERE id = %(claim_id)s"
NOTE_EPISODE_WAIT_SQL = "UPDATE episodes SET error = %(error)s WHERE id = %(episode_id)s AND stage = %(stage)s AND probe_attempt = %(probe_attempt)s"
"""A storage wait shown on the claim and on the episode (`note_storage_wait`), sent as written."""


def note_storage_wait(database_url: str, claim: Claim, error: str) -> bool:
    """The stage waits for storage space: renew its claim and show `error` on the claim and on the episode (`metarl status`),
    in one transaction. False (nothing written) when the claim was taken over."""
    with session_scope(database_url) as session:
        if not heartbeat(session, claim):
            return False
        params = {"claim_id": claim.claim_id, "episode_id": claim.episode_id, "stage": claim.stage.value, "probe_attempt": claim.probe_attempt, "error": error}
        run_sql(session, NOTE_CLAIM_WAIT_SQL, params)
        run_sql(session, NOTE_EPISODE_WAIT_SQL, params)
    return True
