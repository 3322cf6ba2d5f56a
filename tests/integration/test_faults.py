"""Fault campaign: each fault hits a running simulator run; the run must finish (or pause with a clear
message), lose nothing and bill nothing twice (metarl.store.exactly_once, the simulated cloud's
launch records included).

Faults: Redis restarted mid-run (a private redis-server without persistence: every queued message is
lost), PostgreSQL restarted mid-run (a private cluster, stopped like a crash with `pg_ctl -m
immediate`), a worker killed with -9 in each of the five pools, a full disk in the artifact folder (a
small tmpfs mounted over it, needs root; skipped otherwise), slow backends (stages longer than the
claim lease) and a hung backend (an eval that never returns, past the run's `deadlines.eval_s`; a train
poll that never returns, past `deadlines.train_s`, whose job must then stop holding a slot of the backend).
The shared Redis and PostgreSQL on the default ports are never restarted: the restart drills use
private servers on free ports (metarl.testing.services).

Worker pools here are real Celery workers started from this module (`python -m
tests.integration.test_faults POOL FAULT [TIME_LIMIT_S]`) so that a fault can be injected into a
stage: `slow-probe:S` sleeps S seconds in every probe, `hang-eval:DIR` blocks forever in the eval of
the first episode that reaches eval (and of that episode on every retry; DIR holds the marker), and
`hang-train-poll:DIR` the same in the polls of the first inner job polled.

Run: `python -m pytest tests/integration/test_faults.py` (marked slow, so `METARL_SKIP_SLOW=1` skips
it; about 4 minutes on 2 cores, 9 when they are busy with other work).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from metarl.pools import WorkerPools, stop_process_group
from metarl.settings import BROKER_ENV, DATABASE_ENV
from metarl.store import db
from metarl.store.db import session_scope
from metarl.store.exactly_once import assert_exactly_once
from metarl.store.records import (
    ClaimStatus,
    Episode,
    InnerJob,
    InnerJobStatus,
    OuterStatus,
    OuterStep,
    Run,
    RunStatus,
    Stage,
    StageClaim,
)
from metarl.testing.drill import REPO, read_run_id, service_env, sim_run_config, start_orchestrator, wait_until
from metarl.testing.services import PrivatePostgres, PrivateRedis, ServiceUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FINISH_TIMEOUT_S = 300


# -- fault-injecting worker pools ------------------------------------------------------------------


def install_fault(fault: str) -> None:
    """Patch a stage of this worker process with `fault` (before the pool forks its children)."""
    if fault == "none":
        return
    kind, _, value = fault.partition(":")
    if kind == "slow-probe":
        import workers.stages

        real_probe = workers.stages.probe_job_text

        def slow_probe(*args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(float(value))
            return real_probe(*args, **kwargs)

        workers.stages.probe_job_text = slow_probe
        return
    if kind == "hang-eval":
        from metarl.backends.sim.simulator import SimEval

        hang_first_episode(SimEval, "score_trained", Path(value))
        return
    if kind == "hang-train-poll":
        from metarl.backends.sim.simulator import SimTrain

        hang_first_episode(SimTrain, "poll", Path(value))
        return
    raise ValueError(f"unknown fault {fault!r}")


def hang_first_episode(backend: type, method: str, marker_dir: Path) -> None:
    """Patch `backend.method(self, ctx, ...)` so that the first episode to call it hangs in that call and in every retry of it
    (one pool process), leaving a marker `hung-<episode id>` in `marker_dir`; other episodes go through."""
    real = getattr(backend, method)

    def hanging(self, ctx, *args, **kwargs):  # type: ignore[no-untyped-def]
        marker_dir.mkdir(parents=True, exist_ok=True)
        marker = marker_dir / f"hung-{ctx.episode_id}"
        if not any(marker_dir.iterdir()):
            marker.touch()
        while marker.exists():
            time.sleep(3600)
        return real(self, ctx, *args, **kwargs)

    setattr(backend, method, hanging)


class FaultPools(WorkerPools):
    """The five pools, each started from this module with its fault, supervised like WorkerPools."""

    def __init__(self, env: dict[str, str], log_dir: Path, faults: dict[str, str] | None = None):
        super().__init__(env[DATABASE_ENV], env[BROKER_ENV], log_dir)
        self.faults = faults or {}

    def command(self, pool: str) -> list[str]:
        """`python -m tests.integration.test_faults POOL FAULT`."""
        return [sys.executable, "-m", "tests.integration.test_faults", pool, self.faults.get(pool, "none")]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Orchestrators a test starts; any still alive at the end is killed with its group."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            stop_process_group(process, timeout_s=5)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A redis-server of this test only (free port, no persistence), removed afterwards."""
    try:
        server = PrivateRedis()
    except ServiceUnavailable as err:
        pytest.skip(str(err))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_pg() -> Iterator[tuple[PrivatePostgres, str]]:
    """A PostgreSQL cluster of this test only (free port, trust auth) and a migrated database on it; removed afterwards."""
    try:
        server = PrivatePostgres()
    except ServiceUnavailable as err:
        pytest.skip(str(err))
    try:
        server.start()
        url = server.create_database("faults")
        db.upgrade(url)
        yield server, url
    finally:
        db.dispose_engines()
        server.destroy()


