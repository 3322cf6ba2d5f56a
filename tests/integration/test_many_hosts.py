"""Pools on several hosts that share only PostgreSQL, Redis and an S3-compatible store (issue 39's drills).

Each "host" is a process group with its own working folder, HOME, METARL_HOME, cache and METARL_HOST_NAME,
started with the real `metarl worker` and `metarl run` commands. Killing a host kills every process whose
environment names it, trainers included, as a host's death would.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from metarl.store.db import session_scope
from metarl.store.records import Episode, InnerJob, Reward, Run, RunStatus, Stage
from tests.conftest import REPO
from tests.integration.helpers import assert_exactly_once, sim_config
from tests.integration.test_local_backends import short_task_specs
from tests.s3_server import s3_env

pytestmark = [pytest.mark.integration]

RUN_TIMEOUT_S = 420


@dataclass
class Host:
    """A simulated host: its own folders and environment; the processes it started."""

    name: str
    folder: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        label = "-".join(re.sub(r"[^a-z]", "", arg) for arg in args[:3] if not arg.startswith("/"))
        log = open(self.folder / f"{label}.log", "ab")
        process = subprocess.Popen([sys.executable, "-m", "metarl_cli.main", *args], cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def run_to_end(self, config: Path) -> subprocess.CompletedProcess[str]:
        """`metarl run CONFIG --no-workers` on this host, to its end."""
        return subprocess.run(
            [sys.executable, "-m", "metarl_cli.main", "run", str(config), "--no-workers", "--quiet"],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )

    def start_pools(self, *pools: str) -> None:
        for pool in pools:
            self.start("worker", "--pool", pool, "--loglevel", "warning")

    def kill(self) -> int:
        """SIGKILL every process of this host (its environment names it), trainers too; how many."""
        killed = 0
        for process in psutil.process_iter(["pid"]):
            try:
                if process.pid != os.getpid() and process.environ().get("METARL_HOST_NAME") == self.name:
                    process.kill()
                    killed += 1
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        return killed

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}" for path in sorted(self.folder.glob("*.log")))


@pytest.fixture
def hosts(tmp_path: Path, service_env: dict[str, str]) -> Iterator[dict[str, Host]]:
    """Three hosts, A, B and C, sharing only the services of `service_env` (and the S3 settings a test adds)."""
    made: dict[str, Host] = {}
    for name in ("hostA", "hostB", "hostC"):
        folder = tmp_path / name
        (folder / "home").mkdir(parents=True)
        env = {
            **service_env,
            "HOME": str(folder / "home"),
            "METARL_HOME": str(folder / ".metarl"),
            "METARL_CACHE_DIR": str(folder / "cache"),
            "METARL_HOST_NAME": name,
        }
        env.pop("METARL_EVAL_SECRET_FILE", None)
        made[name] = Host(name, folder, env)
    yield made
    for host in made.values():
        host.kill()


def local_run_config(folder: Path, name: str, artifacts_root: str | None) -> Path:
    """A short local-backend run (tiny models, 6 s jobs): one outer step over two groups of two."""
    short_task_specs(folder / "specs", ["addition", "reversal"], train_seconds=6.0)
    artifacts = f'[artifacts]\nroot = "{artifacts_root}"\n' if artifacts_root else ""
    path = folder / f"{name}.toml"
    path.write_text(
        f"""
[run]
name = "{name}"
seed = 5
tasks = ["addition", "reversal"]
task_specs_dir = "{folder / "specs"}"
max_outer_steps = 1

[backends.agent]
type = "local"

[backends.train]
type = "local"
max_concurrent_jobs = 2
poll_interval_s = 0.5
model_scale = 0.04
host_silence_s = 5

[backends.eval]
type = "local"
model_scale = 0.04

[backends.outer]
type = "local"

[window]
in_flight = 4
tick_s = 0.3

[outer]
group_size = 2
groups_per_batch = 2
held_out_eval_every = 1000

[retries]
lease_s = 10
redispatch_after_s = 10
max_stage_attempts = 4

