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
from metarl.store.records import Episode, EpisodeGroup, GroupStatus, OuterStatus, OuterStep, Reward, Run, RunStatus, Stage
from metarl.store.report_data import list_runs
from metarl.store.run_ids import resolve_run_id
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


def add_held_out_group(pg_url: str, run_id: str, version: int, total: float) -> None:
    """An evaluated held-out group of one rewarded episode sampled under `version`."""
    with session_scope(pg_url) as session:
        group = EpisodeGroup(run_id=run_id, task_id="date_format", policy_version=version, size=1, held_out=True, status=GroupStatus.evaluated)
        session.add(group)
        session.flush()
        episode = Episode(
            run_id=run_id, group_id=group.id, index_in_group=0, task_id="date_format", policy_version=version, held_out=True, stage=Stage.done, probe_attempt=1
        )
        session.add(episode)
        session.flush()
        session.add(Reward(episode_id=episode.id, run_id=run_id, total=total, job=total, validation=1.0, efficiency=0.0, speed=0.0, weights={}))


def test_status_names_the_policy_version_of_every_held_out_reward(tmp_path: Path, pg_url: str) -> None:
    run_id, _ = finished_episode(pg_url)
    with session_scope(pg_url) as session:
        for step in (1, 2):
            session.add(
                OuterStep(
                    run_id=run_id,
                    step=step,
                    status=OuterStatus.done,
                    policy_version_before=step - 1,
                    policy_version_after=step,
                    n_groups=1,
                    n_episodes=1,
                    metrics={"reward_mean": 0.5},
                )
            )
    add_held_out_group(pg_url, run_id, 0, 0.25)
    add_held_out_group(pg_url, run_id, 2, 1.125)
    env = dict(status_env(tmp_path, pg_url), COLUMNS="200")
    shown = json.loads(metarl_cli(["status", run_id, "--json"], env, timeout=120).stdout)
    assert [(s["step"], s["held_out_reward"], s["held_out_version"]) for s in shown["outer_steps"]] == [(1, 0.25, 0), (2, None, None)]
    assert shown["held_out_latest"] == {"policy_version": 2, "reward": 1.125}
    tables = metarl_cli(["status", run_id], env, timeout=120)
    assert "1.1250 (v2)" in tables.stdout and "0.2500 (v0)" in tables.stdout, tables.stdout


def test_the_runs_table_shows_short_ids_that_resolve_and_fits_80_columns(tmp_path: Path, pg_url: str) -> None:
    import psycopg

    finished_episode(pg_url)
    twins = ["abcdef01-1111-4111-8111-111111111111", "abcdef01-2222-4222-8222-222222222222", "abcdef02-3333-4333-8333-333333333333"]
    with session_scope(pg_url) as session:
        for index, run_id in enumerate(twins):
            session.add(Run(id=run_id, name="a-long-run-name-with-no-spaces-" * 2, config={}, task_specs={}, status=list(RunStatus)[index]))
    with session_scope(pg_url) as session:
        listed = list_runs(session)
    short = {row["id"]: row["short_id"] for row in listed}
    assert [short[run_id] for run_id in twins] == ["abcdef01-1", "abcdef01-2", "abcdef02"]
    with psycopg.connect(libpq_uri(pg_url)) as connection:
        assert all(resolve_run_id(connection, prefix) == run_id for run_id, prefix in short.items())

    env = dict(status_env(tmp_path, pg_url), COLUMNS="80")
    table = metarl_cli(["status"], env, timeout=120)
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and max(len(line) for line in lines) <= 80, table.stdout + table.stderr
    for row in listed:
        (line,) = [line for line in lines if line.startswith(f" {row['short_id']} ")]
        assert f" {row['status']} " in line and row["id"] not in line, table.stdout
    assert {row["id"] for row in json.loads(metarl_cli(["status", "--json"], env, timeout=120).stdout)} == set(short)
