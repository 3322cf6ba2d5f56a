"""run_hosts: each host that worked on a run, and the fingerprint of the hidden-eval secret it held

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 20:00:00.000000

Pools may run on several hosts that share only PostgreSQL, Redis and the artifact store. Each
worker process records its host and the fingerprint of its hidden-eval secret (an HMAC of a
constant, never the secret) before its first stage of a run; the orchestrator records its own when
it creates or takes up the run. Two fingerprints for one run stop it (`metarl/store/run_hosts.py`).
Run and claim statuses are strings without a database enum, so the new `paused` and `interrupted`
run statuses and the `pending` claim status need no change here.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_hosts",
        sa.Column("run_id", sa.String(length=36), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("host", sa.String(length=128), primary_key=True),
        sa.Column("secret_fingerprint", sa.String(length=16), nullable=True),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_hosts")
