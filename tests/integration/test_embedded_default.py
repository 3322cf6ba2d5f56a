"""The embedded default end to end: no Redis, no PostgreSQL server, no environment settings.

`metarl run examples/sim.toml` from a fresh folder starts the embedded PostgreSQL and the
file-backed broker, finishes the run, and leaves no process running and nothing outside its home.
Its workers never read a half-written message (`metarl.messaging.fs_broker`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO, metarl_cli

SERVICE_SETTINGS = ("METARL_DATABASE_URL", "METARL_BROKER_URL", "METARL_HOME")


def postgres_processes_under(folder: Path) -> list[str]:
    found = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line for line in found if "postgres" in line and str(folder) in line]


def test_sim_example_runs_on_the_embedded_default_and_leaves_nothing_behind(tmp_path: Path) -> None:
    workdir = tmp_path / "fresh"
    (workdir / "examples").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "sim.toml", workdir / "examples" / "sim.toml")
    shutil.copytree(REPO / "tasks_specs", workdir / "tasks_specs")
    env = {key: value for key, value in os.environ.items() if key not in SERVICE_SETTINGS}
    try:
        result = metarl_cli(["run", "examples/sim.toml", "--quiet"], env, timeout=240, cwd=workdir)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        status = metarl_cli(["status", "--json"], env, timeout=120, cwd=workdir)
        assert status.returncode == 0, status.stderr[-2000:]
    finally:
        leftover = postgres_processes_under(workdir)
    assert leftover == [], f"embedded PostgreSQL left running: {leftover}"
    assert sorted(path.name for path in workdir.iterdir()) == [".metarl", "examples", "tasks_specs"], "files written outside METARL_HOME"
    logs = sorted((workdir / ".metarl" / "logs").glob("worker-*.log"))
    assert len(logs) == 5
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Unrecoverable error" not in text and "JSONDecodeError" not in text, f"{log.name}: a worker crashed"
