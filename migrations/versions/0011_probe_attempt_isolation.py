"""probe_attempts.isolation: the isolation level the attempt's environment module ran under

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 22:00:00.000000

The probe runs agent-written code under bubblewrap (`full`) or, where a deployment's
`[sandbox] min_isolation` allows it, with process limits only (`process`). Each verdict records
which; NULL when no module ran (a job.toml-only probe, or an attempt probed before this migration).
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("probe_attempts", sa.Column("isolation", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("probe_attempts", "isolation")
