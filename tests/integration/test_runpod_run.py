"""Acceptance: a run with train = runpod against the fake Runpod GraphQL server, through the real SDK.

Launch, poll, complete and eval with injected capacity errors, 5xx answers, a lost create reply,
slow answers, a preempted pod and a hung pod, and `kill -9` of the train worker mid-job. The
ledger matches the fake's billing to the cent (to the second per pod), no pod is left at the end,
no pod name is ever deployed twice, and the API key is in no log, record, artifact or pod
environment. A second run hits its dollar cap with on_cap = "stop". A third scores the hidden eval on
the jobs' own pods (`[backends.eval] type = "pod_vllm"`; the fake pod runs the real pod side of the
eval with the CPU engine): scores land, the hidden prompts reach no pod before its training ended
(the pods' own storage timeline), and the eval's pod seconds are in the ledger. Loopback traffic is
bounded in count (the fake's request cap) and time (every wait has a deadline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from metarl.pools import WorkerPools, stop_process_group
from metarl.store.db import session_scope
from metarl.store.records import Base, BaselineScore, CostEntry, Evaluation, InnerJob, InnerJobStatus, Run, RunStatus
from tests.conftest import REPO, metarl_cli
from tests.fakes.runpod_server import FakeRunpod, Faults, GpuOffer
from tests.integration.helpers import assert_exactly_once

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# Prices high enough that one billed second more or less shows in cents: a 2x A40 pod is $0.002/s.
GPUS = (
    GpuOffer("NVIDIA A40", "A40", 48, 3.6, 3.0),
    GpuOffer("NVIDIA RTX A6000", "RTX A6000", 48, 4.0, 3.5),
    GpuOffer("NVIDIA L40S", "L40S", 48, 5.0, 4.5),
)
MAX_REQUESTS = 4000
STORAGE_SECRET_ENV = "AWS_SECRET_ACCESS_KEY"


SIM_EVAL = """
[backends.eval]
type = "sim"
duration = { median_s = 0.05, sigma = 0.1, max_s = 1.0 }
"""


def write_config(
    tmp_path: Path,
    name: str,
    *,
    budget: str = "",
    hang_timeout_s: float = 2.0,
    max_outer_steps: int = 2,
    evaluation: str = SIM_EVAL,
    specs: Path = REPO / "tasks_specs",
) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""
[run]
name = "{name}"
seed = 3
tasks = ["addition", "reversal"]
task_specs_dir = "{specs}"
max_outer_steps = {max_outer_steps}

[backends.agent]
type = "sim"
invalid_rate = 0.0
duration = {{ median_s = 0.05, sigma = 0.1, max_s = 1.0 }}

[backends.train]
type = "runpod"
image = "ghcr.io/metarl/inner:prime-rl-0.8.0"
max_pods = 3
warm_pool_size = 1
idle_timeout_s = 20
poll_interval_s = 0.3
startup_timeout_s = 15
hang_timeout_s = {hang_timeout_s}
max_restarts = 2
billing_interval_s = 1
api_timeout_s = 1.0
api_retries = 6
api_backoff_s = 0.05
capacity_cooldown_s = 0
reap_interval_s = 2
orphan_grace_s = 30
{evaluation}
[backends.outer]
type = "sim"
duration = {{ median_s = 0.05, sigma = 0.1, max_s = 1.0 }}

[window]
in_flight = 4
tick_s = 0.2

[outer]
group_size = 2
groups_per_batch = 1

[retries]
lease_s = 3
redispatch_after_s = 3

[artifacts]
root = "{tmp_path / "artifacts"}"
{budget}
"""
    )
    return path


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunpod]:
    key = f"rpa_FAKESECRET_{uuid.uuid4().hex}"
    fake = FakeRunpod(
        key,
        [sys.executable, "-m", "tests.fakes.pod_runner"],
        tmp_path / "cloud",
        pod_cwd=REPO,
        image_env={"FAKE_TRAIN_STEPS": "10", "FAKE_STEP_S": "0.3", "FAKE_POD_MAX_S": "240"},
        gpus=GPUS,
        boot_s=0.3,
        max_requests=MAX_REQUESTS,
    )
    fake.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKESTORAGEID")
    monkeypatch.setenv(STORAGE_SECRET_ENV, f"fake-storage-secret-{uuid.uuid4().hex}")
    yield fake
    fake.stop()
    assert fake.pod_processes_alive() == []


