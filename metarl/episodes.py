"""Database side of episode transitions: CAS moves, group completion, reward records, context."""

from __future__ import annotations

import hashlib

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from metarl.backends.base import CostItem, EpisodeContext
from metarl.claims import utcnow
from metarl.ledger import record_cost
from metarl.reward import RewardBreakdown, RewardInputs, compute_reward
from orchestrator.transitions import TERMINAL_STAGES, Transition
from schemas.base import FieldProblem
from schemas.records import Episode, EpisodeGroup, GroupStatus, InnerJob, PolicyVersion, ProbeAttempt, Reward, Run, Stage
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec


class StaleTransition(Exception):
    """The episode moved on since the claim was taken (another worker finished it)."""


def episode_seed(run_seed: int, episode_id: int) -> int:
    digest = hashlib.sha256(f"{run_seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


PARSED_ENTRIES_KEPT = 256
"""Parsed run configs (and, separately, task specs) a process keeps; a run's config never changes after it is created."""
_parsed_configs: dict[tuple[str, object], RunConfig] = {}
_parsed_tasks: dict[tuple[str, object, str], TaskSpec] = {}


def _remember(cache: dict, key: object, value: object) -> None:  # type: ignore[type-arg]
    if len(cache) >= PARSED_ENTRIES_KEPT:
        cache.clear()
    cache[key] = value


def run_config_of(run: Run) -> RunConfig:
    """The run's validated config, parsed once per process per run (keyed by id and creation time)."""
    key = (run.id, run.created_at)
    config = _parsed_configs.get(key)
    if config is None:
        config = RunConfig.model_validate(run.config)
        _remember(_parsed_configs, key, config)
    return config


def task_of(run: Run, task_id: str) -> TaskSpec:
    """One of the run's validated task specs, parsed once per process per run."""
    key = (run.id, run.created_at, task_id)
    task = _parsed_tasks.get(key)
    if task is None:
        task = TaskSpec.model_validate(run.task_specs[task_id])
        _remember(_parsed_tasks, key, task)
    return task


def build_context(session: Session, run: Run, episode: Episode, config: RunConfig) -> EpisodeContext:
    feedback: list[FieldProblem] = []
    if episode.probe_attempt > 1:
        previous = session.execute(
            select(ProbeAttempt.errors).where(ProbeAttempt.episode_id == episode.id, ProbeAttempt.attempt == episode.probe_attempt - 1)
        ).scalar_one_or_none()
        feedback = [FieldProblem.model_validate(item) for item in (previous or [])]
    state_uri, workspace_uri = session.execute(
        select(
            select(PolicyVersion.state_uri).where(PolicyVersion.run_id == run.id, PolicyVersion.version == episode.policy_version).scalar_subquery(),
            select(ProbeAttempt.workspace_uri).where(ProbeAttempt.episode_id == episode.id, ProbeAttempt.attempt == episode.probe_attempt).scalar_subquery(),
        )
    ).one()
    return EpisodeContext(
        policy_state_uri=state_uri,
        workspace_uri=workspace_uri,
        run_id=run.id,
        episode_id=episode.id,
        task=task_of(run, episode.task_id),
        policy_version=episode.policy_version,
        probe_attempt=episode.probe_attempt,
        seed=episode_seed(config.run.seed, episode.id),
        feedback=feedback,
        artifacts_root=config.artifacts.root,
    )


def move_episode(session: Session, episode_id: int, from_stage: Stage, from_attempt: int, to: Transition, error: str | None = None) -> None:
    """Compare-and-set the episode from (stage, attempt) to the transition's target; raise if it moved already."""
    now = utcnow()
    values: dict[str, object] = {"stage": to.stage, "probe_attempt": to.probe_attempt, "updated_at": now, "dispatched_at": now, "error": error}
    if to.stage in TERMINAL_STAGES:
        values["finished_at"] = now
    moved = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, Episode.stage == from_stage, Episode.probe_attempt == from_attempt)
        .values(**values)
        .returning(Episode.group_id)
    ).scalar_one_or_none()
    if moved is None:
        raise StaleTransition(f"episode {episode_id} is no longer at {from_stage.value}/{from_attempt}")
    if to.stage in TERMINAL_STAGES:
        close_group_if_finished(session, moved)


def close_group_if_finished(session: Session, group_id: int) -> None:
    group = session.execute(select(EpisodeGroup).where(EpisodeGroup.id == group_id).with_for_update()).scalar_one()
    if group.status != GroupStatus.open:
        return
    finished = session.execute(
        select(func.count()).select_from(Episode).where(Episode.group_id == group_id, Episode.stage.in_(TERMINAL_STAGES))
    ).scalar_one()
    if finished >= group.size:
        group.status = GroupStatus.evaluated if group.held_out else GroupStatus.complete


def record_costs(session: Session, run_id: str, episode_id: int | None, costs: list[CostItem], simulated: bool) -> None:
    for item in costs:
        record_cost(
            session,
            run_id=run_id,
            episode_id=episode_id,
            source=item.source,
            description=item.description,
            quantity=item.quantity,
            unit=item.unit,
            unit_price_usd=item.unit_price_usd,
            idempotency_key=item.key,
            simulated=simulated,
        )


def passed_attempt_and_tokens(session: Session, episode_id: int) -> tuple[int | None, int]:
    rows = session.execute(
        select(ProbeAttempt.attempt, ProbeAttempt.passed, ProbeAttempt.agent_tokens).where(ProbeAttempt.episode_id == episode_id).order_by(ProbeAttempt.attempt)
    ).all()
    tokens = 0
    for attempt, passed, attempt_tokens in rows:
        tokens += attempt_tokens
        if passed:
            return attempt, tokens
    return None, tokens


def store_reward(
    session: Session,
    *,
    episode: Episode,
    config: RunConfig,
    task: TaskSpec,
    base_score: float | None,
    trained_score: float | None,
    train_seconds: float | None,
) -> RewardBreakdown:
    passed_on, tokens = passed_attempt_and_tokens(session, episode.id)
    breakdown = compute_reward(
        RewardInputs(
            passed_on_attempt=passed_on,
            max_probe_attempts=config.retries.max_probe_attempts,
            agent_tokens=tokens,
            base_score=base_score,
            trained_score=trained_score,
            train_seconds=train_seconds,
            train_budget_seconds=task.budget.max_train_seconds,
        ),
        config.reward,
    )
    session.execute(
        insert(Reward)
        .values(episode_id=episode.id, weights=config.reward.model_dump(), **breakdown.model_dump())
        .on_conflict_do_nothing(constraint="uq_rewards_episode_id")
    )
    return breakdown


def inner_job_of(session: Session, episode_id: int) -> InnerJob | None:
    return session.execute(select(InnerJob).where(InnerJob.episode_id == episode_id)).scalar_one_or_none()
