"""The outer update under crashes: heartbeated claims, `kill -9` mid-update then resume, and the crash-loop cap.

The outer worker here is a real Celery worker process started from this module
(`python -m tests.integration.test_outer_crash MODE CONCURRENCY`) with a fault injected into the
outer backends' `update`: `slow:S` sleeps S seconds after the new version's state is saved (so a
kill lands between "saved" and "published"), `exit` kills the pool process inside every update.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from metarl import composition as registry
from metarl.backends.local.agent import saved_states
from metarl.pools import WorkerPools, signal_group
from metarl.runconfig import load_run
from metarl.store.claims import utcnow
from metarl.store.db import session_scope
from metarl.store.episodes import run_config_of
from metarl.store.reconcile import orphaned_outer_steps
from metarl.store.records import (
    Episode,
    EpisodeGroup,
    GroupStatus,
    OuterStatus,
    OuterStep,
    PolicyVersion,
    Reward,
    Run,
    RunStatus,
    Stage,
)
from orchestrator.loop import create_run
from schemas.run_config import ArtifactsConfig
from tests.conftest import REPO, metarl_cli
from tests.integration.helpers import assert_exactly_once, sim_config

pytestmark = pytest.mark.integration

STAGE_POOLS = ("agent", "probe", "train", "eval")
LOCAL_POLICY = """
[backends.agent]
type = "local"

[backends.outer]
type = "local"
"""


# -- the fault-injecting outer worker --------------------------------------------------------------


def install_fault(mode: str) -> None:
    """Wrap the outer backends' `update` with the fault `mode` (runs in the worker process before it forks)."""
    from metarl.backends.local.agent import LocalOuter
    from metarl.backends.sim.simulator import SimOuter

    for backend in (LocalOuter, SimOuter):
        real = backend.update

        def faulty(self, *args, _real=real, **kwargs):  # type: ignore[no-untyped-def]
            if mode == "exit":
                os._exit(17)
            result = _real(self, *args, **kwargs)
            time.sleep(float(mode.split(":", 1)[1]))
            return result

        backend.update = faulty  # type: ignore[method-assign]