@pytest.fixture
def runpod_pools(cloud: FakeRunpod, pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[WorkerPools]:
    """Worker pools whose environment has the fake's URL and key (set by `cloud` before they start)."""
    pools = WorkerPools(pg_url, redis_url, tmp_path / "logs")
    pools.start()
    yield pools
    pools.stop()


def run_env(pg_url: str, redis_url: str, home: Path) -> dict[str, str]:
    """The environment of `metarl run` on the test's services, with its own METARL_HOME."""
    env = dict(os.environ)
    env.update({"METARL_DATABASE_URL": pg_url, "METARL_BROKER_URL": redis_url, "METARL_LOGLEVEL": "INFO", "METARL_HOME": str(home)})
    return env


def start_run(config: Path, env: dict[str, str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    log_file = open(log_path, "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "metarl_cli.main", "run", str(config), "--no-workers", "--quiet"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log_file,
        start_new_session=True,
    )
    log_file.close()
    assert process.stdout is not None
    first = process.stdout.readline().decode()
    return process, first.split()[1]


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def heartbeat_steps(artifacts: Path) -> list[int]:
    steps = []
    for path in (artifacts / "runpod" / "jobs").glob("*/a*/status.json"):
        try:
            steps.append(json.loads(path.read_text())["step"] or 0)
        except (ValueError, KeyError, FileNotFoundError):
            continue
    return steps


def launch_orphan(artifacts: Path, run_id: str) -> str:
    """A pod named like one of the run's jobs, assigned to a job that does not exist."""
    from metarl.backends.runpod.pod.protocol import PodAssignment
    from metarl.backends.runpod.pod.supervisor import POD_NAME_ENV, POD_ROOT_ENV
    from metarl.backends.runpod.provider import LaunchRequest, RetryPolicy, RunpodProvider

    name = f"metarl-{run_id[:8]}-999999"
    assignment = artifacts / "runpod" / "pods" / name / "assignment.json"
    assignment.parent.mkdir(parents=True, exist_ok=True)
    assignment.write_text(PodAssignment(pod_name=name, seq=1, job_name=name).model_dump_json())
    provider = RunpodProvider(RetryPolicy(attempts=6, backoff_s=0.05, call_timeout_s=2.0))
    env = {POD_ROOT_ENV: str(artifacts / "runpod"), POD_NAME_ENV: name}
    return provider.launch(LaunchRequest(name=name, image="ghcr.io/metarl/inner:prime-rl-0.8.0", gpu_types=("NVIDIA L40S",), env=env)).pod_id


def running_jobs(pg_url: str, run_id: str) -> int:
    with session_scope(pg_url) as session:
        return session.execute(
            select(func.count())
            .select_from(InnerJob)
            .where(InnerJob.run_id == run_id, InnerJob.status == InnerJobStatus.running, InnerJob.external_id.is_not(None))
        ).scalar_one()


def ledger_seconds_by_pod(pg_url: str, run_id: str) -> dict[str, float]:
    with session_scope(pg_url) as session:
        rows = session.execute(select(CostEntry.idempotency_key, CostEntry.quantity).where(CostEntry.run_id == run_id, CostEntry.source == "runpod")).all()
    seconds: dict[str, float] = {}
    for key, quantity in rows:
        pod_id = key.split(":")[1]
        seconds[pod_id] = seconds.get(pod_id, 0.0) + quantity
    return seconds


def ledger_usd(pg_url: str, run_id: str) -> float:
    with session_scope(pg_url) as session:
        return float(
            session.execute(
                select(func.coalesce(func.sum(CostEntry.amount_usd), 0)).where(CostEntry.run_id == run_id, CostEntry.source == "runpod")
            ).scalar_one()
        )


def assert_billing_matches(cloud: FakeRunpod, pg_url: str, run_id: str) -> None:
    fake_seconds = {row["pod_id"]: float(row["seconds"]) for row in cloud.billing() if row["seconds"]}
    assert ledger_seconds_by_pod(pg_url, run_id) == fake_seconds, "pod seconds in the ledger differ from the fake's billing"
    fake_usd = sum(row["usd"] for row in cloud.billing())
    assert fake_usd > 0
    assert abs(ledger_usd(pg_url, run_id) - fake_usd) < 0.005, f"ledger ${ledger_usd(pg_url, run_id):.4f} vs fake ${fake_usd:.4f}"


def assert_not_recorded(secret: str, tmp_path: Path, pg_url: str) -> None:
    """The secret is in no log, artifact, pod log or database row."""
    needle = secret.encode()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), f"a secret leaked into {path}"
    with session_scope(pg_url) as session:
        for table in Base.metadata.sorted_tables:
            for (row,) in session.execute(text(f'SELECT t::text FROM "{table.name}" t')):
                assert secret not in row, f"a secret leaked into table {table.name}"


def assert_no_secret_anywhere(key: str, storage_secret: str, tmp_path: Path, pg_url: str, cloud: FakeRunpod) -> None:
    """The API key is nowhere, not even in a pod's environment; the storage secret reached every pod and nothing else."""
    assert_not_recorded(key, tmp_path, pg_url)
    assert_not_recorded(storage_secret, tmp_path, pg_url)
    environments = cloud.pod_environments()
    for env in environments:
        assert key not in json.dumps(env) and "RUNPOD_API_KEY" not in env
    launched = [env for env in environments if "METARL_RUNNER_JOB_URL" in env]  # not the orphan the test launched itself
    assert launched
    for env in launched:
        assert env.get(STORAGE_SECRET_ENV) == storage_secret and env.get("AWS_ACCESS_KEY_ID") == "AKIAFAKESTORAGEID"
    assert cloud.seen_authorization == {f"Bearer {key}"}


def test_runpod_run_survives_faults_bills_exactly_and_leaves_nothing_running(tmp_path, cloud, runpod_pools, pg_url, redis_url):
    cloud.faults = Faults(
        capacity_errors={"NVIDIA A40": 2},
        every_nth_5xx=11,
        lost_replies={"deploy": 1},
        slow_replies={"pod": (2, 2.0)},
        preempt_job={2: 1.0},
        hang_job={3: 1.0},
    )
    config = write_config(tmp_path, "runpod-accept")
    env = run_env(pg_url, redis_url, tmp_path / "metarl-home")
    key = env["RUNPOD_API_KEY"]
    orchestrator, run_id = start_run(config, env, tmp_path / "logs" / "orchestrator.log")
    try:
        artifacts = tmp_path / "artifacts"
        # kill -9 of the train worker while a launched job is running on a pod; a look at a live pod's environment
        wait_until(
            lambda: running_jobs(pg_url, run_id) and any(step >= 2 for step in heartbeat_steps(artifacts)), 90, "a launched job making progress on a pod"
        )
        for pid in cloud.pod_processes_alive():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue  # the pod was terminated in between
            assert key.encode() not in environ
        runpod_pools.kill_pool("train")
        time.sleep(1.0)
        runpod_pools.start_pool("train")
        # a pod of this run whose job is not live: the train workers' reaper terminates and bills it
        orphan = launch_orphan(artifacts, run_id)
        wait_until(lambda: orphan not in {pod.id for pod in cloud.live_pods()}, 60, "the reaper to terminate an orphan pod")
        stdout, _ = orchestrator.communicate(timeout=150)
        assert orchestrator.returncode == 0, (tmp_path / "logs" / "orchestrator.log").read_text()[-3000:]
    finally:
        stop_process_group(orchestrator)

    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).status == RunStatus.finished
        assert_exactly_once(session, run_id)
        jobs = session.execute(select(InnerJob).where(InnerJob.run_id == run_id)).scalars().all()
        assert jobs and all(job.backend == "runpod" and job.status == InnerJobStatus.succeeded for job in jobs), [(j.name, j.status, j.error) for j in jobs]
        restarts = [reason for job in jobs for reason in job.backend_state.get("restarts", [])]
        assert any("preempted" in reason for reason in restarts), restarts
        assert any("watchdog" in reason for reason in restarts), restarts
        assert all(job.launch_count == 1 for job in jobs)

    # faults really happened, and none made a second pod of the same name
    assert cloud.capacity_refusals["NVIDIA A40"] == 2
    assert sum(cloud.injected[kind] for kind in ("html502", "json500", "graphql503")) >= 3
    assert cloud.injected["lost:deploy"] == 1 and cloud.injected["slow:pod"] == 2
    assert any(pod.preempted for pod in cloud.pods.values()) and any(pod.hung for pod in cloud.pods.values())
    assert max(cloud.deploys_by_name.values()) == 1, cloud.deploys_by_name
    assert not cloud.overflowed and cloud.requests < MAX_REQUESTS

    # nothing left running, billing exact, no secret anywhere
    assert cloud.live_pods() == [], [(pod.name, pod.status) for pod in cloud.live_pods()]
    assert_billing_matches(cloud, pg_url, run_id)
    status = json.loads(metarl_cli(["status", run_id, "--json"], env).stdout)
    assert any(cost["source"] == "runpod" and not cost["simulated"] for cost in status["costs"])
    assert status["inner_jobs"]["succeeded"] == len(jobs)
    assert_no_secret_anywhere(key, env[STORAGE_SECRET_ENV], tmp_path, pg_url, cloud)


def test_run_budget_cap_with_on_cap_stop_terminates_running_pods_and_says_so(tmp_path, cloud, runpod_pools, pg_url, redis_url):
    config = write_config(
        tmp_path, "runpod-capped", budget='[budget]\nmax_run_usd = 0.006\nmax_job_usd = 1.0\non_cap = "stop"\n', hang_timeout_s=5.0, max_outer_steps=20
    )
    env = run_env(pg_url, redis_url, tmp_path / "metarl-home")
    orchestrator, run_id = start_run(config, env, tmp_path / "logs" / "orchestrator.log")
    try:
        orchestrator.communicate(timeout=120)
        assert orchestrator.returncode == 0, (tmp_path / "logs" / "orchestrator.log").read_text()[-3000:]
    finally:
        stop_process_group(orchestrator)
    status = json.loads(metarl_cli(["status", run_id, "--json"], env).stdout)
    assert status["run"]["status"] == "stopped"
    assert "budget" in status["run"]["message"] and "stopped" in status["run"]["message"], status["run"]["message"]
    with session_scope(pg_url) as session:
        jobs = session.execute(select(InnerJob).where(InnerJob.run_id == run_id, InnerJob.external_id.is_not(None))).scalars().all()
        stopped = [job for job in jobs if job.status == InnerJobStatus.failed and "budget cap" in (job.error or "")]
        assert stopped, [(job.name, job.status, job.error) for job in jobs]
        first_stop = min(job.finished_at for job in stopped)
        assert all(job.launched_at <= first_stop for job in jobs), "a job was launched after the cap stopped the others"
        assert_exactly_once(session, run_id)
    assert cloud.live_pods() == []
    assert max(cloud.deploys_by_name.values()) == 1
    assert_billing_matches(cloud, pg_url, run_id)
    assert ledger_usd(pg_url, run_id) >= 0.006


# --- the hidden eval on the jobs' own pods -------------------------------------------------------------

POD_EVAL = """
[backends.eval]
type = "pod_vllm"
eval_timeout_s = 120
"""


def small_specs(tmp_path: Path) -> Path:
    """The repo's addition and reversal specs with 8 hidden items each (the fake pods score on the CPU)."""
    folder = tmp_path / "specs"
    folder.mkdir()
    for name in ("addition", "reversal"):
        text = (REPO / "tasks_specs" / f"{name}.toml").read_text()
        (folder / f"{name}.toml").write_text(text.replace("n_items = 200", "n_items = 8"))
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from metarl.learning.models import ensure_base_model

    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=0.01)


