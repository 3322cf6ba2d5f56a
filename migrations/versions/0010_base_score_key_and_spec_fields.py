"""baseline_scores keyed by everything a base score depends on; stored task specs lose the fields that did nothing

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 09:00:00.000000

A cached base score was keyed by (task, model name, eval version, backend): a rebuilt local
stand-in model (another families, tokenizer or recipe), another `model_scale`, `pass_k`, eval size,
grader or scorer setting reused the old score, and the reward was the trained score minus the
wrong base. The key now also holds model_build, model_scale, eval_items, pass_k, grader and scorer
(`metarl.interfaces.BaseScoreKey`). The rows already stored do not say which build they were
measured on, so they are deleted: the next eval measures again (each evaluation keeps its own
base_score).

Task specs lost `data.generator` and the `[grader]` table (they changed only TASK.md text; the
family's own generator and grader are what run); the specs stored with each run are rewritten
without them, so a resumed run's specs still validate.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

KEY_COLUMNS = ("task_id", "model_name", "model_build", "model_scale", "eval_version", "eval_items", "pass_k", "grader", "backend", "scorer")

DROP_REMOVED_SPEC_FIELDS = """
UPDATE runs SET task_specs = (
    SELECT coalesce(jsonb_object_agg(spec.key, (spec.value::jsonb - 'grader') #- '{data,generator}'), '{}'::jsonb)::json
    FROM json_each(runs.task_specs) AS spec
)
WHERE EXISTS (
    SELECT 1 FROM json_each(runs.task_specs) AS spec
    WHERE spec.value::jsonb -> 'grader' IS NOT NULL OR spec.value::jsonb -> 'data' -> 'generator' IS NOT NULL
)
"""

RESTORE_REMOVED_SPEC_FIELDS = """
UPDATE runs SET task_specs = (
    SELECT coalesce(jsonb_object_agg(
        spec.key,
        jsonb_set(spec.value::jsonb, '{data,generator}', to_jsonb(spec.value::jsonb ->> 'family'))
            || '{"grader": {"kind": "family", "partial_credit": true}}'::jsonb
    ), '{}'::jsonb)::json
    FROM json_each(runs.task_specs) AS spec
)
WHERE EXISTS (SELECT 1 FROM json_each(runs.task_specs) AS spec WHERE spec.value::jsonb -> 'data' IS NOT NULL)
"""
"""The removed fields as the shipped specs had them (the family's generator, `kind = "family"`, partial credit), which the old schema requires."""


def upgrade() -> None:
    op.execute("DELETE FROM baseline_scores")
    op.drop_constraint("uq_baseline_scores_task_id", "baseline_scores", type_="unique")
    op.add_column("baseline_scores", sa.Column("model_build", sa.String(length=200), nullable=False))
    op.add_column("baseline_scores", sa.Column("model_scale", sa.Float(), nullable=False))
    op.add_column("baseline_scores", sa.Column("eval_items", sa.Integer(), nullable=False))
    op.add_column("baseline_scores", sa.Column("pass_k", sa.Integer(), nullable=False))
    op.add_column("baseline_scores", sa.Column("grader", sa.String(length=64), nullable=False))
    op.add_column("baseline_scores", sa.Column("scorer", sa.String(length=200), nullable=False))
    op.create_unique_constraint("uq_baseline_scores_key", "baseline_scores", list(KEY_COLUMNS))
    op.execute(DROP_REMOVED_SPEC_FIELDS)


def downgrade() -> None:
    op.execute(RESTORE_REMOVED_SPEC_FIELDS)
    op.execute("DELETE FROM baseline_scores")  # rows of several builds may share the old key
    op.drop_constraint("uq_baseline_scores_key", "baseline_scores", type_="unique")
    for column in ("scorer", "grader", "pass_k", "eval_items", "model_scale", "model_build"):
        op.drop_column("baseline_scores", column)
    op.create_unique_constraint("uq_baseline_scores_task_id", "baseline_scores", ["task_id", "model_name", "eval_version", "backend"])