def start_outer_worker(env: dict[str, str], log_dir: Path, mode: str, concurrency: int) -> subprocess.Popen[bytes]:
    """A real outer pool (its own process group) whose update carries the injected fault."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "worker-outer.log", "ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.test_outer_crash", mode, str(concurrency)],
            env=env,
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen) -> None:
    """kill -9 a process group we started, and reap its leader."""
    signal_group(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def stage_pools(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[WorkerPools]:
    """Real agent/probe/train/eval pools; the outer pool is started by each test with its fault."""
    pools = WorkerPools(pg_url, redis_url, tmp_path / "logs", pools=STAGE_POOLS)
    pools.start()
    yield pools
    pools.stop()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts itself; every one still alive at the end is killed with its group."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            kill_group(process)


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    """Poll `predicate` until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def start_orchestrator(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """`metarl run|resume ... --no-workers` in its own process group (so it can be killed with -9)."""
    return subprocess.Popen(
        [sys.executable, "-m", "metarl_cli.main", *args, "--no-workers", "--quiet"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def sha256(path: str | Path) -> str:
    """Content hash of a saved policy state."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- heartbeat, in process -------------------------------------------------------------------------


def test_heartbeat_keeps_a_long_update_claimed_and_a_dead_one_is_taken_over(tmp_path, pg_url, monkeypatch):
    from metarl.store.claims import renew_outer_claim
    from workers.outer import claim_outer_step, keep_alive

    monkeypatch.setenv("METARL_DATABASE_URL", pg_url)
    config, specs = load_run(sim_config(tmp_path, name="beat", lease_s=1.0, redispatch_after_s=1.0))
    run_id = create_run(pg_url, config, specs)
    with session_scope(pg_url) as session:
        step = OuterStep(
            run_id=run_id, step=1, status=OuterStatus.pending, policy_version_before=0, n_groups=0, n_episodes=0, dispatched_at=utcnow(), metrics={}
        )
        session.add(step)
        session.flush()
        step_id = step.id

    def orphaned() -> list[int]:
        with session_scope(pg_url) as session:
            return orphaned_outer_steps(session, run_id, utcnow(), 1.0, 1.0, startup=False)

    claim = claim_outer_step(step_id, lease_s=1.0)
    assert claim is not None and claim.takeovers == 0
    with keep_alive(claim, lease_s=1.0) as beat:
        deadline = time.monotonic() + 3.5  # 3.5 leases of "work"
        while time.monotonic() < deadline:
            assert orphaned() == [], "the reconciler would re-send a step whose worker is alive and heartbeating"
            assert claim_outer_step(step_id, lease_s=1.0) is None, "a second worker took a live claim"
            time.sleep(0.2)
    assert not beat.lost.is_set() and beat.beats >= 5
    time.sleep(1.3)  # the worker "died": no more beats
    assert orphaned() == [step_id]
    second = claim_outer_step(step_id, lease_s=1.0)
    assert second is not None and second.takeovers == 1
    with session_scope(pg_url) as session:
        assert not renew_outer_claim(session, claim), "the first worker still renews a claim that was taken over"
        assert renew_outer_claim(session, second)


# -- kill -9 of the orchestrator and the outer worker mid-update, then resume ----------------------


def local_policy_config(tmp_path: Path) -> Path:
    """Local agent and local outer (real policy, real IS-GRPO update), simulated train and eval."""
    config = sim_config(tmp_path, name="outercrash", max_outer_steps=3, lease_s=1.5, redispatch_after_s=2.0, in_flight=8)
    text = config.read_text()
    text = re.sub(r'\[backends.agent\]\ntype = "sim"\nduration = .*\n', "", text)
    text = re.sub(r'\[backends.outer\]\ntype = "sim"\nduration = .*\n', "", text)
    text = text.replace("groups_per_batch = 2\n", "groups_per_batch = 2\nmax_steps_off_policy = 0\n")
    config.write_text(text + LOCAL_POLICY)
    return config


def test_kill_orchestrator_and_outer_worker_mid_update_then_resume(tmp_path, service_env, stage_pools, started, pg_url, one_torch_thread):
    from metarl.policy.local_policy import LocalPolicy
    from metarl.store.outer_steps import load_outer_work

    config_path = local_policy_config(tmp_path)
    artifacts = tmp_path / "artifacts"
    started.append(start_outer_worker(stage_pools.env, tmp_path / "logs", "slow:4", concurrency=2))
    orchestrator = start_orchestrator(["run", str(config_path)], service_env)
    started.append(orchestrator)
    run_id = re.search(r"run ([0-9a-f\-]{36})", orchestrator.stdout.readline()).group(1)

    # Step 2 has computed and saved version 2 but not published it: kill -9 both right there.
    def step_two_saved_not_published() -> bool:
        with session_scope(pg_url) as session:
            run = session.get(Run, run_id)
            assert run.status == RunStatus.running, f"the run ended before the kill: {run.status.value}: {run.status_message}"
            status = session.execute(select(OuterStep.status).where(OuterStep.run_id == run_id, OuterStep.step == 2)).scalar_one_or_none()
        return status == OuterStatus.running and bool(saved_states(str(artifacts), run_id, 2))

    wait_until(step_two_saved_not_published, 150, "outer step 2 to save version 2")
    for process in started:
        kill_group(process)
    started.clear()
    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).policy_version == 1
        published = {v.version: sha256(v.state_uri) for v in session.execute(select(PolicyVersion).where(PolicyVersion.run_id == run_id)).scalars()}
        killed = session.execute(select(OuterStep).where(OuterStep.run_id == run_id, OuterStep.step == 2)).scalar_one()
        assert killed.status == OuterStatus.running and killed.takeovers == 0
    assert sorted(published) == [0, 1], "version 2 was published although its step never finished"
    (killed_attempt_state,) = saved_states(str(artifacts), run_id, 2)
    killed_attempt_digest = sha256(str(killed_attempt_state))

    started.append(start_outer_worker(stage_pools.env, tmp_path / "logs", "slow:4", concurrency=2))
    resumed = metarl_cli(["resume", run_id, "--no-workers", "--quiet"], service_env, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run.status == RunStatus.finished, run.status_message
        assert_exactly_once(session, run_id, artifacts)
        config = run_config_of(run)

        # The policy continued from the last saved version: one chain 0 -> 1 -> 2 -> 3, old files untouched.
        steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
        assert [(s.step, s.status, s.policy_version_before, s.policy_version_after) for s in steps] == [(k, OuterStatus.done, k - 1, k) for k in (1, 2, 3)]
        assert [s.takeovers for s in steps] == [0, 1, 0], "only the killed step may be taken over; the heartbeat keeps the others"
        versions = session.execute(select(PolicyVersion).where(PolicyVersion.run_id == run_id).order_by(PolicyVersion.version)).scalars().all()
        assert [(v.version, v.outer_step_id) for v in versions] == [(0, None)] + [(s.step, s.id) for s in steps]
        assert {v: sha256(versions[v].state_uri) for v in published} == published, "a published version's state changed"
        # the taken-over attempt saved to its own file: the version published by the next attempt is another file
        assert versions[2].state_uri != str(killed_attempt_state) and sha256(str(killed_attempt_state)) == killed_attempt_digest

        # No episode lost or counted twice: every batched group belongs to one done step, every
        # rewarded episode of it is in exactly that step's batch, every other group was dropped and counted.
        works = {s.id: load_outer_work(session, s.id) for s in steps}
        batched_ids = [episode.episode_id for work in works.values() for episode in work.batch]
        assert len(batched_ids) == len(set(batched_ids)), "an episode is in two outer batches"
        groups = session.execute(select(EpisodeGroup).where(EpisodeGroup.run_id == run_id, EpisodeGroup.held_out.is_(False))).scalars().all()
        assert {g.status for g in groups} <= {GroupStatus.batched, GroupStatus.dropped}, [(g.id, g.status) for g in groups]
        for s in steps:
            members = session.execute(select(Episode).join(EpisodeGroup).where(EpisodeGroup.outer_step_id == s.id)).scalars().all()
            assert len({m.group_id for m in members}) == s.n_groups == config.outer.groups_per_batch
            assert len(members) == s.n_episodes
            assert all(m.stage == Stage.done for m in members), "an episode of a batched group was lost"
            assert sorted(e.episode_id for e in works[s.id].batch) == sorted(m.id for m in members)
            samples = sum(len(e.samples) for e in works[s.id].batch)
            assert s.metrics["backend_datums"] == samples, "the published update did not use exactly its batch"
        dropped = sum(1 for g in groups if g.status == GroupStatus.dropped)
        assert sum(s.dropped_stale_groups for s in steps) == dropped, "a stale group was dropped without being counted"
        rewarded = session.execute(
            select(func.count())
            .select_from(Reward)
            .join(Episode)
            .join(EpisodeGroup)
            .where(EpisodeGroup.run_id == run_id, EpisodeGroup.status == GroupStatus.batched)
        ).scalar_one()
        assert rewarded == len(batched_ids)

    # Version 2 is exactly one update of version 1 on step 2's batch (not of version 0, not applied twice).
    recheck = config.model_copy(update={"artifacts": ArtifactsConfig(root=str(tmp_path / "recheck"))})
    work = works[steps[1].id]
    assert work.base_state_uri == versions[1].state_uri
    again = registry.outer_backend(recheck).update(run_id, 2, 2, work.batch, recheck, work.base_state_uri)
    expected, actual = LocalPolicy.from_state(again.state_uri).net.state_dict(), LocalPolicy.from_state(versions[2].state_uri).net.state_dict()
    assert all(torch_equal(expected[key], actual[key]) for key in expected), "version 2 is not the update of version 1 on its batch"
    before = LocalPolicy.from_state(versions[1].state_uri).net.state_dict()
    assert not all(torch_equal(before[key], actual[key]) for key in before) or steps[1].metrics["backend_skipped"] == 1.0


def torch_equal(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Bit-for-bit equality of two tensors."""
    import torch

    return bool(torch.equal(a, b))


# -- the crash-loop cap ----------------------------------------------------------------------------


def test_outer_step_that_keeps_killing_its_worker_fails_the_run_and_a_retry_finishes_it(tmp_path, service_env, stage_pools, started, pg_url):
    config = sim_config(tmp_path, name="outerloop", max_outer_steps=2, lease_s=1.0, redispatch_after_s=1.0, failure_rate=0.0, extra="max_stage_attempts = 1\n")
    outer = start_outer_worker(stage_pools.env, tmp_path / "logs", "exit", concurrency=1)
    started.append(outer)
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], service_env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    run_id = re.search(r"run ([0-9a-f\-]{36})", done.stdout).group(1)
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        step = session.execute(select(OuterStep).where(OuterStep.run_id == run_id)).scalar_one()
        assert step.status == OuterStatus.failed
        assert step.takeovers == 2, "the step was not re-sent after each crash, or was re-sent past the cap"
        assert "outer step 1 was abandoned 2 times" in step.error and "max_stage_attempts = 1" in step.error
        assert "last error: WorkerLostError" in step.error, step.error  # noted by the worker's main process
        assert run.status == RunStatus.failed
        assert run.status_message.startswith("outer step 1 failed: outer step 1 was abandoned 2 times")
        assert run.policy_version == 0
        assert session.execute(select(func.count()).select_from(PolicyVersion).where(PolicyVersion.run_id == run_id)).scalar_one() == 1
        # nothing re-sends it any more: a failed step is no orphan
        assert orphaned_outer_steps(session, run_id, utcnow(), 1.0, 1.0, startup=True) == []
    assert outer.poll() is None, "the outer worker's main process died with its pool process"

    # the cause fixed (a worker whose update works), the failed run is retried from where it failed
    kill_group(outer)
    started.append(start_outer_worker(stage_pools.env, tmp_path / "logs", "delay:0", concurrency=1))
    refused = metarl_cli(["resume", run_id, "--no-workers", "--quiet"], service_env, timeout=60)
    assert refused.returncode == 1 and f"metarl resume {run_id} --retry-failed" in refused.stderr, refused.stderr
    retried = metarl_cli(["resume", run_id, "--retry-failed", "--no-workers", "--quiet"], service_env, timeout=120)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "retrying outer step 1 from policy version 0 (it failed with: outer step 1 was abandoned 2 times" in retried.stdout
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
        assert run.status == RunStatus.finished and run.policy_version == 2, run.status_message
        assert [(s.step, s.status, s.takeovers) for s in steps] == [(1, OuterStatus.done, 0), (2, OuterStatus.done, 0)]
    again = metarl_cli(["resume", run_id, "--retry-failed", "--no-workers", "--quiet"], service_env, timeout=60)
    assert again.returncode == 1 and "is finished, not failed" in again.stderr, again.stderr


if __name__ == "__main__":
    install_fault(sys.argv[1])
    from workers.app import app

    app.worker_main(["worker", "-Q", "outer", "-n", "outer-fault@%h", "-l", "info", "-c", sys.argv[2]])