# -- helpers ---------------------------------------------------------------------------------------


def finish(orchestrator: subprocess.Popen[str], timeout_s: float = FINISH_TIMEOUT_S) -> str:
    """Wait for `metarl run` to exit 0 and return its output."""
    try:
        output, _ = orchestrator.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_group(orchestrator, timeout_s=5)
        output, _ = orchestrator.communicate()
        raise AssertionError(f"the run did not finish within {timeout_s}s; orchestrator output:\n{output[-4000:]}") from None
    assert orchestrator.returncode == 0, f"the orchestrator exited {orchestrator.returncode}:\n{output[-4000:]}"
    return output


def run_under_faults(
    config: Path,
    env: dict[str, str],
    log_dir: Path,
    started: list,
    faults: dict[str, str] | None = None,
    mid_run: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """Start the pools (with their faults) and `metarl run CONFIG`, call `mid_run(run_id)`, wait for the run to finish,
    stop the pools; return the run id and the orchestrator's output."""
    pools = FaultPools(env, log_dir, faults=faults)
    pools.start()
    try:
        orchestrator = start_orchestrator(["run", str(config)], env)
        started.append(orchestrator)
        run_id = read_run_id(orchestrator)
        if mid_run is not None:
            mid_run(run_id)
        output = finish(orchestrator)
    finally:
        pools.stop()
    return run_id, output


def scalar(url: str, statement) -> int:  # type: ignore[no-untyped-def]
    """One integer from the database."""
    with session_scope(url) as session:
        return int(session.execute(statement).scalar_one() or 0)


def closed_claims(url: str, run_id: str) -> int:
    """Stage transitions so far."""
    return scalar(
        url, select(func.count()).select_from(StageClaim).where(StageClaim.run_id == run_id, StageClaim.status.in_((ClaimStatus.done, ClaimStatus.failed)))
    )


def running_claim(url: str, run_id: str, stage: Stage) -> bool:
    """A stage of `stage` is being worked on right now."""
    return (
        scalar(
            url,
            select(func.count())
            .select_from(StageClaim)
            .where(StageClaim.run_id == run_id, StageClaim.stage == stage, StageClaim.status == ClaimStatus.running),
        )
        > 0
    )


def check_finished_exactly_once(url: str, run_id: str, artifacts: Path) -> Run:
    """The run finished and its records pass every exactly-once check; returns the run row."""
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        assert run.status == RunStatus.finished, f"run ended {run.status.value}: {run.status_message}"
        assert_exactly_once(session, run_id, artifacts)
    return run


def takeovers(url: str, run_id: str, stage: Stage | None = None) -> int:
    """Stage claims taken over from workers that stopped heartbeating."""
    statement = select(func.coalesce(func.sum(StageClaim.takeovers), 0)).where(StageClaim.run_id == run_id)
    if stage is not None:
        statement = statement.where(StageClaim.stage == stage)
    return scalar(url, statement)


def drill_config(tmp_path: Path, name: str, **overrides: float | int | str) -> tuple[Path, Path]:
    """A fast simulator run (3 outer steps, short leases) and its artifact folder."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(exist_ok=True)
    settings: dict = dict(
        max_outer_steps=3, agent_s=0.2, train_s=1.0, eval_s=0.2, outer_s=0.2, lease_s=2.0, redispatch_after_s=2.0, in_flight=8, group_size=2, groups_per_batch=2
    )
    settings.update(overrides)
    return sim_run_config(tmp_path / f"{name}.toml", artifacts_root=artifacts, name=name, **settings), artifacts


# -- the faults ------------------------------------------------------------------------------------


def test_redis_restarted_mid_run(tmp_path: Path, pg_url: str, private_redis: PrivateRedis, started: list) -> None:
    """Redis dies with every queued message and comes back: the orchestrator pauses its sends (logged), `metarl status`
    still answers, the reconciler re-sends what was lost from the records, and a worker that Celery lets die of the outage
    (kombu cannot restore its unacknowledged countdown messages over the dead connection) is restarted by its supervisor."""
    config, artifacts = drill_config(tmp_path, "redis-restart")
    env = service_env(pg_url, private_redis.url(), METARL_HOME=str(tmp_path / "metarl-home"))

    def restart_redis(run_id: str) -> None:
        wait_until(
            lambda: closed_claims(pg_url, run_id) >= 8 and running_claim(pg_url, run_id, Stage.train), 120, "a run in progress with an inner job running"
        )
        private_redis.kill()
        down = subprocess.run(
            [sys.executable, "-m", "metarl_cli.main", "status", run_id, "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert down.returncode == 0, f"status failed while the broker was down:\n{down.stderr[-2000:]}"
        assert set(json.loads(down.stdout)["queue_depths"].values()) == {None}
        time.sleep(3)
        private_redis.start()

    run_id, _ = run_under_faults(config, env, tmp_path / "logs", started, mid_run=restart_redis)
    check_finished_exactly_once(pg_url, run_id, artifacts)


def test_postgres_restarted_mid_run(tmp_path: Path, redis_url: str, private_pg: tuple[PrivatePostgres, str], started: list) -> None:
    """PostgreSQL stops like a crash for a few seconds: workers and the orchestrator ride it out; the run finishes exactly once."""
    server, url = private_pg
    config, artifacts = drill_config(tmp_path, "pg-restart")

    def restart_postgres(run_id: str) -> None:
        wait_until(lambda: closed_claims(url, run_id) >= 8 and running_claim(url, run_id, Stage.train), 120, "a run in progress with an inner job running")
        db.dispose_engines()
        server.restart(down_s=3.0, mode="immediate")

    run_id, output = run_under_faults(
        config, service_env(url, redis_url, METARL_HOME=str(tmp_path / "metarl-home")), tmp_path / "logs", started, mid_run=restart_postgres
    )
    check_finished_exactly_once(url, run_id, artifacts)
    assert f"run {run_id} paused: the database is unreachable" in output, output[-3000:]
    assert f"run {run_id} continues: the database is reachable again" in output, output[-3000:]


def test_a_worker_killed_in_each_pool(tmp_path: Path, pg_url: str, redis_url: str, started: list) -> None:
    """kill -9 of the agent, probe, train, eval and outer pools, each while it works on a stage, then restarted."""
    config, artifacts = drill_config(tmp_path, "kill-each-pool", max_outer_steps=3, agent_s=0.8, eval_s=0.8, outer_s=1.5, train_s=1.5)
    env = service_env(pg_url, redis_url, METARL_HOME=str(tmp_path / "metarl-home"))
    pools = FaultPools(env, tmp_path / "logs", faults={"probe": "slow-probe:0.8"})
    pools.start()
    try:
        orchestrator = start_orchestrator(["run", str(config)], env)
        started.append(orchestrator)
        run_id = read_run_id(orchestrator)
        for pool, stage in (("agent", Stage.agent), ("probe", Stage.probe), ("train", Stage.train), ("eval", Stage.eval)):
            wait_until(lambda stage=stage: running_claim(pg_url, run_id, stage), 120, f"a running {stage.value} stage", 0.05)
            pools.kill_pool(pool)
            pools.start_pool(pool)
        running_outer = select(func.count()).select_from(OuterStep).where(OuterStep.run_id == run_id, OuterStep.status == OuterStatus.running)
        wait_until(lambda: scalar(pg_url, running_outer) > 0, 180, "a running outer update", 0.05)
        pools.kill_pool("outer")
        pools.start_pool("outer")
        finish(orchestrator)
    finally:
        pools.stop()
    check_finished_exactly_once(pg_url, run_id, artifacts)
    assert takeovers(pg_url, run_id) >= 2, "no stage was taken over although workers were killed mid-stage"
    assert scalar(pg_url, select(func.sum(OuterStep.takeovers)).where(OuterStep.run_id == run_id)) >= 1, "the killed outer update was not taken over"


def test_a_pool_that_exits_on_its_own_is_restarted(tmp_path: Path, pg_url: str, redis_url: str) -> None:
    """The supervisor of WorkerPools restarts a worker that died by itself (not one killed through it)."""
    pools = WorkerPools(pg_url, redis_url, tmp_path / "logs", pools=("probe",), supervise_interval_s=0.2)
    pools.start()
    try:
        first = pools.processes["probe"]
        os.kill(first.pid, 9)  # the worker's main process dies, as with kombu's "Unrecoverable error"
        wait_until(lambda: pools.processes["probe"] is not first and pools.processes["probe"].poll() is None, 30, "the probe pool restarted")
        assert pools.restarts == {"probe": 1}
        pools.kill_pool("probe")
        time.sleep(1.0)
        assert "probe" not in pools.processes and pools.restarts == {"probe": 1}
    finally:
        pools.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted at tmp_path/artifacts (root only; skipped where mounting is not allowed), with an empty filler file."""
    mountpoint = tmp_path / "artifacts"
    mountpoint.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0777", "tmpfs", str(mountpoint)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the full-disk drill: {mounted.stderr.strip()}")
    try:
        (mountpoint / "filler.bin").touch()
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


