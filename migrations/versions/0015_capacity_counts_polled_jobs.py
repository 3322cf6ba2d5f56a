"""metarl_create_inner_job also counts the jobs a worker still polls, whatever their run's status

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 06:50:00.000000

Migration 0014 counted only the jobs of runs that are `running` or `stopping`. An interrupted run's
stages go on (schemas/states.py: interrupted is not ended): with pools on other hosts, a train worker
keeps polling its pod after the orchestrator was stopped, and that pod holds a slot of the backend.
A job now holds its slot while its run is driven, or while its episode's train claim is running with a
heartbeat younger than its run's lease plus its train backend's poll interval (`retries.lease_s` and
`backends.train.poll_interval_s` in the run's config: each poll renews the heartbeat). A job nobody polls
(the embedded default's workers stop with its orchestrator) frees its slot once that time has passed.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

HOLDS_SLOT = """
CREATE OR REPLACE FUNCTION metarl_inner_job_holds_slot(p_job_id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM inner_jobs j JOIN runs r ON r.id = j.run_id
        WHERE j.id = p_job_id AND j.status IN ('launching', 'running')
          AND (r.status IN ('running', 'stopping') OR EXISTS (
              SELECT 1 FROM stage_claims c
              WHERE c.episode_id = j.episode_id AND c.stage = 'train' AND c.status = 'running'
                AND c.heartbeat_at > now() - make_interval(secs => (r.config->'retries'->>'lease_s')::double precision
                    + coalesce((r.config->'backends'->'train'->>'poll_interval_s')::double precision, 0)))))
$fn$
"""
"""Whether the inner job holds a slot of its train backend: the one definition (the capacity count below, the progress display's
slots held elsewhere in metarl/store/progress.py)."""

CREATE_INNER_JOB = """
CREATE OR REPLACE FUNCTION metarl_create_inner_job(
    p_run_id text, p_episode_id bigint, p_name text, p_backend text, p_simulated boolean, p_model_name text,
    p_max_usd double precision, p_capacity integer,
    OUT spent double precision, OUT active bigint, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('metarl:inner-job-capacity:' || p_backend, 0));
    SELECT coalesce((SELECT amount_usd FROM run_spend WHERE run_id = p_run_id), 0)::double precision INTO spent;
    SELECT count(*) INTO active FROM inner_jobs j
    WHERE j.backend = p_backend AND j.status IN ('launching', 'running') AND metarl_inner_job_holds_slot(j.id);
    job_id := NULL;
    IF spent < p_max_usd AND active < p_capacity THEN
        INSERT INTO inner_jobs (run_id, episode_id, name, backend, simulated, status, launch_count, backend_state, model_name, created_at)
        VALUES (p_run_id, p_episode_id, p_name, p_backend, p_simulated, 'launching', 0, '{}', p_model_name, now())
        RETURNING id INTO job_id;
    END IF;
END
$fn$
"""


def upgrade() -> None:
    op.execute(HOLDS_SLOT)
    op.execute(CREATE_INNER_JOB)


def downgrade() -> None:
    from importlib import import_module

    op.execute(import_module("migrations.versions.0014_capacity_counts_live_runs").CREATE_INNER_JOB)
    op.execute("DROP FUNCTION metarl_inner_job_holds_slot(bigint)")
