"""A whole run against real Redis and PostgreSQL, each pool a separate worker process."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select

from metarl.store.db import session_scope
from metarl.store.records import EpisodeGroup, OuterStep, Run, RunStatus
from tests.conftest import metarl_cli
from tests.integration.helpers import assert_exactly_once, sim_config

pytestmark = pytest.mark.integration


def run_id_from(output: str) -> str:
    match = re.search(r"run ([0-9a-f\-]{36})", output)
    assert match, output
    return match.group(1)


def test_sim_run_completes_on_real_services(tmp_path, service_env, pools, pg_url):
    config = sim_config(tmp_path, max_outer_steps=3)
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], service_env, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    run_id = run_id_from(done.stdout)
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run.status == RunStatus.finished
        assert run.policy_version == 3
        assert_exactly_once(session, run_id, tmp_path / "artifacts")
    status = metarl_cli(["status", run_id, "--json"], service_env)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["run"]["status"] == "finished"
    assert [step["status"] for step in report["outer_steps"]] == ["done"] * 3
    assert report["episodes_by_stage"]["done"] + report["episodes_by_stage"]["failed"] == sum(report["episodes_by_stage"].values())
    assert report["rewards"]["episodes"] > 0
    assert report["queue_depths"]["agent"] is not None
    table = metarl_cli(["status", run_id], service_env)
    assert "reward by outer step" in table.stdout and "finished" in table.stdout
    trained = next(e for e in report["recent_episodes"] if e["job"] is not None and e["job"] != 0)
    episode = json.loads(metarl_cli(["status", "--episode", str(trained["episode"])], service_env).stdout)
    assert [c["stage"] for c in episode["claims"] if c["status"] == "done"][-3:] == ["probe", "train", "eval"]
    assert episode["inner_job"]["launch_count"] == 1 and episode["evaluation"]["simulated"] is True
    assert abs(episode["reward"]["total"] - trained["reward"]) < 1e-3
    assert episode["cost_usd_total"] > 0


def test_a_synchronous_window_trains_every_group_with_the_version_that_sampled_it(tmp_path, service_env, pools, pg_url):
    # in_flight 16 holds four batches of groups of 2: without batches_ahead the window opens groups at version 0 that later steps train on
    config = sim_config(tmp_path, max_outer_steps=4, in_flight=16, batches_ahead=0)
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], service_env, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    run_id = run_id_from(done.stdout)
    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).status == RunStatus.finished
        batched = session.execute(
            select(OuterStep.step, OuterStep.policy_version_before, EpisodeGroup.policy_version)
            .join(EpisodeGroup, EpisodeGroup.outer_step_id == OuterStep.id)
            .where(OuterStep.run_id == run_id)
        ).all()
        assert_exactly_once(session, run_id, tmp_path / "artifacts")
    assert sorted(step for step, _, _ in batched) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert [(step, before) for step, before, version in batched if version != before] == [], "a group was trained on by a later version"
