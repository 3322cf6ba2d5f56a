"""SQLAlchemy 2 models of everything a run records. Postgres is the source of truth."""

from __future__ import annotations

import datetime as dt
import enum
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Numeric,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from schemas.states import ClaimStatus, GroupStatus, InnerJobStatus, OuterStatus, RunStatus, Stage

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with stable constraint names (so Alembic diffs are clean)."""

    metadata = MetaData(naming_convention=NAMING)


def _now_column() -> Mapped[dt.datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def _enum(kind: type[enum.Enum], name: str) -> Enum:
    return Enum(kind, name=name, native_enum=False, length=16, validate_strings=True)


class Run(Base):
    """One run of the meta-RL loop."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[RunStatus] = mapped_column(_enum(RunStatus, "run_status"), nullable=False, default=RunStatus.running)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    task_specs: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    policy_version: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    stop_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    status_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = _now_column()
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), onupdate=func.now(), nullable=False)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    orchestrator_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


RUN_ROW_LOCK = {"key_share": True}
"""How writers of a run's row lock it (`with_for_update=`): FOR NO KEY UPDATE serialises them, but not the stage inserts
that reference the run (claims, charges and inner jobs take FOR KEY SHARE on it through their foreign keys), which FOR
UPDATE would hold up for as long as the lock is held (a whole orchestrator tick)."""


