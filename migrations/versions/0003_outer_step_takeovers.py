"""outer steps count takeovers and record why they failed

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 00:40:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("outer_steps", sa.Column("takeovers", sa.Integer(), server_default=sa.text("0"), nullable=False))
    op.add_column("outer_steps", sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("outer_steps", "error")
    op.drop_column("outer_steps", "takeovers")
