"""The real `metarl` CLI against real Postgres/Redis with malformed and hostile run configs.

Every case must: exit 2, name the bad field and the fix on stderr, print no traceback, and leave
the database (every table) exactly as it was, without starting embedded services.
(The broker is not compared: tests/conftest.py's redis_url picks one of 15 Redis databases at
random, so concurrent test sessions on one machine can share it.)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import tomli_w
from sqlalchemy import create_engine, inspect, text

from tests.conftest import REPO, metarl_cli

pytestmark = pytest.mark.integration

QUICKSTART = REPO / "examples" / "sim.toml"
SPECS = REPO / "tasks_specs"
EXIT_CONFIG_ERROR = 2


def quickstart() -> str:
    """The quickstart with task specs resolved from the repository, wherever the config is written."""
    text = QUICKSTART.read_text()
    assert 'task_specs_dir = "../tasks_specs"' in text
    return text.replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{SPECS}"')


def edited(old: str, new: str) -> Callable[[Path], bytes]:
    def make(_: Path) -> bytes:
        source = quickstart()
        assert old in source, old
        return source.replace(old, new, 1).encode()

    return make


def appended(extra: str) -> Callable[[Path], bytes]:
    return lambda _: (quickstart() + "\n" + extra).encode()


def raw(content: bytes) -> Callable[[Path], bytes]:
    return lambda _: content


def without(table: str) -> Callable[[Path], bytes]:
    def make(_: Path) -> bytes:
        data = tomllib.loads(quickstart())
        del data[table]
        return tomli_w.dumps(data).encode()

    return make


def with_specs(specs: dict[str, str], tasks: list[str]) -> Callable[[Path], bytes]:
    """A config whose task specs live in tmp/specs (for id-mismatch and held-out cases)."""

    def make(tmp: Path) -> bytes:
        folder = tmp / "specs"
        folder.mkdir()
        for name, spec_text in specs.items():
            (folder / f"{name}.toml").write_text(spec_text)
        data = tomllib.loads(quickstart())
        data["run"]["tasks"] = tasks
        data["run"]["task_specs_dir"] = "specs"
        return tomli_w.dumps(data).encode()

    return make


def spec(task_id: str) -> str:
    return (SPECS / f"{task_id}.toml").read_text()


# name -> (config content maker, a field name that must appear on stderr)
CASES: dict[str, tuple[Callable[[Path], bytes], str]] = {
    "unknown-key": (edited("[window]\n", "[window]\nin_fligth = 3\n"), "window.in_fligth"),
    "unknown-table": (appended("[windows]\nin_flight = 3\n"), "windows"),
    "wrong-type": (edited("seed = 0", 'seed = "zero"'), "run.seed"),
    "out-of-bounds": (edited("in_flight = 8", "in_flight = 0"), "window.in_flight"),
    "negative-budget": (edited("max_run_usd = 10.0", "max_run_usd = -1e9"), "budget.max_run_usd"),
    "missing-backends-table": (without("backends"), "backends"),
    "missing-run-table": (without("run"), "run"),
    "empty-file": (raw(b""), "run"),
    "invalid-toml": (edited("[window]", "[window"), "(syntax)"),
    "duplicate-key": (edited("seed = 0", "seed = 0\nseed = 1"), "(syntax)"),
    "invalid-utf8": (raw(b'[run]\nname = "\xff\xfe"\n'), "(file)"),
    "binary-garbage": (raw(bytes(range(256)) * 64), "(file)"),
    "deeply-nested": (raw(b"a = " + b"[" * 100_000 + b"]" * 100_000), "(structure)"),
    "deep-tables": (raw(("[" + ".".join(["t"] * 40) + "]\nx = 1\n").encode()), "(structure)"),
    "huge-file": (raw(b"# x\n" * 300_000), "(file)"),
    "wrong-backend-type": (edited('[backends.train]\ntype = "sim"', '[backends.train]\ntype = "runpod-free-gpus"'), "backends.train"),
    "speed-weight-too-large": (appended("[reward]\njob = 1.0\nspeed = 0.9\n"), "reward"),
    "sql-in-run-name": (edited('name = "sim-loop"', 'name = "x\'); DROP TABLE runs; --"'), "run.name"),
    "too-many-tasks": (edited('tasks = ["addition"', "tasks = [" + ", ".join('"addition"' for _ in range(300)) + ', "addition"'), "run.tasks"),
    "missing-task-spec": (edited('tasks = ["addition"', 'tasks = ["no_such_task", "addition"'), "run.tasks.0"),
    "task-id-mismatch": (with_specs({"addition": spec("caesar")}, ["addition"]), "id"),
    "every-task-held-out": (
        with_specs(
            {"addition": spec("addition").replace("held_out = false", "held_out = true"), "date_format": spec("date_format")}, ["addition", "date_format"]
        ),
        "run.tasks",
    ),
    "invalid-task-spec": (with_specs({"addition": spec("addition").replace("n_items = 200", "n_items = 1")}, ["addition"]), "hidden_eval.n_items"),
    # issue 40: a task listed twice, a simulated median above its clamp, a password in a URL of the config
    "duplicate-task": (edited('tasks = ["addition"', 'tasks = ["addition", "addition"'), "run.tasks"),
    "median-above-max": (edited("median_s = 0.1, sigma = 0.5, max_s = 2.0", "median_s = 9.0, sigma = 0.5, max_s = 2.0"), "backends.agent.duration"),
    "password-in-database-url": (appended('[services]\ndatabase_url = "postgresql+psycopg://postgres:hunter2@127.0.0.1:5432/x"\n'), "services.database_url"),
    "password-in-broker-url": (appended('[services]\nbroker_url = "redis://:hunter2@127.0.0.1:6379/0"\n'), "services.broker_url"),
}


def snapshot(database_url: str) -> dict[str, int]:
    """Row count of every table in the database (alembic_version included)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            tables = inspect(connection).get_table_names()
            return {table: connection.execute(text(f'SELECT count(*) FROM "{table}"')).scalar_one() for table in sorted(tables)}
    finally:
        engine.dispose()


