"""The store: every SQL statement, session and connection of metarl (PostgreSQL is the source of truth).

This package is the store's one front door: the workers, the orchestrator, the CLI, the composition and the
benchmarks import what they use from here, never from a module inside (`tests/unit/test_store_front_door.py`
checks). Names load on first use, so `metarl status` reads a run without importing SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metarl.store.baselines import base_score_key, baseline_lookup, store_base_score
    from metarl.store.claims import Claim, OuterClaim, claim_outer_lease, count_transient_failure, note_claim_error, renew_claim, renew_outer_step, utcnow
    from metarl.store.db import DATABASE_UNREACHABLE, current_revision, dispose_engines, unreachable_reason, warm_pool
    from metarl.store.db import upgrade as upgrade_database
    from metarl.store.episodes import StaleTransition, cost_records, move_episode, reward_params, reward_record, unscored_reward_record
    from metarl.store.errors import StoreError
    from metarl.store.failed_runs import NotRetryable
    from metarl.store.inner_jobs import CreationBlock, InnerJobRow, inner_job_name, launch_record, lost_record, note_capacity_wait, poll_record
    from metarl.store.metrics_reads import read_metrics
    from metarl.store.migration_head import libpq_uri
    from metarl.store.outer_steps import OuterWork, claim_outer_work, fail_outer_step, note_outer_attempt_error, publish_outer_version
    from metarl.store.progress import read_progress
    from metarl.store.reconcile import StageDispatch
    from metarl.store.replicate import replicate_finished_records
    from metarl.store.run_hosts import pause_run, record_host, secret_disagreement
    from metarl.store.run_ids import RunIdError
    from metarl.store.run_lock import RunLock
    from metarl.store.run_reads import (
        closed_claims,
        count_episodes,
        count_outer_steps,
        episode_ids,
        first_transition_after,
        in_flight,
        outer_step_ids,
        run_outcome,
        run_record,
        stage_claim_tokens,
    )
    from metarl.store.run_tick import RunTick
    from metarl.store.run_tick import run_tick as locked_tick
    from metarl.store.runpod_runs import RunpodRunStore
    from metarl.store.runs import create_run, runs_transaction, take_up_run
    from metarl.store.server import backend_pids, close_pooled_connections, committed_transactions, create_database, drop_database, table_sizes, vacuum_analyze
    from metarl.store.stage_records import StageRecord, evaluation_record, submission_record, verdict_record
    from metarl.store.stage_work import ClaimReads, StageClaimed, StageSkipped, claim_stage_work, note_storage_wait
    from metarl.store.statement_counts import counting_database_work
    from metarl.store.status import DatabaseUnreachable, queue_depths, read_run_status, read_run_status_at_head, without_password
    from metarl.store.tick_counts import TickCounts
    from metarl.store.tick_wakeup import TickWaiter

_EXPORTS: dict[str, tuple[str, str]] = {
    "Claim": ("metarl.store.claims", "Claim"),
    "ClaimReads": ("metarl.store.stage_work", "ClaimReads"),
    "CreationBlock": ("metarl.store.inner_jobs", "CreationBlock"),
    "DATABASE_UNREACHABLE": ("metarl.store.db", "DATABASE_UNREACHABLE"),
    "DatabaseUnreachable": ("metarl.store.status", "DatabaseUnreachable"),
    "InnerJobRow": ("metarl.store.inner_jobs", "InnerJobRow"),
    "NotRetryable": ("metarl.store.failed_runs", "NotRetryable"),
    "OuterClaim": ("metarl.store.claims", "OuterClaim"),
    "OuterWork": ("metarl.store.outer_steps", "OuterWork"),
    "RunIdError": ("metarl.store.run_ids", "RunIdError"),
    "RunLock": ("metarl.store.run_lock", "RunLock"),
    "RunTick": ("metarl.store.run_tick", "RunTick"),
    "RunpodRunStore": ("metarl.store.runpod_runs", "RunpodRunStore"),
    "StageClaimed": ("metarl.store.stage_work", "StageClaimed"),
    "StageDispatch": ("metarl.store.reconcile", "StageDispatch"),
    "StageRecord": ("metarl.store.stage_records", "StageRecord"),
    "StageSkipped": ("metarl.store.stage_work", "StageSkipped"),
    "StaleTransition": ("metarl.store.episodes", "StaleTransition"),
    "StoreError": ("metarl.store.errors", "StoreError"),
    "TickCounts": ("metarl.store.tick_counts", "TickCounts"),
    "TickWaiter": ("metarl.store.tick_wakeup", "TickWaiter"),
    "backend_pids": ("metarl.store.server", "backend_pids"),
    "base_score_key": ("metarl.store.baselines", "base_score_key"),
    "baseline_lookup": ("metarl.store.baselines", "baseline_lookup"),
    "claim_outer_lease": ("metarl.store.claims", "claim_outer_lease"),
    "claim_outer_work": ("metarl.store.outer_steps", "claim_outer_work"),
    "claim_stage_work": ("metarl.store.stage_work", "claim_stage_work"),
    "close_pooled_connections": ("metarl.store.server", "close_pooled_connections"),
    "closed_claims": ("metarl.store.run_reads", "closed_claims"),
    "committed_transactions": ("metarl.store.server", "committed_transactions"),
    "cost_records": ("metarl.store.episodes", "cost_records"),
    "count_episodes": ("metarl.store.run_reads", "count_episodes"),
    "count_outer_steps": ("metarl.store.run_reads", "count_outer_steps"),
    "count_transient_failure": ("metarl.store.claims", "count_transient_failure"),
    "counting_database_work": ("metarl.store.statement_counts", "counting_database_work"),
    "create_database": ("metarl.store.server", "create_database"),
    "create_run": ("metarl.store.runs", "create_run"),
    "current_revision": ("metarl.store.db", "current_revision"),
    "dispose_engines": ("metarl.store.db", "dispose_engines"),
    "drop_database": ("metarl.store.server", "drop_database"),
    "episode_ids": ("metarl.store.run_reads", "episode_ids"),
    "evaluation_record": ("metarl.store.stage_records", "evaluation_record"),
    "fail_outer_step": ("metarl.store.outer_steps", "fail_outer_step"),
    "first_transition_after": ("metarl.store.run_reads", "first_transition_after"),
    "in_flight": ("metarl.store.run_reads", "in_flight"),
    "inner_job_name": ("metarl.store.inner_jobs", "inner_job_name"),
    "launch_record": ("metarl.store.inner_jobs", "launch_record"),
    "libpq_uri": ("metarl.store.migration_head", "libpq_uri"),
    "locked_tick": ("metarl.store.run_tick", "run_tick"),
    "lost_record": ("metarl.store.inner_jobs", "lost_record"),
    "move_episode": ("metarl.store.episodes", "move_episode"),
    "note_capacity_wait": ("metarl.store.inner_jobs", "note_capacity_wait"),
    "note_claim_error": ("metarl.store.claims", "note_claim_error"),
    "note_outer_attempt_error": ("metarl.store.outer_steps", "note_outer_attempt_error"),
    "note_storage_wait": ("metarl.store.stage_work", "note_storage_wait"),
    "outer_step_ids": ("metarl.store.run_reads", "outer_step_ids"),
    "pause_run": ("metarl.store.run_hosts", "pause_run"),
    "poll_record": ("metarl.store.inner_jobs", "poll_record"),
    "publish_outer_version": ("metarl.store.outer_steps", "publish_outer_version"),
    "queue_depths": ("metarl.store.status", "queue_depths"),
    "read_metrics": ("metarl.store.metrics_reads", "read_metrics"),
    "read_progress": ("metarl.store.progress", "read_progress"),
    "read_run_status": ("metarl.store.status", "read_run_status"),
    "read_run_status_at_head": ("metarl.store.status", "read_run_status_at_head"),
    "record_host": ("metarl.store.run_hosts", "record_host"),
    "renew_claim": ("metarl.store.claims", "renew_claim"),
    "renew_outer_step": ("metarl.store.claims", "renew_outer_step"),
    "replicate_finished_records": ("metarl.store.replicate", "replicate_finished_records"),
    "reward_params": ("metarl.store.episodes", "reward_params"),
    "reward_record": ("metarl.store.episodes", "reward_record"),
    "run_outcome": ("metarl.store.run_reads", "run_outcome"),
    "run_record": ("metarl.store.run_reads", "run_record"),
    "runs_transaction": ("metarl.store.runs", "runs_transaction"),
    "secret_disagreement": ("metarl.store.run_hosts", "secret_disagreement"),
    "stage_claim_tokens": ("metarl.store.run_reads", "stage_claim_tokens"),
    "store_base_score": ("metarl.store.baselines", "store_base_score"),
    "submission_record": ("metarl.store.stage_records", "submission_record"),
    "table_sizes": ("metarl.store.server", "table_sizes"),
    "take_up_run": ("metarl.store.runs", "take_up_run"),
    "unreachable_reason": ("metarl.store.db", "unreachable_reason"),
    "unscored_reward_record": ("metarl.store.episodes", "unscored_reward_record"),
    "upgrade_database": ("metarl.store.db", "upgrade"),
    "utcnow": ("metarl.store.claims", "utcnow"),
    "vacuum_analyze": ("metarl.store.server", "vacuum_analyze"),
    "verdict_record": ("metarl.store.stage_records", "verdict_record"),
    "warm_pool": ("metarl.store.db", "warm_pool"),
    "without_password": ("metarl.store.status", "without_password"),
}
"""Each exported name: the module inside the store that defines it, and its name there."""

__all__ = [
    "Claim",
    "ClaimReads",
    "CreationBlock",
    "DATABASE_UNREACHABLE",
    "DatabaseUnreachable",
    "InnerJobRow",
    "NotRetryable",
    "OuterClaim",
    "OuterWork",
    "RunIdError",
    "RunLock",
    "RunTick",
    "RunpodRunStore",
    "StageClaimed",
    "StageDispatch",
    "StageRecord",
    "StageSkipped",
    "StaleTransition",
    "StoreError",
    "TickCounts",
    "TickWaiter",
    "backend_pids",
    "base_score_key",
    "baseline_lookup",
    "claim_outer_lease",
    "claim_outer_work",
    "claim_stage_work",
    "close_pooled_connections",
    "closed_claims",
    "committed_transactions",
    "cost_records",
    "count_episodes",
    "count_outer_steps",
    "count_transient_failure",
    "counting_database_work",
    "create_database",
    "create_run",
    "current_revision",
    "dispose_engines",
    "drop_database",
    "episode_ids",
    "evaluation_record",
    "fail_outer_step",
    "first_transition_after",
    "in_flight",
    "inner_job_name",
    "launch_record",
    "libpq_uri",
    "locked_tick",
    "lost_record",
    "move_episode",
    "note_capacity_wait",
    "note_claim_error",
    "note_outer_attempt_error",
    "note_storage_wait",
    "outer_step_ids",
    "pause_run",
    "poll_record",
    "publish_outer_version",
    "queue_depths",
    "read_metrics",
    "read_progress",
    "read_run_status",
    "read_run_status_at_head",
    "record_host",
    "renew_claim",
    "renew_outer_step",
    "replicate_finished_records",
    "reward_params",
    "reward_record",
    "run_outcome",
    "run_record",
    "runs_transaction",
    "secret_disagreement",
    "stage_claim_tokens",
    "store_base_score",
    "submission_record",
    "table_sizes",
    "take_up_run",
    "unreachable_reason",
    "unscored_reward_record",
    "upgrade_database",
    "utcnow",
    "vacuum_analyze",
    "verdict_record",
    "warm_pool",
    "without_password",
]


def __getattr__(name: str) -> Any:
    """Load an exported name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
