"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 21:33:03.984633
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "baseline_scores",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=False),
        sa.Column("eval_version", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("n_items", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_baseline_scores")),
        sa.UniqueConstraint("task_id", "model_name", "eval_version", "backend", name=op.f("uq_baseline_scores_task_id")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("status", sa.Enum("running", "stopping", "stopped", "finished", "failed", name="run_status", native_enum=False, length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("task_specs", sa.JSON(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("orchestrator_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_table(
        "outer_steps",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("status", sa.Enum("pending", "running", "done", "failed", name="outer_status", native_enum=False, length=16), nullable=False),
        sa.Column("policy_version_before", sa.Integer(), nullable=False),
        sa.Column("policy_version_after", sa.Integer(), nullable=True),
        sa.Column("n_groups", sa.Integer(), nullable=False),
        sa.Column("n_episodes", sa.Integer(), nullable=False),
        sa.Column("dropped_stale_groups", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("token", sa.String(length=36), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_outer_steps_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outer_steps")),
        sa.UniqueConstraint("run_id", "step", name=op.f("uq_outer_steps_run_id")),
    )
    op.create_table(
        "episode_groups",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("held_out", sa.Boolean(), nullable=False),
        sa.Column("status", sa.Enum("open", "complete", "batched", "dropped", "evaluated", name="group_status", native_enum=False, length=16), nullable=False),
        sa.Column("outer_step_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["outer_step_id"], ["outer_steps.id"], name=op.f("fk_episode_groups_outer_step_id_outer_steps")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_episode_groups_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episode_groups")),
    )
    op.create_index("ix_episode_groups_run_status", "episode_groups", ["run_id", "status"], unique=False)
    op.create_table(
        "policy_versions",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("state_uri", sa.Text(), nullable=True),
        sa.Column("outer_step_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["outer_step_id"], ["outer_steps.id"], name=op.f("fk_policy_versions_outer_step_id_outer_steps")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_policy_versions_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_versions")),
        sa.UniqueConstraint("run_id", "version", name=op.f("uq_policy_versions_run_id")),
    )
    op.create_table(
        "episodes",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("group_id", sa.BigInteger(), nullable=False),
        sa.Column("index_in_group", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("held_out", sa.Boolean(), nullable=False),
        sa.Column("stage", sa.Enum("agent", "probe", "train", "eval", "done", "failed", name="stage", native_enum=False, length=16), nullable=False),
        sa.Column("probe_attempt", sa.Integer(), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dispatch_count", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["group_id"], ["episode_groups.id"], name=op.f("fk_episodes_group_id_episode_groups"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_episodes_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_episodes")),
        sa.UniqueConstraint("group_id", "index_in_group", name=op.f("uq_episodes_group_id")),
    )
    op.create_index("ix_episodes_run_stage", "episodes", ["run_id", "stage"], unique=False)
    op.create_table(
        "cost_ledger",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("episode_id", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("description", sa.String(length=255), nullable=False),
        sa.Column("quantity", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("unit_price_usd", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("amount_usd", sa.Numeric(precision=18, scale=9), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_cost_ledger_episode_id_episodes"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_cost_ledger_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cost_ledger")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_cost_ledger_idempotency_key")),
    )
    op.create_index("ix_cost_ledger_run", "cost_ledger", ["run_id"], unique=False)
    op.create_table(
        "evaluations",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("episode_id", sa.BigInteger(), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("base_score", sa.Float(), nullable=False),
        sa.Column("trained_score", sa.Float(), nullable=False),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("n_items", sa.Integer(), nullable=False),
        sa.Column("eval_seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_evaluations_episode_id_episodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
        sa.UniqueConstraint("episode_id", name=op.f("uq_evaluations_episode_id")),
    )
    op.create_table(
        "inner_jobs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("episode_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("external_id", sa.String(length=255), nullable=True),
        sa.Column(
            "status",
            sa.Enum("launching", "running", "succeeded", "failed", "lost", "terminated", name="inner_job_status", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("launch_count", sa.Integer(), nullable=False),
        sa.Column("backend_state", sa.JSON(), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=True),
        sa.Column("checkpoint_uri", sa.Text(), nullable=True),
        sa.Column("metrics_uri", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("launched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("train_seconds", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_inner_jobs_episode_id_episodes"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_inner_jobs_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inner_jobs")),
        sa.UniqueConstraint("episode_id", name=op.f("uq_inner_jobs_episode_id")),
        sa.UniqueConstraint("name", name=op.f("uq_inner_jobs_name")),
    )
    op.create_index("ix_inner_jobs_status", "inner_jobs", ["status"], unique=False)
    op.create_table(
        "probe_attempts",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("episode_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("job_toml", sa.Text(), nullable=False),
        sa.Column("workspace_uri", sa.Text(), nullable=True),
        sa.Column("agent_tokens", sa.Integer(), nullable=False),
        sa.Column("explicit_hyperparameters", sa.Integer(), nullable=True),
        sa.Column("model_name", sa.String(length=200), nullable=True),
        sa.Column("agent_backend", sa.String(length=32), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("probe_seconds", sa.Float(), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("probed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_probe_attempts_episode_id_episodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_attempts")),
        sa.UniqueConstraint("episode_id", "attempt", name=op.f("uq_probe_attempts_episode_id")),
    )
    op.create_table(
        "rewards",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("episode_id", sa.BigInteger(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("job", sa.Float(), nullable=False),
        sa.Column("validation", sa.Float(), nullable=False),
        sa.Column("efficiency", sa.Float(), nullable=False),
        sa.Column("speed", sa.Float(), nullable=False),
        sa.Column("raw_improvement", sa.Float(), nullable=True),
        sa.Column("weights", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_rewards_episode_id_episodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rewards")),
        sa.UniqueConstraint("episode_id", name=op.f("uq_rewards_episode_id")),
    )
    op.create_table(
        "stage_claims",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("episode_id", sa.BigInteger(), nullable=False),
        sa.Column("stage", sa.Enum("agent", "probe", "train", "eval", "done", "failed", name="stage", native_enum=False, length=16), nullable=False),
        sa.Column("probe_attempt", sa.Integer(), nullable=False),
        sa.Column("token", sa.String(length=36), nullable=False),
        sa.Column("takeovers", sa.Integer(), nullable=False),
        sa.Column("transient_failures", sa.Integer(), nullable=False),
        sa.Column("status", sa.Enum("running", "done", "failed", "abandoned", name="claim_status", native_enum=False, length=16), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name=op.f("fk_stage_claims_episode_id_episodes"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_stage_claims_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stage_claims")),
        sa.UniqueConstraint("episode_id", "stage", "probe_attempt", name="uq_stage_claims_key"),
    )


def downgrade() -> None:
    op.drop_table("stage_claims")
    op.drop_table("rewards")
    op.drop_table("probe_attempts")
    op.drop_index("ix_inner_jobs_status", table_name="inner_jobs")
    op.drop_table("inner_jobs")
    op.drop_table("evaluations")
    op.drop_index("ix_cost_ledger_run", table_name="cost_ledger")
    op.drop_table("cost_ledger")
    op.drop_index("ix_episodes_run_stage", table_name="episodes")
    op.drop_table("episodes")
    op.drop_table("policy_versions")
    op.drop_index("ix_episode_groups_run_status", table_name="episode_groups")
    op.drop_table("episode_groups")
    op.drop_table("outer_steps")
    op.drop_table("runs")
    op.drop_table("baseline_scores")
