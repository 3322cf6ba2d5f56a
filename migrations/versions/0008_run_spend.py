"""run_spend: each run's total of the cost ledger, kept by triggers on the ledger, so the budget checks stop summing the ledger

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 07:00:00.000000

Every train submit (`metarl_create_inner_job`, under the backend's advisory lock) and every
orchestrator tick read the run's spend. Summed from the ledger, that read grew with the run: about
12 ms a call at 100,000 episodes (bench.scale, pg_stat_statements), so the pipeline slowed by a
third and the submits queued behind the lock. Statement-level triggers add the charges each
statement inserts (an idempotent replay inserts no row and adds nothing) to their run's single
`run_spend` row, and take deleted and changed lines back out, so the row always equals the
ledger's sum whatever writes the ledger. The ledger is locked against writers while the totals are filled in
from the rows already there.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION metarl_run_spend_after_charges() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE run_spend s SET amount_usd = s.amount_usd - d.amount_usd, entries = s.entries - d.entries
        FROM (SELECT run_id, sum(amount_usd) AS amount_usd, count(*) AS entries FROM removed_lines GROUP BY run_id) d
        WHERE s.run_id = d.run_id;
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO run_spend (run_id, amount_usd, entries)
        SELECT run_id, sum(amount_usd), count(*) FROM added_lines GROUP BY run_id ORDER BY run_id
        ON CONFLICT (run_id) DO UPDATE SET amount_usd = run_spend.amount_usd + EXCLUDED.amount_usd, entries = run_spend.entries + EXCLUDED.entries;
        RETURN NULL;
    END IF;
    INSERT INTO run_spend (run_id, amount_usd, entries)
    SELECT run_id, sum(amount_usd), sum(entries)
    FROM (SELECT run_id, amount_usd, 1 AS entries FROM added_lines UNION ALL SELECT run_id, -amount_usd, -1 FROM removed_lines) change
    GROUP BY run_id HAVING sum(amount_usd) <> 0 OR sum(entries) <> 0 ORDER BY run_id
    ON CONFLICT (run_id) DO UPDATE SET amount_usd = run_spend.amount_usd + EXCLUDED.amount_usd, entries = run_spend.entries + EXCLUDED.entries;
    RETURN NULL;
END
$fn$
"""
"""One statement's net change to the ledger, per run, added to the runs' totals (statement-level: a bulk insert is one upsert per run)."""
TRIGGERS = {
    "trg_cost_ledger_spend_insert": "AFTER INSERT ON cost_ledger REFERENCING NEW TABLE AS added_lines",
    "trg_cost_ledger_spend_delete": "AFTER DELETE ON cost_ledger REFERENCING OLD TABLE AS removed_lines",
    "trg_cost_ledger_spend_update": "AFTER UPDATE ON cost_ledger REFERENCING OLD TABLE AS removed_lines NEW TABLE AS added_lines",
}

CREATE_INNER_JOB = """
CREATE OR REPLACE FUNCTION metarl_create_inner_job(
    p_run_id text, p_episode_id bigint, p_name text, p_backend text, p_simulated boolean, p_model_name text,
    p_max_usd double precision, p_capacity integer,
    OUT spent double precision, OUT active bigint, OUT job_id bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('metarl:inner-job-capacity:' || p_backend, 0));
    SELECT coalesce((SELECT amount_usd FROM run_spend WHERE run_id = p_run_id), 0)::double precision INTO spent;
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

CREATE_INNER_JOB_0005 = CREATE_INNER_JOB.replace(
    "SELECT coalesce((SELECT amount_usd FROM run_spend WHERE run_id = p_run_id), 0)::double precision INTO spent;",
    "SELECT coalesce(sum(amount_usd), 0)::double precision INTO spent FROM cost_ledger WHERE run_id = p_run_id;",
)


def upgrade() -> None:
    op.create_table(
        "run_spend",
        sa.Column("run_id", sa.String(length=36), nullable=False),
        sa.Column("amount_usd", sa.Numeric(), nullable=False),
        sa.Column("entries", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_spend_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_run_spend")),
    )
    op.execute("LOCK TABLE cost_ledger IN SHARE ROW EXCLUSIVE MODE")
    op.execute(TRIGGER_FUNCTION)
    for name, when in TRIGGERS.items():
        op.execute(f"CREATE TRIGGER {name} {when} FOR EACH STATEMENT EXECUTE FUNCTION metarl_run_spend_after_charges()")
    op.execute("INSERT INTO run_spend (run_id, amount_usd, entries) SELECT run_id, sum(amount_usd), count(*) FROM cost_ledger GROUP BY run_id")
    op.execute(CREATE_INNER_JOB)


def downgrade() -> None:
    op.execute(CREATE_INNER_JOB_0005)
    for name in TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS {name} ON cost_ledger")
    op.execute("DROP FUNCTION IF EXISTS metarl_run_spend_after_charges()")
    op.drop_table("run_spend")
