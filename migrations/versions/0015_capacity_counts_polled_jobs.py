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

from importlib import import_module

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

CREATE_INNER_JOB_0014 = import_module("migrations.versions.0014_capacity_counts_live_runs").CREATE_INNER_JOB
COUNT_0014 = """    SELECT count(*) INTO active FROM inner_jobs j JOIN runs r ON r.id = j.run_id
    WHERE j.backend = p_backend AND j.status IN ('launching', 'running') AND r.status IN ('running', 'stopping');"""
COUNT = """    SELECT count(*) INTO active FROM inner_jobs j
    WHERE j.backend = p_backend AND j.status IN ('launching', 'running') AND metarl_inner_job_holds_slot(j.id);"""
if COUNT_0014 not in CREATE_INNER_JOB_0014:
    raise ImportError("migration 0014's capacity count is not the one 0015 replaces")
CREATE_INNER_JOB = CREATE_INNER_JOB_0014.replace(COUNT_0014, COUNT)
"""Migration 0014's function with the count of slot-holding jobs replaced (the lock, the budget and the insert are unchanged)."""


def upgrade() -> None:
    op.execute(HOLDS_SLOT)
    op.execute(CREATE_INNER_JOB)


def downgrade() -> None:
    op.execute(CREATE_INNER_JOB_0014)
    op.execute("DROP FUNCTION metarl_inner_job_holds_slot(bigint)")
