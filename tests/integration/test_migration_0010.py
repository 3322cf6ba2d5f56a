"""Migration 0010 on real PostgreSQL: base scores of unknown build are dropped, stored task specs lose the removed fields
(and get them back on downgrade, so the older schema still reads them)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from metarl.store import db
from metarl.store.migration_head import normalise_url
from schemas.task_spec import TaskSpec

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def old_spec(task_id: str) -> dict[str, object]:
    """A spec as runs stored it before 0010: `data.generator` and a `[grader]` table."""
    spec = tomllib.loads((REPO / "tasks_specs" / f"{task_id}.toml").read_text())
    spec["data"] = {"generator": spec["family"], **spec["data"]}
    spec["grader"] = {"kind": "family", "partial_credit": True}
    return spec


def test_upgrade_drops_unkeyed_scores_and_removed_spec_fields_and_downgrade_restores_them(pg_url: str) -> None:
    command.downgrade(db.alembic_config(pg_url), "0009")
    db.dispose_engines()
    engine = create_engine(normalise_url(pg_url))
    specs = {"addition": old_spec("addition"), "caesar": old_spec("caesar")}
    try:
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO runs (id, name, status, config, task_specs, policy_version, stop_requested) VALUES (:id, 'old', 'running', '{}', :specs, 0, false)"
                ),
                {"id": "old-run", "specs": json.dumps(specs)},
            )
            connection.execute(
                text(
                    "INSERT INTO runs (id, name, status, config, task_specs, policy_version, stop_requested) VALUES ('empty', 'e', 'running', '{}', '{}', 0, false)"
                )
            )
            connection.execute(
                text(
                    "INSERT INTO baseline_scores (task_id, model_name, eval_version, backend, score, n_items) VALUES ('addition', 'local-s', 1, 'local', 0.2, 200)"
                )
            )
        db.upgrade(pg_url)
        with engine.connect() as connection:
            stored = connection.execute(text("SELECT task_specs FROM runs WHERE id = 'old-run'")).scalar_one()
            assert connection.execute(text("SELECT task_specs FROM runs WHERE id = 'empty'")).scalar_one() == {}
            assert connection.execute(text("SELECT count(*) FROM baseline_scores")).scalar_one() == 0
        for task_id, spec in stored.items():
            parsed = TaskSpec.model_validate(spec)
            assert parsed.family == task_id and "grader" not in spec and "generator" not in spec["data"]
            assert spec["data"]["min_dataset_size"] == specs[task_id]["data"]["min_dataset_size"]  # type: ignore[index]

        command.downgrade(db.alembic_config(pg_url), "0009")
        db.dispose_engines()
        with engine.connect() as connection:
            restored = connection.execute(text("SELECT task_specs FROM runs WHERE id = 'old-run'")).scalar_one()
        assert restored == specs
    finally:
        engine.dispose()
    db.upgrade(pg_url)
