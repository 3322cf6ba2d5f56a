"""index inner jobs by run and status (metarl status counts a run's jobs per status)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 02:30:00.000000
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_inner_jobs_run_status", "inner_jobs", ["run_id", "status"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_inner_jobs_run_status", table_name="inner_jobs")
