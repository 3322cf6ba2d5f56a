"""kill -9 of the orchestrator and of workers at several points of a run, then `metarl resume`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import func, select

from metarl.store.db import session_scope
from metarl.store.exactly_once import assert_exactly_once
from metarl.store.records import ClaimStatus, Episode, InnerJob, InnerJobStatus, OuterStep, Run, RunStatus, Stage, StageClaim
from tests.conftest import REPO, metarl_cli
from tests.integration.helpers import sim_config

pytestmark = pytest.mark.integration


def start_orchestrator(config, env) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metarl_cli.main", "run", str(config), "--no-workers", "--quiet"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def count(pg_url: str, statement) -> int:
    with session_scope(pg_url) as session:
        return session.execute(statement).scalar_one()


def test_kill_orchestrator_and_workers_then_resume(tmp_path, service_env, pools, pg_url):
    config = sim_config(
        tmp_path, name="crash", max_outer_steps=3, train_median_s=1.5, agent_median_s=0.6, eval_median_s=0.4, lease_s=2.0, redispatch_after_s=2.0
    )
    orchestrator = start_orchestrator(config, service_env)
    run_id_line = orchestrator.stdout.readline()
    run_id = run_id_line.split()[1]

    # Point 1: an agent stage is running -> kill -9 the agent worker mid-stage.
    running_agent = (
        select(func.count())
        .select_from(StageClaim)
        .where(StageClaim.run_id == run_id, StageClaim.stage == Stage.agent, StageClaim.status == ClaimStatus.running)
    )
    wait_until(lambda: count(pg_url, running_agent) > 0, 60, "a running agent stage")
    pools.kill_pool("agent")
    pools.start_pool("agent")

    # Point 2: an inner job is running -> kill -9 the train worker mid-job, and the orchestrator too.
    running_jobs = select(func.count()).select_from(InnerJob).where(InnerJob.run_id == run_id, InnerJob.status == InnerJobStatus.running)
    wait_until(lambda: count(pg_url, running_jobs) > 0, 60, "a running inner job")
    pools.kill_pool("train")
    os.killpg(orchestrator.pid, signal.SIGKILL)
    orchestrator.wait()
    pools.start_pool("train")

    # Point 3: resume, then kill the resumed orchestrator and the eval worker once an outer step exists.
    resumed = subprocess.Popen(
        [sys.executable, "-m", "metarl_cli.main", "resume", run_id, "--no-workers", "--quiet"],
        env=service_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    steps = select(func.count()).select_from(OuterStep).where(OuterStep.run_id == run_id)
    wait_until(lambda: count(pg_url, steps) >= 1, 120, "the first outer step")
    pools.kill_pool("eval")
    os.killpg(resumed.pid, signal.SIGKILL)
    resumed.wait()
    pools.start_pool("eval")

    # Final resume runs to the end.
    final = metarl_cli(["resume", run_id, "--no-workers", "--quiet"], service_env, timeout=300)
    assert final.returncode == 0, final.stdout + final.stderr
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run.status == RunStatus.finished
        assert_exactly_once(session, run_id, tmp_path / "artifacts")
        takeovers = session.execute(select(func.sum(StageClaim.takeovers)).where(StageClaim.run_id == run_id)).scalar_one()
        assert takeovers and takeovers >= 1, "no stage was taken over although workers were killed mid-stage"
        finished = session.execute(select(func.count()).select_from(Episode).where(Episode.run_id == run_id, Episode.stage == Stage.done)).scalar_one()
        assert finished > 0
