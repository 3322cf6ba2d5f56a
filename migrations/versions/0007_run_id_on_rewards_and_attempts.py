"""rewards.run_id and probe_attempts.run_id: run-level aggregates without a join through episodes

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 18:00:00.000000

`metarl status` averages a run's rewards and counts its probe attempts. Joined through episodes,
each was a hash join over every episode of the run (about 60-80 ms apiece at 100,000 episodes,
bench.scale); with the episode's run id written on the row, each is an index or sequential scan of
one table. The value is the episode's own run id (an episode never changes runs), so it carries no
foreign key of its own: the episode's key already ties the row to its run, and a second key check
on every insert would cost each stage move a lookup. Rows already in the database are filled in
from their episodes.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TABLES = ("rewards", "probe_attempts")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("run_id", sa.String(length=36), nullable=True))
        op.execute(f"UPDATE {table} t SET run_id = e.run_id FROM episodes e WHERE e.id = t.episode_id")
        op.alter_column(table, "run_id", nullable=False)
        op.create_index(f"ix_{table}_run", table, ["run_id"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_run", table_name=table)
        op.drop_column(table, "run_id")
