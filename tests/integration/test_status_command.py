"""`metarl status RUN_ID` reads the records over one psycopg connection, without SQLAlchemy, and falls back to the migrating path when it must."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from metarl.store import db
from metarl.store.db import psycopg_connection, session_scope
from metarl.store.migration_head import head_revision, libpq_uri, revision_of
from metarl.store.status import run_status
from tests.conftest import REPO, metarl_cli
from tests.integration.helpers import finished_episode

pytestmark = pytest.mark.integration

STATUS_AND_MODULES = """
import json, runpy, sys
sys.argv = ["metarl", "status", *sys.argv[1:]]
try:
    runpy.run_module("metarl_cli.main", run_name="__main__")
except SystemExit as done:
    code = done.code
print(json.dumps({"exit": code, "sqlalchemy": "sqlalchemy" in sys.modules, "records": "metarl.store.records" in sys.modules}), file=sys.stderr)
"""


def status_env(tmp_path: Path, pg_url: str) -> dict[str, str]:
    env = dict(os.environ, METARL_DATABASE_URL=pg_url, METARL_HOME=str(tmp_path / "home"))
    env.pop("METARL_BROKER_URL", None)
    return env


def test_status_of_a_run_imports_no_sqlalchemy_and_shows_what_the_orm_path_shows(tmp_path: Path, pg_url: str) -> None:
    run_id, episode_id = finished_episode(pg_url)
    done = subprocess.run(
        [sys.executable, "-c", STATUS_AND_MODULES, run_id, "--json"], env=status_env(tmp_path, pg_url), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    facts = json.loads(done.stderr.strip().splitlines()[-1])
    assert facts == {"exit": 0, "sqlalchemy": False, "records": False}, done.stderr
    shown = json.loads(done.stdout)
    assert shown["episodes_by_stage"]["done"] == 1 and shown["probe_attempts"] == {"total": 1, "passed": 1}
    assert shown["rewards"]["episodes"] == 1 and shown["rewards"]["total_mean"] == 0.5
    assert [episode["episode"] for episode in shown["recent_episodes"]] == [episode_id]
    with session_scope(pg_url) as session:  # the report reads the same function inside an ORM session's transaction
        through_session = run_status(psycopg_connection(session), run_id)
    assert json.loads(json.dumps(through_session, default=str)) == shown

    tables = metarl_cli(["status", run_id], status_env(tmp_path, pg_url), timeout=120)
    assert tables.returncode == 0 and run_id in tables.stdout, tables.stderr
    missing = metarl_cli(["status", "00000000-0000-4000-8000-000000000000"], status_env(tmp_path, pg_url), timeout=120)
    assert missing.returncode == 3 and "no run with id 00000000-0000-4000-8000-000000000000" in missing.stderr and "Traceback" not in missing.stderr
    hostile = metarl_cli(["status", "x'; DROP TABLE runs; --\x1b[2J"], status_env(tmp_path, pg_url), timeout=120)
    assert hostile.returncode == 3 and "\x1b" not in hostile.stderr and "Traceback" not in hostile.stderr
    assert metarl_cli(["status", run_id, "--json"], status_env(tmp_path, pg_url), timeout=120).returncode == 0  # the runs table is still there


def test_status_of_a_database_behind_the_migrations_migrates_it_first(tmp_path: Path, pg_url: str) -> None:
    from alembic import command

    run_id, _ = finished_episode(pg_url)
    command.downgrade(db.alembic_config(pg_url), "0006")
    db.dispose_engines()
    result = metarl_cli(["status", run_id, "--json"], status_env(tmp_path, pg_url), timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rewards"]["episodes"] == 1
    import psycopg

    with psycopg.connect(libpq_uri(pg_url)) as connection:
        assert revision_of(connection) == head_revision()


def test_status_with_the_database_down_says_so(tmp_path: Path) -> None:
    env = status_env(tmp_path, "postgresql+psycopg://postgres@127.0.0.1:9/nothing")
    result = metarl_cli(["status", "00000000-0000-4000-8000-000000000000"], env, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert (
        result.stderr.startswith("error: cannot read the run database postgresql+psycopg://postgres@127.0.0.1:9/nothing: ")
        and "METARL_DATABASE_URL" in result.stderr
    )
    secret = metarl_cli(["status", "x"], status_env(tmp_path, "postgresql+psycopg://postgres:hunter2@127.0.0.1:9/nothing"), timeout=120)
    assert "hunter2" not in secret.stderr and ":***@" in secret.stderr
