"""Services mode is one thing for every command: `--config`'s [services] or the environment, and no silent fallback to the
embedded database once a folder's runs live in services mode (metarl_cli/services.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import metarl_cli
from tests.integration.helpers import sim_config

pytestmark = pytest.mark.integration


def without_services(env: dict[str, str], home: Path) -> dict[str, str]:
    bare = {key: value for key, value in env.items() if key not in ("METARL_DATABASE_URL", "METARL_BROKER_URL")}
    return {**bare, "METARL_HOME": str(home)}


def test_every_command_reads_the_run_config_services_and_refuses_the_embedded_fallback(tmp_path: Path, pg_url: str, redis_url: str) -> None:
    home = tmp_path / "home"
    config = sim_config(tmp_path, name="services", max_outer_steps=1, failure_rate=0.0)
    config.write_text(config.read_text() + f'\n[services]\ndatabase_url = "{pg_url}"\nbroker_url = "{redis_url}"\n')
    env = without_services(dict(os.environ), home)
    done = metarl_cli(["run", str(config), "--quiet"], env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((home / "services.json").read_text())["database_url"] == pg_url  # no password in this URL to hide

    listed = metarl_cli(["status", "--json", "--config", str(config)], env)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["name"] == "services", listed.stdout + listed.stderr
    stop = metarl_cli(["stop", json.loads(listed.stdout)[0]["short_id"], "--config", str(config)], env)
    assert stop.returncode == 0, stop.stderr

    refused = metarl_cli(["status"], env)
    assert refused.returncode != 0
    assert "live in services mode" in refused.stderr and "METARL_DATABASE_URL" in refused.stderr and "--config" in refused.stderr, refused.stderr
    assert not (home / "pgdata").exists(), "the embedded database was started"

    worker = metarl_cli(["worker", "--pool", "agent"], without_services(dict(os.environ), tmp_path / "other"), timeout=60)
    assert worker.returncode == 2 and "METARL_DATABASE_URL" in worker.stderr, worker.stderr
