"""Run ids as users type them: `metarl.store.run_ids.resolve_run_id` on real PostgreSQL, and every command that takes a run id
(status, resume, stop, report) accepting a unique prefix, with a clear error for an ambiguous or unknown one."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from metarl.store.db import session_scope
from metarl.store.migration_head import libpq_uri
from metarl.store.records import Run, RunStatus
from tests.conftest import metarl_cli
from tests.integration.helpers import sim_config

pytestmark = pytest.mark.integration

TWINS = ("abcdef01-1111-4000-8000-000000000001", "abcdef02-2222-4000-8000-000000000002")


def add_runs(pg_url: str, *ids: str) -> None:
    with session_scope(pg_url) as session:
        for run_id in ids:
            session.add(Run(id=run_id, name="prefix-test", status=RunStatus.finished, config={}, task_specs={}, policy_version=2))


def resolve(pg_url: str, text: str) -> str:
    from metarl.store.run_ids import resolve_run_id

    with psycopg.connect(libpq_uri(pg_url)) as connection:
        return resolve_run_id(connection, text)


def test_resolver_full_ids_unique_prefixes_and_errors(pg_url: str) -> None:
    from metarl.store.run_ids import RunIdError

    lone = "0123abcd-3333-4000-8000-000000000003"
    add_runs(pg_url, *TWINS, lone)
    assert resolve(pg_url, lone) == lone
    assert resolve(pg_url, "0") == lone and resolve(pg_url, "0123ABCD") == lone  # any unique prefix, case-insensitive
    assert resolve(pg_url, "abcdef01") == TWINS[0] and resolve(pg_url, TWINS[1]) == TWINS[1]

    with pytest.raises(RunIdError) as ambiguous:
        resolve(pg_url, "abcdef0")
    assert ambiguous.value.kind == "ambiguous" and sorted(ambiguous.value.matches) == sorted(TWINS)
    assert "ambiguous" in ambiguous.value.message() and all(run_id in ambiguous.value.message() for run_id in TWINS)

    for unknown in ("f", "abcdef03", "", lone + "0", "0123\x00", "01\x1b[2J", "x'; DROP TABLE runs; --", "%", "_"):
        with pytest.raises(RunIdError) as missing:
            resolve(pg_url, unknown)
        assert missing.value.kind == "unknown" and missing.value.matches == []
        assert "\x1b" not in missing.value.message() and "\x00" not in missing.value.message()
    assert resolve(pg_url, lone[:8]) == lone  # nothing above dropped a row


def cli_env(tmp_path: Path, service_env: dict[str, str]) -> dict[str, str]:
    return dict(service_env, METARL_HOME=str(tmp_path / "home"))


def test_every_run_id_command_takes_a_unique_prefix(tmp_path: Path, service_env: dict[str, str], pg_url: str) -> None:
    env = cli_env(tmp_path, service_env)
    created = metarl_cli(["run", str(sim_config(tmp_path, max_outer_steps=1)), "--quiet"], env, timeout=300)
    assert created.returncode == 0, created.stderr[-3000:]
    with session_scope(pg_url) as session:
        (run_id,) = [run.id for run in session.query(Run).all()]
    prefix = run_id[:6]

    status = metarl_cli(["status", prefix, "--json"], env, timeout=120)  # the psycopg path
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["run"]["id"] == run_id
    episode = metarl_cli(["status", prefix.upper(), "--episode", "1"], env, timeout=120)  # the ORM path
    assert episode.returncode == 0 and json.loads(episode.stdout)["episode"]["run"] == run_id, episode.stderr

    report = metarl_cli(["report", prefix, "--out", str(tmp_path / "report")], env, timeout=300)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report" / "index.html").is_file()

    stop = metarl_cli(["stop", prefix], env, timeout=120)
    assert stop.returncode == 0 and f"stop requested for run {run_id}" in stop.stdout, stop.stderr
    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).stop_requested

    resumed = metarl_cli(["resume", prefix, "--no-workers", "--quiet"], env, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr

    add_runs(pg_url, run_id[:6] + "00-0000-4000-8000-00000000000a", run_id[:6] + "11-1111-4000-8000-00000000000b")
    for command in (
        ["status", prefix],
        ["status", prefix, "--json"],
        ["status", prefix, "--episode", "1"],
        ["report", prefix],
        ["stop", prefix],
        ["resume", prefix, "--no-workers", "--quiet"],
    ):
        refused = metarl_cli(command, env, timeout=120)
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert refused.stderr.startswith(f"error: run id prefix {prefix} is ambiguous") and run_id in refused.stderr, (command, refused.stderr)
        assert "Traceback" not in refused.stderr
        unknown = metarl_cli([command[0], "fffffff", *command[2:]], env, timeout=120)
        assert unknown.returncode == 3 and "error: no run with id fffffff" in unknown.stderr, (command, unknown.stderr)
    with session_scope(pg_url) as session:
        assert [run.stop_requested for run in session.query(Run).filter(Run.id != run_id).all()] == [False, False]