{artifacts}"""
    )
    return path


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def with_s3(hosts: dict[str, Host], endpoint: str) -> None:
    for host in hosts.values():
        host.env.update(s3_env(endpoint))


def run_id_of(output: str) -> str:
    match = re.search(r"run ([0-9a-f\-]{36})", output)
    assert match, output
    return match.group(1)


@pytest.mark.slow
def test_two_host_drill_survives_the_train_host_dying(tmp_path: Path, hosts: dict[str, Host], pg_url: str, s3_endpoint: str, s3_bucket: str) -> None:
    with_s3(hosts, s3_endpoint)
    a, b, c = hosts["hostA"], hosts["hostB"], hosts["hostC"]
    config = local_run_config(a.folder, "drill", f"s3://{s3_bucket}/drill")
    a.start_pools("agent", "probe", "outer")
    b.start_pools("train", "eval")
    orchestrator = a.start("run", str(config), "--no-workers", "--quiet")

    def job_running() -> bool:
        with session_scope(pg_url) as session:
            jobs = session.execute(select(InnerJob).where(InnerJob.external_id.is_not(None))).scalars().all()
            return any((job.backend_state or {}).get("host") == "hostB" and job.status.value == "running" for job in jobs)

    try:
        wait_until(job_running, 240, "an inner job running on hostB")
    except AssertionError:
        raise AssertionError(a.logs() + b.logs()) from None
    assert b.kill() >= 2, "hostB had no processes to kill"
    c.start_pools("train", "eval")
    try:
        orchestrator.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("the run did not finish after the train host died\n" + a.logs() + c.logs()) from None
    assert orchestrator.returncode == 0, a.logs() + c.logs()
    with session_scope(pg_url) as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.status == RunStatus.finished, run.status_message
        episodes = session.execute(select(Episode).where(Episode.run_id == run.id, Episode.held_out.is_(False))).scalars().all()
        assert episodes and all(e.stage == Stage.done for e in episodes), [(e.id, e.stage.value, e.error) for e in episodes]
        assert session.execute(select(Reward).where(Reward.run_id == run.id)).scalars().all()
        jobs = session.execute(select(InnerJob).where(InnerJob.run_id == run.id)).scalars().all()
        assert any("hostB" in (job.backend_state or {}).get("relaunched_after", []) for job in jobs), [job.backend_state for job in jobs]
        assert all(str(job.checkpoint_uri).startswith(f"s3://{s3_bucket}/drill/jobs/") for job in jobs if job.checkpoint_uri)
        assert_exactly_once(session, run.id)
    assert not (a.folder / ".metarl" / "artifacts").exists() and not (c.folder / ".metarl" / "artifacts").exists()
    report = subprocess.run(
        [sys.executable, "-m", "metarl_cli.main", "report", run.id[:8]], cwd=c.folder, env=c.env, capture_output=True, text=True, timeout=300
    )
    stored = f"s3://{s3_bucket}/drill/reports/{run.id}/index.html"
    assert report.returncode == 0 and f"stored: {stored}" in report.stdout, report.stdout + report.stderr
    import fsspec

    assert fsspec.open(stored).fs.exists(stored)


def test_a_local_artifact_root_on_two_hosts_stops_at_the_first_cross_host_read(hosts: dict[str, Host], pg_url: str) -> None:
    a, b = hosts["hostA"], hosts["hostB"]
    config = local_run_config(a.folder, "split", None)  # the default root: .metarl/artifacts in each host's own folder
    a.start_pools("agent", "probe", "outer")
    b.start_pools("train", "eval")
    done = a.run_to_end(config)
    assert done.returncode == 1, done.stdout + done.stderr + a.logs() + b.logs()
    assert "does not share it" in done.stderr and "s3://" in done.stderr, done.stderr
    with session_scope(pg_url) as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.status == RunStatus.paused and "hostB" in run.status_message and "hostA" in run.status_message
        episodes = session.execute(select(Episode).where(Episode.run_id == run.id)).scalars().all()
        assert not [e for e in episodes if e.stage == Stage.failed], "a platform fault was charged to the agent"
        assert not session.execute(select(Reward).where(Reward.run_id == run.id)).scalars().all()


def test_hosts_with_different_secrets_stop_the_run_naming_them(hosts: dict[str, Host], pg_url: str, s3_endpoint: str, s3_bucket: str) -> None:
    with_s3(hosts, s3_endpoint)
    a, b = hosts["hostA"], hosts["hostB"]
    a.env["METARL_EVAL_SECRET"] = "secret-of-host-a-0123456789"
    b.env["METARL_EVAL_SECRET"] = "secret-of-host-b-0123456789"
    config = local_run_config(a.folder, "secrets", f"s3://{s3_bucket}/secrets")
    a.start_pools("probe", "outer")
    b.start_pools("agent", "train", "eval")
    done = a.run_to_end(config)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "different hidden-eval secrets" in done.stderr and "hostA" in done.stderr and "hostB" in done.stderr, done.stderr
    with session_scope(pg_url) as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.status == RunStatus.paused
        assert not session.execute(select(Episode).where(Episode.run_id == run.id, Episode.stage == Stage.failed)).scalars().all()


def test_run_config_again_continues_the_run_after_kill_9_and_ctrl_c_shows_interrupted(
    tmp_path: Path, service_env: dict[str, str], pools: object, pg_url: str
) -> None:
    config = sim_config(tmp_path, name="comeback", max_outer_steps=3, train_median_s=1.0, failure_rate=0.0)
    command = [sys.executable, "-m", "metarl_cli.main", "run", str(config), "--no-workers", "--quiet"]
    first = subprocess.Popen(command, cwd=REPO, env=service_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def run_started() -> bool:
        with session_scope(pg_url) as session:
            return session.execute(select(Episode)).first() is not None

    wait_until(run_started, 60, "the first episodes")
    first.kill()  # kill -9: the run stays `running`
    first.wait()
    created = run_id_of(first.stdout.read() if first.stdout else "")
    interrupted = subprocess.Popen(command, cwd=REPO, env=service_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert interrupted.stdout is not None
    first_line = interrupted.stdout.readline()  # printed just before the orchestrator starts
    time.sleep(3)
    interrupted.send_signal(signal.SIGINT)
    out, err = interrupted.communicate(timeout=60)
    out = first_line + out
    assert f"continuing run {created}" in out, out + err
    assert interrupted.returncode == 130, out + err
    status = subprocess.run(
        [sys.executable, "-m", "metarl_cli.main", "status", created[:8], "--json"], cwd=REPO, env=service_env, capture_output=True, text=True, timeout=60
    )
    assert '"status": "interrupted"' in status.stdout, status.stdout + status.stderr
    again = subprocess.run(command, cwd=REPO, env=service_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0 and f"continuing run {created}" in again.stdout, again.stdout + again.stderr
    with session_scope(pg_url) as session:
        runs = session.execute(select(Run)).scalars().all()
        assert [run.id for run in runs] == [created] and runs[0].status == RunStatus.finished
        assert_exactly_once(session, created)
    second = subprocess.run(
        [*command[:-2], "--new", "--no-workers", "--quiet"], cwd=REPO, env=service_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert second.returncode == 0 and run_id_of(second.stdout) != created, second.stdout + second.stderr
