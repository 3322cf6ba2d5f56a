"""policy samples on probe attempts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 22:14:55.200945
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("probe_attempts", sa.Column("policy_tokens", sa.JSON(), nullable=True))
    op.add_column("probe_attempts", sa.Column("behaviour_logprobs", sa.JSON(), nullable=True))
    op.add_column("probe_attempts", sa.Column("prompt_length", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("probe_attempts", "prompt_length")
    op.drop_column("probe_attempts", "behaviour_logprobs")
    op.drop_column("probe_attempts", "policy_tokens")
