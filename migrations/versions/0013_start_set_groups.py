"""episode_groups.start_set: the groups of a run's fixed start set

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 06:10:00.000000

Before its first outer step a run may record a fixed, family-balanced set of episodes of the
untrained policy (`outer.start_set_group_size`), with seeds that do not depend on the run's seed, so
every seed's run starts from the same measured set. They are evaluation-only groups (held_out) on
the training families; this column tells them from the held-out family's evaluations.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("episode_groups", sa.Column("start_set", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("episode_groups", "start_set")
