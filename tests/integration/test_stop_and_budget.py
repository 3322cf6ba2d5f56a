"""Graceful stop and the run-level budget cap."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select

from metarl.pools import stop_process_group
from metarl.store.db import session_scope
from metarl.store.records import Episode, Run, RunStatus, Stage
from tests.conftest import REPO, metarl_cli
from tests.integration.helpers import assert_exactly_once, sim_config

pytestmark = pytest.mark.integration


def test_stop_lets_in_flight_episodes_finish_and_resume_continues(tmp_path, service_env, pools, pg_url):
    config = sim_config(tmp_path, name="stoppable", max_outer_steps=6, train_median_s=0.8)
    process = subprocess.Popen(
        [sys.executable, "-m", "metarl_cli.main", "run", str(config), "--no-workers", "--quiet"],
        env=service_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        run_id = process.stdout.readline().split()[1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with session_scope(pg_url) as session:
                if session.execute(select(func.count()).select_from(Episode).where(Episode.run_id == run_id)).scalar_one() >= 4:
                    break
            time.sleep(0.2)
        stopped = metarl_cli(["stop", run_id], service_env)
        assert stopped.returncode == 0, stopped.stderr
        assert process.wait(timeout=120) == 0
    finally:
        stop_process_group(process)
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run.status == RunStatus.stopped
        active = session.execute(
            select(func.count()).select_from(Episode).where(Episode.run_id == run_id, Episode.stage.not_in((Stage.done, Stage.failed)))
        ).scalar_one()
        assert active == 0
    resumed = metarl_cli(["resume", run_id, "--no-workers", "--quiet"], service_env, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).status == RunStatus.finished
        assert_exactly_once(session, run_id, tmp_path / "artifacts")


def test_budget_cap_stops_launching_and_says_so(tmp_path, service_env, pools, pg_url):
    config = sim_config(tmp_path, name="capped", max_outer_steps=20, train_median_s=2.0, extra="[budget]\nmax_run_usd = 0.002\n")
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], service_env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.split()[1]
    status = json.loads(metarl_cli(["status", run_id, "--json"], service_env).stdout)
    assert status["run"]["status"] == "stopped"
    assert "budget" in status["run"]["message"]
    assert len(status["outer_steps"]) < 20
    with session_scope(pg_url) as session:
        assert_exactly_once(session, run_id, tmp_path / "artifacts")