def fill_disk(folder: Path) -> Path:
    """Write a file until the filesystem is full; return it (delete it to free the space)."""
    filler = folder / "filler.bin"
    with open(filler, "ab", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
    return filler


def test_full_disk_in_the_artifact_folder(tmp_path: Path, pg_url: str, redis_url: str, small_disk: Path, started: list) -> None:
    """The artifact folder fills up mid-run: the stages that write there pause with the reason shown in `metarl status`
    (no episode fails, nothing is launched or billed twice); once space is freed the run finishes, and the simulated
    cloud's launch records match the inner jobs one for one."""
    config = sim_run_config(
        tmp_path / "disk.toml",
        artifacts_root=small_disk,
        name="full-disk",
        max_outer_steps=3,
        agent_s=0.2,
        train_s=0.5,
        eval_s=0.1,
        outer_s=0.1,
        lease_s=2.0,
        redispatch_after_s=2.0,
        in_flight=8,
        group_size=2,
        groups_per_batch=2,
        max_stage_attempts=3,
    )
    env = service_env(pg_url, redis_url, METARL_HOME=str(tmp_path / "metarl-home"))
    pools = FaultPools(env, tmp_path / "logs")
    pools.start()
    try:
        orchestrator = start_orchestrator(["run", str(config)], env)
        started.append(orchestrator)
        run_id = read_run_id(orchestrator)
        launched = select(func.count()).select_from(InnerJob).where(InnerJob.run_id == run_id, InnerJob.launch_count > 0)
        wait_until(lambda: scalar(pg_url, launched) >= 2, 120, "two inner jobs launched")
        filler = fill_disk(small_disk)
        waiting = select(func.count()).select_from(Episode).where(Episode.run_id == run_id, Episode.error.like("waiting for storage space%"))
        wait_until(lambda: scalar(pg_url, waiting) >= 2, 120, "launches waiting for storage space")
        time.sleep(4)  # paused for a while: two leases, several tries
        shown = subprocess.run(
            [sys.executable, "-m", "metarl_cli.main", "status", run_id, "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        reasons = [failure["error"] for failure in json.loads(shown.stdout)["failures"]]
        assert any("No space left on device" in reason for reason in reasons), reasons
        failed = select(func.count()).select_from(Episode).where(Episode.run_id == run_id, Episode.stage == Stage.failed)
        assert scalar(pg_url, failed) == 0, "an episode failed because the disk was full"
        filler.unlink()
        finish(orchestrator)
    finally:
        pools.stop()
    check_finished_exactly_once(pg_url, run_id, small_disk)
    with session_scope(pg_url) as session:
        left = session.execute(select(Episode.error).where(Episode.run_id == run_id, Episode.error.like("%storage%"))).scalars().all()
    assert left == [], left
    assert not list(small_disk.glob("sim-cloud/*.tmp")) and not list(small_disk.glob("sim-cloud/.*"))


def test_slow_backends_are_not_taken_over(tmp_path: Path, pg_url: str, redis_url: str, started: list) -> None:
    """Stages that take longer than the claim lease keep their claim by heartbeat: no takeover, no duplicate work."""
    config, artifacts = drill_config(
        tmp_path, "slow", max_outer_steps=2, agent_s=2.5, eval_s=2.5, train_s=3.0, outer_s=2.5, lease_s=1.5, redispatch_after_s=1.5, in_flight=4
    )
    run_id, _ = run_under_faults(config, service_env(pg_url, redis_url, METARL_HOME=str(tmp_path / "metarl-home")), tmp_path / "logs", started)
    check_finished_exactly_once(pg_url, run_id, artifacts)
    assert takeovers(pg_url, run_id) == 0
    assert scalar(pg_url, select(func.sum(OuterStep.takeovers)).where(OuterStep.run_id == run_id)) == 0


def test_hung_backend_fails_its_episode_with_a_clear_message(tmp_path: Path, pg_url: str, redis_url: str, started: list) -> None:
    """An eval that never returns, under the run's `deadlines.eval_s` (sent with each eval message as its Celery hard time limit):
    the pool process is killed at the limit, the stage is retried up to `retries.max_stage_attempts`, then its episode fails saying
    why; every other episode and the run finish."""
    config, artifacts = drill_config(tmp_path, "hung", max_outer_steps=2, max_stage_attempts=2, eval_deadline_s=3.0)
    markers = tmp_path / "hung"
    run_id, _ = run_under_faults(
        config, service_env(pg_url, redis_url, METARL_HOME=str(tmp_path / "metarl-home")), tmp_path / "logs", started, faults={"eval": f"hang-eval:{markers}"}
    )
    check_finished_exactly_once(pg_url, run_id, artifacts)
    hung = [int(path.name.split("-", 1)[1]) for path in markers.iterdir()]
    assert len(hung) == 1
    with session_scope(pg_url) as session:
        episode = session.get(Episode, hung[0])
        assert episode.stage == Stage.failed
        assert "eval" in episode.error and "TimeLimitExceeded" in episode.error, episode.error
        job = session.execute(select(InnerJob).where(InnerJob.episode_id == hung[0])).scalar_one()
        assert job.status == InnerJobStatus.succeeded and job.launch_count == 1


def test_hung_train_poll_fails_its_episode_and_frees_its_slot(tmp_path: Path, pg_url: str, redis_url: str, started: list) -> None:
    """A train poll that never returns, under `deadlines.train_s`: after `retries.max_stage_attempts` takeovers its episode
    fails saying why, and its unfinished inner job is marked lost in the same statement, so it no longer counts against the
    backend's capacity (counted across runs: a job left `running` would hold its slot for good)."""
    config, artifacts = drill_config(tmp_path, "hung-train", max_outer_steps=2, max_stage_attempts=2, train_deadline_s=3.0, max_concurrent_jobs=2)
    markers = tmp_path / "hung"
    run_id, _ = run_under_faults(
        config,
        service_env(pg_url, redis_url, METARL_HOME=str(tmp_path / "metarl-home")),
        tmp_path / "logs",
        started,
        faults={"train": f"hang-train-poll:{markers}"},
    )
    check_finished_exactly_once(pg_url, run_id, artifacts)
    hung = [int(path.name.split("-", 1)[1]) for path in markers.iterdir()]
    assert len(hung) == 1
    with session_scope(pg_url) as session:
        episode = session.get(Episode, hung[0])
        assert episode.stage == Stage.failed
        assert "train" in episode.error and "TimeLimitExceeded" in episode.error, episode.error
        job = session.execute(select(InnerJob).where(InnerJob.episode_id == hung[0])).scalar_one()
        assert job.status == InnerJobStatus.lost and job.finished_at is not None and job.launch_count == 1
        assert job.error.startswith("abandoned: stage train was abandoned"), job.error
        holding = (
            select(func.count()).select_from(InnerJob).where(InnerJob.run_id == run_id, InnerJob.status.in_((InnerJobStatus.launching, InnerJobStatus.running)))
        )
        assert session.execute(holding).scalar_one() == 0


if __name__ == "__main__":
    install_fault(sys.argv[2])
    from workers.app import app

    pool = sys.argv[1]
    app.worker_main(["worker", "-Q", pool, "-n", f"{pool}@%h", "-l", "info", "-c", "1", "-E", "--without-mingle"])
