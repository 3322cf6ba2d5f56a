"""metarl_create_inner_job counts only the jobs of runs being driven toward a backend's capacity

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 21:20:00.000000

The capacity count took every `launching` or `running` inner job of the backend, whatever its run's status.
A run interrupted (Ctrl-C on `metarl run` with the embedded default stops its workers too) or ended with
jobs in flight leaves them `running` until it is resumed, so a later run on the same backend waited for
those slots for good, with no job started. Only jobs of runs that are `running` or `stopping` count now;
a resumed run's jobs count again.
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

CREATE_INNER_JOB = """
CREATE OR REPLACE FUNCTION metarl_create_inner_job(
    p_run_id text, p_episode_id bigint, p_name text, p_backend text, p_simulated boolean, p_model_name text,
    p_max_usd double precision, p_capacity integer,
    OUT spent double precision, OUT active bigint, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('metarl:inner-job-capacity:' || p_backend, 0));
    SELECT coalesce((SELECT amount_usd FROM run_spend WHERE run_id = p_run_id), 0)::double precision INTO spent;
    SELECT count(*) INTO active FROM inner_jobs j JOIN runs r ON r.id = j.run_id
    WHERE j.backend = p_backend AND j.status IN ('launching', 'running') AND r.status IN ('running', 'stopping');
    job_id := NULL;
    IF spent < p_max_usd AND active < p_capacity THEN
        INSERT INTO inner_jobs (run_id, episode_id, name, backend, simulated, status, launch_count, backend_state, model_name, created_at)
        VALUES (p_run_id, p_episode_id, p_name, p_backend, p_simulated, 'launching', 0, '{}', p_model_name, now())
        RETURNING id INTO job_id;
    END IF;
END
$fn$
"""

CREATE_INNER_JOB_0008 = CREATE_INNER_JOB.replace(
    """    SELECT count(*) INTO active FROM inner_jobs j JOIN runs r ON r.id = j.run_id
    WHERE j.backend = p_backend AND j.status IN ('launching', 'running') AND r.status IN ('running', 'stopping');""",
    "    SELECT count(*) INTO active FROM inner_jobs WHERE backend = p_backend AND status IN ('launching', 'running');",
)


def upgrade() -> None:
    op.execute(CREATE_INNER_JOB)


def downgrade() -> None:
    op.execute(CREATE_INNER_JOB_0008)
