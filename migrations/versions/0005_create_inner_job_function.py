"""metarl_create_inner_job: the train submit's capacity and budget check and its insert, one statement

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 22:30:00.000000

The function takes a transaction-level advisory lock keyed by the train backend's name, then
reads the run's spend and the backend's active jobs and inserts the inner job when both are under
their caps. A VOLATILE PL/pgSQL function takes a fresh snapshot for each of its statements, so the
reads after the lock see every job created by a caller that held the lock before: called in
autocommit, the whole check-and-insert is one round trip. The lock is per backend, not per run, so
two runs sharing a backend never both take its last slot.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
CREATE OR REPLACE FUNCTION metarl_create_inner_job(
    p_run_id text, p_episode_id bigint, p_name text, p_backend text, p_simulated boolean, p_model_name text,
    p_max_usd double precision, p_capacity integer,
    OUT spent double precision, OUT active bigint, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('metarl:inner-job-capacity:' || p_backend, 0));
    SELECT coalesce(sum(amount_usd), 0)::double precision INTO spent FROM cost_ledger WHERE run_id = p_run_id;
    SELECT count(*) INTO active FROM inner_jobs WHERE backend = p_backend AND status IN ('launching', 'running');
    job_id := NULL;
    IF spent < p_max_usd AND active < p_capacity THEN
        INSERT INTO inner_jobs (run_id, episode_id, name, backend, simulated, status, launch_count, backend_state, model_name, created_at)
        VALUES (p_run_id, p_episode_id, p_name, p_backend, p_simulated, 'launching', 0, '{}', p_model_name, now())
        RETURNING id INTO job_id;
    END IF;
END
$fn$
"""
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS metarl_create_inner_job(text, bigint, text, text, boolean, text, double precision, integer)")
