"""episode_groups.ended_episodes: a group counts its ended episodes, so an ending move completes it in the same statement

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 23:00:00.000000

The ending move increments the counter of its group's row. Under READ COMMITTED an UPDATE that
waited for a concurrent one re-reads the newest row, so the increments never lose one, and the move
that brings the count to the group's size marks the group complete. Groups already in the database
are counted from their episodes.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("episode_groups", sa.Column("ended_episodes", sa.Integer(), server_default="0", nullable=False))
    op.execute("UPDATE episode_groups g SET ended_episodes = (SELECT count(*) FROM episodes e WHERE e.group_id = g.id AND e.stage IN ('done', 'failed'))")


def downgrade() -> None:
    op.drop_column("episode_groups", "ended_episodes")
