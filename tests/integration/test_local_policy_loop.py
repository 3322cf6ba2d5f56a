"""The local trainer-agent policy and its importance-sampling outer update, wired into the pools."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from metarl.policy.local_policy import LocalPolicy
from metarl.store.db import session_scope
from metarl.store.records import OuterStep, PolicyVersion, ProbeAttempt, Run, RunStatus
from tests.conftest import metarl_cli
from tests.integration.helpers import assert_exactly_once, sim_config

pytestmark = pytest.mark.integration

LOCAL_POLICY = """
[backends.agent]
type = "local"

[backends.outer]
type = "local"
"""


def run_local_policy(config: Path, text: str, service_env: dict[str, str]) -> str:
    """Run a simulator config with the local policy and its update in place of the simulated ones; the run id."""
    text = re.sub(r'\[backends.agent\]\ntype = "sim"\nduration = .*\n', "", text)
    text = re.sub(r'\[backends.outer\]\ntype = "sim"\nduration = .*\n', "", text)
    config.write_text(text + LOCAL_POLICY)
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], service_env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"run ([0-9a-f\-]{36})", done.stdout).group(1)


def test_local_policy_samples_jobs_and_outer_steps_change_its_weights(tmp_path, service_env, pools, pg_url):
    config = sim_config(tmp_path, name="policy", max_outer_steps=3)
    run_id = run_local_policy(config, config.read_text(), service_env)
    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).status == RunStatus.finished
        assert_exactly_once(session, run_id, tmp_path / "artifacts")
        attempts = session.execute(select(ProbeAttempt)).scalars().all()
        assert attempts and all(
            a.agent_backend == "local" and a.policy_tokens and len(a.behaviour_logprobs) == len(a.policy_tokens) - a.prompt_length for a in attempts
        )
        assert all(Path(a.workspace_uri, "job.toml").read_text() == a.job_toml for a in attempts)
        versions = session.execute(select(PolicyVersion).where(PolicyVersion.run_id == run_id).order_by(PolicyVersion.version)).scalars().all()
        assert [v.version for v in versions] == [0, 1, 2, 3]
        assert all(Path(v.state_uri).exists() for v in versions)
        steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id)).scalars().all()
        assert all("backend_ratio_mean" in s.metrics for s in steps)
    first, last = LocalPolicy.from_state(versions[0].state_uri), LocalPolicy.from_state(versions[-1].state_uri)
    changed = any(not torch.equal(a, b) for a, b in zip(first.net.state_dict().values(), last.net.state_dict().values()))
    assert changed, "three outer steps left the policy weights unchanged"


def test_the_start_set_is_the_same_in_every_run_recorded_before_step_1_and_never_trained_on(tmp_path, service_env, pools, pg_url):
    from metarl.store.records import Episode, EpisodeGroup

    jobs: dict[int, dict[tuple[str, int], str]] = {}
    for seed in (7, 8):
        config = sim_config(tmp_path, name=f"start{seed}", max_outer_steps=1, failure_rate=0.0)
        text = config.read_text().replace("seed = 7", f"seed = {seed}")
        text = text.replace("[outer]\n", "[outer]\nstart_set_group_size = 2\n", 1) if "[outer]\n" in text else text + "\n[outer]\nstart_set_group_size = 2\n"
        run_id = run_local_policy(config, text, service_env)
        with session_scope(pg_url) as session:
            assert session.get(Run, run_id).status == RunStatus.finished
            groups = session.execute(select(EpisodeGroup).where(EpisodeGroup.run_id == run_id, EpisodeGroup.start_set.is_(True))).scalars().all()
            assert sorted(group.task_id for group in groups) == ["addition", "reversal"]  # one per training family
            assert all(group.held_out and group.policy_version == 0 and group.outer_step_id is None for group in groups)
            rows = session.execute(
                select(Episode.task_id, Episode.index_in_group, ProbeAttempt.job_toml)
                .join(ProbeAttempt, ProbeAttempt.episode_id == Episode.id)
                .where(Episode.group_id.in_([group.id for group in groups]), ProbeAttempt.attempt == 1)
            ).all()
            jobs[seed] = {(task, index): job for task, index, job in rows}
        status = metarl_cli(["status", run_id, "--json"], service_env, timeout=60)
        assert status.returncode == 0, status.stderr
        start = json.loads(status.stdout)["start_set"]
        assert (start["episodes"], start["rewarded"]) == (4, 4) and start["reward_mean"] is not None
    assert len(jobs[7]) == 4 and jobs[7] == jobs[8]