@pytest.fixture
def eval_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> Iterator[FakeRunpod]:
    key = f"rpa_FAKESECRET_{uuid.uuid4().hex}"
    fake = FakeRunpod(
        key,
        [sys.executable, "-m", "tests.fakes.pod_runner"],
        tmp_path / "cloud",
        pod_cwd=REPO,
        image_env={
            "FAKE_TRAIN_STEPS": "4",
            "FAKE_STEP_S": "0.3",
            "FAKE_POD_MAX_S": "280",
            "FAKE_POD_MODEL": str(tiny_model),
            "FAKE_POD_TIMELINE": str(tmp_path / "timeline"),
        },
        gpus=GPUS,
        boot_s=0.3,
        max_requests=MAX_REQUESTS,
    )
    fake.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    yield fake
    fake.stop()
    assert fake.pod_processes_alive() == []


@pytest.fixture
def eval_pools(eval_cloud: FakeRunpod, pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[WorkerPools]:
    pools = WorkerPools(pg_url, redis_url, tmp_path / "logs")
    pools.start()
    yield pools
    pools.stop()


def pod_timeline(tmp_path: Path) -> dict[str, list[dict]]:
    """The fake pods' record of their jobs' storage, by job."""
    by_job: dict[str, list[dict]] = {}
    for path in (tmp_path / "timeline").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            by_job.setdefault(row["job"], []).append(row)
    return {job: sorted(rows, key=lambda row: row["t"]) for job, rows in by_job.items()}


def test_runpod_run_scores_on_the_jobs_pods_after_training_and_bills_the_eval(tmp_path, eval_cloud, eval_pools, pg_url, redis_url):
    config = write_config(tmp_path, "runpod-pod-eval", hang_timeout_s=30.0, max_outer_steps=1, evaluation=POD_EVAL, specs=small_specs(tmp_path))
    env = run_env(pg_url, redis_url, tmp_path / "metarl-home")
    orchestrator, run_id = start_run(config, env, tmp_path / "logs" / "orchestrator.log")
    try:
        orchestrator.communicate(timeout=240)
        assert orchestrator.returncode == 0, (tmp_path / "logs" / "orchestrator.log").read_text()[-3000:]
    finally:
        stop_process_group(orchestrator)

    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).status == RunStatus.finished
        assert_exactly_once(session, run_id)
        jobs = session.execute(select(InnerJob).where(InnerJob.run_id == run_id)).scalars().all()
        assert len(jobs) >= 2 and all(job.status == InnerJobStatus.succeeded for job in jobs), [(j.name, j.status, j.error) for j in jobs]
        evaluations = (
            session.execute(select(Evaluation).join(InnerJob, InnerJob.episode_id == Evaluation.episode_id).where(InnerJob.run_id == run_id)).scalars().all()
        )
        # scores land: graded on the workers from the pods' completions, 8 hidden items each
        assert len(evaluations) == len(jobs) and all(e.backend == "pod_vllm" and not e.simulated and e.n_items == 8 for e in evaluations)
        # the fake pods' "trained" weights are the base model itself: the same completions, the same score
        assert all(e.trained_score == e.base_score for e in evaluations)
        baselines = session.execute(select(BaselineScore).where(BaselineScore.backend == "pod_vllm")).scalars().all()
        assert baselines and all(b.n_items == 8 for b in baselines)
        eval_rows = session.execute(select(CostEntry).where(CostEntry.run_id == run_id, CostEntry.source == "runpod_eval")).scalars().all()
    assert eval_rows and all(row.unit == "pod_second" and "hidden eval of" in row.description for row in eval_rows)
    assert {row.episode_id for row in eval_rows} <= {job.episode_id for job in jobs}

    # the hidden prompts reached each pod only after its training ended and its exit.json was written, and left it after
    timeline = pod_timeline(tmp_path)
    assert set(timeline) >= {job.name for job in jobs}
    for job in jobs:
        rows = timeline[job.name]
        assert not any(row.get("request_present") for row in rows), f"{job.name}: a hidden-eval request was in storage while it trained"
        kinds = [row["event"] for row in rows]
        assert kinds[-4:] == ["training_ended", "exit_written", "request_read", "result_written"], kinds
        assert rows[-1]["request_deleted"] and rows[-1]["error"] is None
    for request in (tmp_path / "artifacts" / "runpod" / "jobs").glob("*/a*/eval/request.json"):
        raise AssertionError(f"a hidden-eval request is still in storage: {request}")

    # every pod second billed exactly once, training and eval together, as the fake billed it
    with session_scope(pg_url) as session:
        rows = session.execute(
            select(CostEntry.idempotency_key, CostEntry.quantity).where(CostEntry.run_id == run_id, CostEntry.source.in_(("runpod", "runpod_eval")))
        ).all()
    seconds: dict[str, float] = {}
    for key, quantity in rows:
        seconds[key.split(":")[1]] = seconds.get(key.split(":")[1], 0.0) + quantity
    assert seconds == {row["pod_id"]: float(row["seconds"]) for row in eval_cloud.billing() if row["seconds"]}
    assert eval_cloud.live_pods() == []