def assert_config_error(result: subprocess.CompletedProcess[str], field: str) -> None:
    context = f"exit {result.returncode}\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == EXIT_CONFIG_ERROR, context
    assert "Traceback (most recent call last)" not in result.stderr, context
    assert result.stderr.startswith("error: "), context
    assert f"- {field}" in result.stderr or f"{field}:" in result.stderr, context
    assert "Fix:" in result.stderr, context
    assert "created" not in result.stdout, context


def run_bad(tmp_path: Path, service_env: dict[str, str], config: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    before = snapshot(service_env["METARL_DATABASE_URL"])
    assert before.get("runs") == 0 and "alembic_version" in before
    env = dict(service_env, METARL_HOME=str(tmp_path / "home"))
    result = metarl_cli(["run", str(config), "--no-workers", "--quiet"], env, timeout=60, **kwargs)  # type: ignore[arg-type]
    assert snapshot(service_env["METARL_DATABASE_URL"]) == before, "a rejected config changed the database"
    assert not (tmp_path / "home").exists(), "a rejected config started embedded services"
    return result


@pytest.mark.parametrize("case", list(CASES))
def test_bad_run_config(case: str, tmp_path: Path, service_env: dict[str, str]) -> None:
    make, field = CASES[case]
    config = tmp_path / "run.toml"
    config.write_bytes(make(tmp_path))
    assert_config_error(run_bad(tmp_path, service_env, config), field)


def test_several_bad_fields_are_all_reported(tmp_path: Path, service_env: dict[str, str]) -> None:
    text = quickstart().replace("in_flight = 8", "in_flight = -1", 1).replace("group_size = 4", 'group_size = "x"', 1)
    config = tmp_path / "run.toml"
    config.write_text(text + "\n[budget2]\nx = 1\n")
    result = run_bad(tmp_path, service_env, config)
    for field in ("window.in_flight", "outer.group_size", "budget2"):
        assert_config_error(result, field)
    assert result.stderr.count("Fix:") == 3


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_unreadable_config_path(where: str, tmp_path: Path, service_env: dict[str, str]) -> None:
    config = tmp_path / "nope.toml" if where == "missing" else tmp_path
    assert_config_error(run_bad(tmp_path, service_env, config), "(file)")


def test_relative_config_path_from_another_cwd(tmp_path: Path, service_env: dict[str, str]) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "run.toml").write_text(quickstart().replace("seed = 0", "seed = -3", 1))
    result = run_bad(tmp_path, service_env, Path("cfg/run.toml"), cwd=tmp_path)
    assert_config_error(result, "run.seed")


def test_hostile_resume_id_changes_nothing(tmp_path: Path, service_env: dict[str, str]) -> None:
    before = snapshot(service_env["METARL_DATABASE_URL"])
    env = dict(service_env, METARL_HOME=str(tmp_path / "home"))
    result = metarl_cli(["resume", "x'; DROP TABLE runs; --", "--no-workers", "--quiet"], env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "no run with id" in result.stderr
    assert snapshot(service_env["METARL_DATABASE_URL"]) == before


# ---- known bugs in files this test does not own (see the report); strict, so a fix turns them green.


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_endless_config_file(tmp_path: Path, service_env: dict[str, str]) -> None:
    before = snapshot(service_env["METARL_DATABASE_URL"])
    result = subprocess.run(
        [sys.executable, "-m", "metarl_cli.main", "run", "/dev/zero", "--no-workers", "--quiet"],
        env=dict(service_env, METARL_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        preexec_fn=_limit_memory,
    )
    assert snapshot(service_env["METARL_DATABASE_URL"]) == before
    assert_config_error(result, "(file)")


def test_fifo_config_file(tmp_path: Path, service_env: dict[str, str]) -> None:
    fifo = tmp_path / "run.toml"
    os.mkfifo(fifo)
    result = metarl_cli(["run", str(fifo), "--no-workers", "--quiet"], dict(service_env, METARL_HOME=str(tmp_path / "home")), timeout=10)
    assert_config_error(result, "(file)")


def test_config_path_through_a_file(tmp_path: Path, service_env: dict[str, str]) -> None:
    (tmp_path / "file").write_text("x = 1\n")
    assert_config_error(run_bad(tmp_path, service_env, tmp_path / "file" / "run.toml"), "(file)")


def test_no_terminal_escapes_on_stderr(tmp_path: Path, service_env: dict[str, str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text(quickstart().replace("[window]\n", '[window]\n"\\u001b]0;pwned\\u0007\\u001b[2J" = 1\n', 1))
    result = run_bad(tmp_path, service_env, config)
    assert result.returncode == EXIT_CONFIG_ERROR
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