class PolicyVersion(Base):
    """A saved version of the trainer policy; saved before it is used for sampling."""

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("run_id", "version"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    state_uri: Mapped[str | None] = mapped_column(Text)
    outer_step_id: Mapped[int | None] = mapped_column(ForeignKey("outer_steps.id"))
    created_at: Mapped[dt.datetime] = _now_column()


class EpisodeGroup(Base):
    """Episodes of one task spec sampled under one policy version."""

    __tablename__ = "episode_groups"
    __table_args__ = (Index("ix_episode_groups_run_status", "run_id", "status"), Index("ix_episode_groups_run_version", "run_id", "policy_version"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    task_id: Mapped[str] = mapped_column(String(64), nullable=False)
    policy_version: Mapped[int] = mapped_column(Integer, nullable=False)
    size: Mapped[int] = mapped_column(Integer, nullable=False)
    held_out: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    start_set: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=text("false"))
    """A group of the run's fixed start set (evaluation only, held_out too, on a training family: `orchestrator/loop.py`)."""
    status: Mapped[GroupStatus] = mapped_column(_enum(GroupStatus, "group_status"), nullable=False, default=GroupStatus.open)
    ended_episodes: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    """Episodes of the group that ended (done or failed), counted by their ending moves (`metarl.store.episodes.FINISH_AND_MOVE_SQL`)."""
    outer_step_id: Mapped[int | None] = mapped_column(ForeignKey("outer_steps.id"))
    created_at: Mapped[dt.datetime] = _now_column()


class Episode(Base):
    """One trainer-agent episode: agent -> probe (retries) -> train -> eval -> reward."""

    __tablename__ = "episodes"
    __table_args__ = (
        UniqueConstraint("group_id", "index_in_group"),
        Index("ix_episodes_run_stage", "run_id", "stage"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    group_id: Mapped[int] = mapped_column(ForeignKey("episode_groups.id", ondelete="CASCADE"), nullable=False)
    index_in_group: Mapped[int] = mapped_column(Integer, nullable=False)
    task_id: Mapped[str] = mapped_column(String(64), nullable=False)
    policy_version: Mapped[int] = mapped_column(Integer, nullable=False)
    held_out: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    stage: Mapped[Stage] = mapped_column(_enum(Stage, "stage"), nullable=False, default=Stage.agent)
    probe_attempt: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    dispatch_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = _now_column()
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), onupdate=func.now(), nullable=False)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class StageClaim(Base):
    """A worker's claim on one stage of one episode (per probe attempt). Unique per key; taken over when stale."""

    __tablename__ = "stage_claims"
    __table_args__ = (UniqueConstraint("episode_id", "stage", "probe_attempt", name="uq_stage_claims_key"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), nullable=False)
    stage: Mapped[Stage] = mapped_column(_enum(Stage, "stage"), nullable=False)
    probe_attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    token: Mapped[str] = mapped_column(String(36), nullable=False)
    takeovers: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    transient_failures: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    status: Mapped[ClaimStatus] = mapped_column(_enum(ClaimStatus, "claim_status"), nullable=False)
    worker: Mapped[str] = mapped_column(String(255), nullable=False)
    claimed_at: Mapped[dt.datetime] = _now_column()
    heartbeat_at: Mapped[dt.datetime] = _now_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)


class ProbeAttempt(Base):
    """One agent submission and the probe's verdict on it."""

    __tablename__ = "probe_attempts"
    __table_args__ = (UniqueConstraint("episode_id", "attempt"), Index("ix_probe_attempts_run", "run_id"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), nullable=False)
    run_id: Mapped[str] = mapped_column(String(36), nullable=False)  # the episode's, for run-level counts without a join (migration 0007)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False)
    job_toml: Mapped[str] = mapped_column(Text, nullable=False)
    workspace_uri: Mapped[str | None] = mapped_column(Text)
    agent_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    explicit_hyperparameters: Mapped[int | None] = mapped_column(Integer)
    model_name: Mapped[str | None] = mapped_column(String(200))
    agent_backend: Mapped[str] = mapped_column(String(32), nullable=False)
    policy_tokens: Mapped[list[int] | None] = mapped_column(JSON)
    behaviour_logprobs: Mapped[list[float] | None] = mapped_column(JSON)
    prompt_length: Mapped[int | None] = mapped_column(Integer)
    passed: Mapped[bool | None] = mapped_column(Boolean)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    probe_seconds: Mapped[float | None] = mapped_column(Float)
    isolation: Mapped[str | None] = mapped_column(String(16))  # level the environment module ran under (migration 0011)
    submitted_at: Mapped[dt.datetime] = _now_column()
    probed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class InnerJob(Base):
    """An inner training job. One per episode; its external id (pod id, pid) is stored before polling."""

    __tablename__ = "inner_jobs"
    __table_args__ = (
        UniqueConstraint("episode_id"),
        UniqueConstraint("name"),
        Index("ix_inner_jobs_status", "status"),
        Index("ix_inner_jobs_run_status", "run_id", "status"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), nullable=False)
    name: Mapped[str] = mapped_column(String(128), nullable=False)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    simulated: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    external_id: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[InnerJobStatus] = mapped_column(_enum(InnerJobStatus, "inner_job_status"), nullable=False)
    launch_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    backend_state: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    model_name: Mapped[str | None] = mapped_column(String(200))
    checkpoint_uri: Mapped[str | None] = mapped_column(Text)
    metrics_uri: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = _now_column()
    launched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    train_seconds: Mapped[float | None] = mapped_column(Float)


class Evaluation(Base):
    """A hidden-eval score of the trained checkpoint of an episode."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("episode_id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), nullable=False)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    simulated: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    base_score: Mapped[float] = mapped_column(Float, nullable=False)
    trained_score: Mapped[float] = mapped_column(Float, nullable=False)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    n_items: Mapped[int] = mapped_column(Integer, nullable=False)
    eval_seconds: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = _now_column()


class BaselineScore(Base):
    """Cached hidden-eval score of an untrained base model, per `metarl.interfaces.BaseScoreKey` (the unique key; migration 0010)."""

    __tablename__ = "baseline_scores"
    __table_args__ = (
        UniqueConstraint(
            "task_id",
            "model_name",
            "model_build",
            "model_scale",
            "eval_version",
            "eval_items",
            "pass_k",
            "grader",
            "backend",
            "scorer",
            name="uq_baseline_scores_key",
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64), nullable=False)
    model_name: Mapped[str] = mapped_column(String(200), nullable=False)
    model_build: Mapped[str] = mapped_column(String(200), nullable=False)  # the built model: a stand-in's build hash, hub name@revision, `simulator`
    model_scale: Mapped[float] = mapped_column(Float, nullable=False)
    eval_version: Mapped[int] = mapped_column(Integer, nullable=False)
    eval_items: Mapped[int] = mapped_column(Integer, nullable=False)
    pass_k: Mapped[int] = mapped_column(Integer, nullable=False)
    grader: Mapped[str] = mapped_column(String(64), nullable=False)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    scorer: Mapped[str] = mapped_column(String(200), nullable=False)
    score: Mapped[float] = mapped_column(Float, nullable=False)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    n_items: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[dt.datetime] = _now_column()


class Reward(Base):
    """The episode reward and each of its components."""

    __tablename__ = "rewards"
    __table_args__ = (UniqueConstraint("episode_id"), Index("ix_rewards_run", "run_id"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    episode_id: Mapped[int] = mapped_column(ForeignKey("episodes.id", ondelete="CASCADE"), nullable=False)
    run_id: Mapped[str] = mapped_column(String(36), nullable=False)  # the episode's, for run-level averages without a join (migration 0007)
    total: Mapped[float] = mapped_column(Float, nullable=False)
    job: Mapped[float] = mapped_column(Float, nullable=False)
    validation: Mapped[float] = mapped_column(Float, nullable=False)
    efficiency: Mapped[float] = mapped_column(Float, nullable=False)
    speed: Mapped[float] = mapped_column(Float, nullable=False)
    raw_improvement: Mapped[float | None] = mapped_column(Float)
    weights: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[dt.datetime] = _now_column()


class CostEntry(Base):
    """One line of the cost ledger. The idempotency key makes re-recording the same charge a no-op."""

    __tablename__ = "cost_ledger"
    __table_args__ = (UniqueConstraint("idempotency_key"), Index("ix_cost_ledger_run", "run_id"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    episode_id: Mapped[int | None] = mapped_column(ForeignKey("episodes.id", ondelete="SET NULL"))
    source: Mapped[str] = mapped_column(String(32), nullable=False)
    description: Mapped[str] = mapped_column(String(255), nullable=False)
    quantity: Mapped[float] = mapped_column(Float, nullable=False)
    unit: Mapped[str] = mapped_column(String(32), nullable=False)
    unit_price_usd: Mapped[float] = mapped_column(Numeric(18, 9), nullable=False)
    amount_usd: Mapped[float] = mapped_column(Numeric(18, 9), nullable=False)
    simulated: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    idempotency_key: Mapped[str] = mapped_column(String(255), nullable=False)
    created_at: Mapped[dt.datetime] = _now_column()


class RunHost(Base):
    """A host that worked on a run and the fingerprint of the hidden-eval secret it held (migration 0012)."""

    __tablename__ = "run_hosts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    secret_fingerprint: Mapped[str | None] = mapped_column(String(16))
    role: Mapped[str] = mapped_column(String(32), nullable=False)
    first_seen_at: Mapped[dt.datetime] = _now_column()
    last_seen_at: Mapped[dt.datetime] = _now_column()


class RunSpend(Base):
    """A run's total of the cost ledger and its number of lines, kept equal to the ledger's sum by triggers on
    `cost_ledger` (migration 0008): the budget checks read this one row instead of summing the ledger."""

    __tablename__ = "run_spend"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    amount_usd: Mapped[Decimal] = mapped_column(Numeric(), nullable=False)
    entries: Mapped[int] = mapped_column(BigInteger, nullable=False)


class OuterStep(Base):
    """One outer (policy) update and its batch statistics.

    `takeovers` counts claims taken from a worker that stopped heartbeating (it died or crashed);
    past the stage-attempt cap the step fails with `error` instead of being re-sent forever.
    """

    __tablename__ = "outer_steps"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), nullable=False)
    step: Mapped[int] = mapped_column(Integer, nullable=False)
    status: Mapped[OuterStatus] = mapped_column(_enum(OuterStatus, "outer_status"), nullable=False, default=OuterStatus.pending)
    policy_version_before: Mapped[int] = mapped_column(Integer, nullable=False)
    policy_version_after: Mapped[int | None] = mapped_column(Integer)
    n_groups: Mapped[int] = mapped_column(Integer, nullable=False)
    n_episodes: Mapped[int] = mapped_column(Integer, nullable=False)
    dropped_stale_groups: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    token: Mapped[str | None] = mapped_column(String(36))
    takeovers: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default=text("0"))
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    dispatched_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False, default=dict)
    created_at: Mapped[dt.datetime] = _now_column()
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
