"""The Runpod train backend: billing intervals, watchdog, verdicts, warm pool and reaper decisions
(pure), its config, and one backend against the fake server: launch, poll, warm reuse, a preempted
pod, a hung pod, release; billed seconds equal the fake's."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from metarl.backends.runpod.config import RunpodTrainBackend
from metarl.backends.runpod.pod.protocol import ExitReport, Heartbeat, PodAssignment, decode_env_value
from metarl.backends.runpod.pods import (
    REAP_LOCK_KEY,
    billable_chunks,
    chunks_after,
    final_uptime,
    job_cost_usd,
    pod_charges,
    pod_name_for,
    run_key_of,
    run_prefix,
    settle_price,
    startup_uptime,
)
from metarl.backends.runpod.provider import PodState
from metarl.backends.runpod.train import RunpodTrain
from metarl.backends.runpod.verdicts import ReapSchedule, heartbeat_step, judge, keep_warm, reap_reason, watchdog
from metarl.interfaces import CostItem, EpisodeContext, ReapView, RunState
from metarl.runconfig import load_run
from schemas.base import load_toml_model
from schemas.job import JobModel, JobSpec
from schemas.run_config import BudgetConfig
from schemas.states import RunStatus
from schemas.task_spec import TaskSpec
from tests.conftest import REPO
from tests.fakes.runpod_server import FakeRunpod, Faults

RUN_ID = "0a1b2c3d-0000-4000-8000-000000000001"

# --- pure ---------------------------------------------------------------------------------------


def test_billing_intervals_cover_every_second_exactly_once():
    assert billable_chunks(uptime_s=125, chunk_s=60, billed_chunks=0, final=False) == [(0, 60), (1, 60)]
    assert billable_chunks(uptime_s=125, chunk_s=60, billed_chunks=2, final=False) == []
    assert billable_chunks(uptime_s=125, chunk_s=60, billed_chunks=2, final=True) == [(2, 5)]
    assert billable_chunks(uptime_s=120, chunk_s=60, billed_chunks=1, final=True) == [(1, 60)]
    assert billable_chunks(uptime_s=0, chunk_s=60, billed_chunks=0, final=True) == []
    assert chunks_after(125, 60, 0, final=False) == 2 and chunks_after(125, 60, 2, final=True) == 3
    for uptime in range(0, 200, 7):
        for polls in ([10, 50, 100], [uptime], []):
            billed, seconds = 0, 0
            for seen in [p for p in polls if p <= uptime]:
                seconds += sum(s for _, s in billable_chunks(seen, 30, billed, final=False))
                billed = chunks_after(seen, 30, billed, final=False)
            seconds += sum(s for _, s in billable_chunks(uptime, 30, billed, final=True))
            assert seconds == uptime


def test_charges_are_keyed_by_pod_and_interval_only():
    items = pod_charges("pod1", "2x A40", 0.88, [(0, 60), (1, 5)], 60)
    assert [item.key for item in items] == ["runpod:pod1:0", "runpod:pod1:1"]
    assert [item.quantity for item in items] == [60.0, 5.0]
    assert all(item.source == "runpod" and item.unit == "pod_second" and item.unit_price_usd == pytest.approx(0.88 / 3600) for item in items)


def test_settled_seconds_prices_and_job_cost():
    assert final_uptime(frozen_uptime=40, last_uptime=38) == 40
    assert final_uptime(frozen_uptime=0, last_uptime=38) == 38
    assert final_uptime(frozen_uptime=None, last_uptime=38) == 38
    assert settle_price(0.88, 0.5, 0.4) == 0.88 and settle_price(None, 0.0, 0.4) == 0.4 and settle_price(None, None, None) == 0.0
    assert job_cost_usd(prior_usd=1.0, uptime_s=3700, uptime_at_assign=100, cost_per_hr=3.6) == pytest.approx(4.6)


def test_watchdog_allows_startup_then_watches_progress():
    assert watchdog(now=50, step=None, last_step=-2, last_progress_at=0, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10).hung is None
    late = watchdog(now=61, step=None, last_step=-2, last_progress_at=0, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10)
    assert late.startup_timeout and late.hung.startswith("start-up timeout") and "startup_timeout_s = 60s" in late.hung
    started = watchdog(now=30, step=-1, last_step=-2, last_progress_at=0, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10)
    assert (started.last_step, started.hung) == (-1, None)
    assert watchdog(now=61, step=-1, last_step=-1, last_progress_at=30, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10).startup_timeout
    moved = watchdog(now=40, step=3, last_step=2, last_progress_at=35, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10)
    assert (moved.last_step, moved.last_progress_at, moved.hung) == (3, 40, None)
    assert watchdog(now=44, step=3, last_step=3, last_progress_at=40, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10).hung is None
    hung = watchdog(now=51, step=3, last_step=3, last_progress_at=40, assigned_at=0, startup_timeout_s=60, hang_timeout_s=10)
    assert "hung" in hung.hung and not hung.startup_timeout


def test_a_timed_out_start_up_is_billed_for_the_seconds_it_held_the_pod():
    assert startup_uptime(uptime_s=0, uptime_at_assign=0, assigned_at=100.0, now=1900.7) == 1800, "no uptime shown: the wall seconds"
    assert startup_uptime(uptime_s=1830, uptime_at_assign=0, assigned_at=100.0, now=1900.0) == 1830, "the vendor's uptime when larger"
    assert startup_uptime(uptime_s=500, uptime_at_assign=500, assigned_at=100.0, now=1900.0) == 2300, "a warm pod: its uptime at the claim, plus"
    assert verdict(hung="start-up timeout", startup_timeout=True).startup_timeout
    assert not verdict(hung="start-up timeout", startup_timeout=True, pod_state=PodState.stopped).startup_timeout, "a lost pod is not a start-up timeout"
    assert not verdict(hung="stuck").startup_timeout


def test_runner_heartbeats_give_the_step():
    beat = Heartbeat(state="installing", sequence=0, prime_rl_tag="v0.8.0", started_at=1.0, updated_at=2.0)
    assert heartbeat_step(None) is None and heartbeat_step(beat) == -1 and heartbeat_step(beat.model_copy(update={"step": 7})) == 7


def report(succeeded: bool, reason: str = "completed") -> ExitReport:
    return ExitReport(
        succeeded=succeeded,
        reason=reason,
        exit_code=0 if succeeded else 1,
        prime_rl_tag="v0.8.0",
        started_at=1.0,
        finished_at=2.0,
        duration_s=1.0,
        message="boom" if not succeeded else "",
    )


def verdict(**overrides):
    values = dict(pod_state=PodState.running, exit_report=None, hung=None, restarts=0, max_restarts=1, job_cost=0.1, max_job_usd=5.0, stop_for_run_cap=False)
    values.update(overrides)
    return judge(**values)


def test_verdicts_in_order_report_then_lost_pod_then_caps_then_watchdog():
    assert verdict().action == "running"
    assert verdict(pod_state=PodState.provisioning).action == "running"
    assert verdict(exit_report=report(True), pod_state=None).action == "succeeded"
    failed = verdict(exit_report=report(False, "rl_failed"))
    assert failed.action == "failed" and "boom" in failed.reason and "rl_failed" in failed.reason
    assert verdict(exit_report=report(False, "stalled"), hung="stuck").action == "failed"
    assert verdict(pod_state=PodState.stopped).action == "restart"
    assert verdict(pod_state=None, restarts=1).action == "abort"
    assert verdict(stop_for_run_cap=True).action == "abort"
    assert "max_job_usd" in verdict(job_cost=5.0).reason
    assert verdict(hung="stuck").action == "restart" and verdict(hung="stuck", restarts=1).action == "abort"
    assert verdict(hung="stuck", pod_state=PodState.stopped).reason.startswith("pod was preempted")


def test_warm_pool_keeps_healthy_pods_up_to_its_size():
    assert keep_warm(PodState.running, idle_pods=0, warm_pool_size=1, run_accepting=True)
    assert not keep_warm(PodState.running, idle_pods=1, warm_pool_size=1, run_accepting=True)
    assert not keep_warm(PodState.running, idle_pods=0, warm_pool_size=1, run_accepting=False)
    assert not keep_warm(PodState.stopped, idle_pods=0, warm_pool_size=4, run_accepting=True)


def reap(**overrides):
    values = dict(
        pod_state=PodState.running,
        uptime_s=5,
        assignment=None,
        job_live=False,
        run_final=False,
        run_accepting=True,
        now=1000.0,
        idle_timeout_s=60,
        orphan_grace_s=30,
    )
    values.update(overrides)
    return reap_reason(**values)


def test_reaper_decisions():
    busy = PodAssignment(pod_name="metarl-0a1b2c3d-7", seq=1, job_name="metarl-0a1b2c3d-7")
    idle = PodAssignment(pod_name="metarl-0a1b2c3d-7", seq=2, released_at=990.0)
    assert reap(assignment=busy, job_live=True) is None
    assert "not live" in reap(assignment=busy, job_live=False)
    assert reap(assignment=busy, job_live=True, run_final=True) == "its run has ended"
    assert reap() is None and "orphan" in reap(uptime_s=31)
    assert reap(assignment=idle) is None
    assert "idle for" in reap(assignment=idle, now=1051.0)
    assert reap(assignment=idle, run_accepting=False) is not None
    assert reap(assignment=idle, pod_state=PodState.stopped) == "stopped while idle"
    assert reap(assignment=idle.model_copy(update={"terminated": True})) is not None
    assert reap(assignment=busy, pod_state=PodState.terminated, run_final=True) is None


def test_names():
    assert pod_name_for("metarl-0a1b2c3d-7", 0) == "metarl-0a1b2c3d-7" and pod_name_for("metarl-0a1b2c3d-7", 2) == "metarl-0a1b2c3d-7-r2"
    assert run_prefix(RUN_ID) == "metarl-0a1b2c3d-"
    assert run_key_of("metarl-0a1b2c3d-7-r1") == "0a1b2c3d" and run_key_of("other-pod") is None and run_key_of("metarl-short-1") is None


def test_config_bounds_and_no_key_in_the_config():
    with pytest.raises(ValidationError, match="warm_pool_size"):
        RunpodTrainBackend(type="runpod", image="img:1", max_pods=2, warm_pool_size=3)
    with pytest.raises(ValidationError, match="poll_interval_s"):
        RunpodTrainBackend(type="runpod", image="img:1", poll_interval_s=60, hang_timeout_s=30)
    with pytest.raises(ValidationError):
        RunpodTrainBackend(type="runpod", image="img:1", gpu_types=['NVIDIA A40" }'])
    with pytest.raises(ValidationError) as err:
        RunpodTrainBackend.model_validate({"type": "runpod", "image": "img:1", "runpod_api_key": "rpa_SECRET_IN_CONFIG"})
    assert "rpa_SECRET_IN_CONFIG" not in str(err.value)
    assert RunpodTrainBackend(type="runpod", image="img:1").gpu_count == 2


# --- one backend against the fake server ---------------------------------------------------


@pytest.fixture
def cloud(tmp_path, monkeypatch) -> Iterator[FakeRunpod]:
    key = f"rpa_TEST_{uuid.uuid4().hex}"
    server = FakeRunpod(
        key,
        [sys.executable, "-m", "tests.fakes.pod_runner"],
        tmp_path / "cloud",
        pod_cwd=REPO,
        image_env={"FAKE_TRAIN_STEPS": "4", "FAKE_STEP_S": "0.15", "FAKE_POD_MAX_S": "60", "FAKE_POD_NO_SIGNAL_SUFFIX": "-2"},
        boot_s=0.05,
        max_requests=2000,
        faults=Faults(capacity_errors={"NVIDIA A40": 1}),
    )
    server.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    monkeypatch.delenv("METARL_DATABASE_URL", raising=False)
    yield server
    server.stop()
    assert not server.overflowed
    assert server.pod_processes_alive() == []


def context(episode: int, tmp_path) -> EpisodeContext:
    task = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")
    return EpisodeContext(
        run_id=RUN_ID,
        episode_id=episode,
        task=task,
        policy_version=0,
        probe_attempt=1,
        seed=1,
        artifacts_root=str(tmp_path / "artifacts"),
        train_backend="runpod",
        train_on_gpu=True,
    )


def run_to_end(backend: RunpodTrain, ctx: EpisodeContext, job: JobSpec, name: str, ledger: list, mid_job=None, timeout_s: float = 30.0):
    """Launch, then poll like the train task does; `mid_job(pod_id)` runs once the first attempt made progress."""
    launched = backend.launch(ctx, job, name)
    state, deadline = launched.state, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        polled = backend.poll(ctx, job, launched.external_id, state)
        ledger.extend((ctx.episode_id, item) for item in polled.costs)
        state = polled.state
        if polled.status != "running":
            return polled
        if mid_job is not None and state["last_step"] >= 1:
            mid_job(state["pod_id"])
            mid_job = None
        time.sleep(0.1)
    raise AssertionError(f"job {name} did not end")


def test_backend_launch_poll_warm_reuse_preemption_hang_and_release(cloud, tmp_path):
    ledger: list[tuple[int | None, CostItem]] = []
    config = RunpodTrainBackend(
        type="runpod",
        image="ghcr.io/metarl/inner:0.8.0",
        max_pods=4,
        warm_pool_size=1,
        idle_timeout_s=60,
        poll_interval_s=0.1,
        startup_timeout_s=10,
        hang_timeout_s=1.0,
        max_restarts=1,
        billing_interval_s=1,
        api_timeout_s=1.0,
        api_backoff_s=0.01,
        capacity_cooldown_s=0.0,
    )
    storage = {"AWS_ACCESS_KEY_ID": "AKIAFAKE", "AWS_SECRET_ACCESS_KEY": "fake/secret+value", "AWS_REGION": "", "UNLISTED_TOKEN": "x"}
    backend = RunpodTrain(
        config, str(tmp_path / "artifacts"), BudgetConfig(), ledger=lambda run, episode, items: ledger.extend((episode, i) for i in items), environ=storage
    )
    job = JobSpec(model=JobModel(name="Qwen/Qwen3-0.6B"))

    retried = backend.launch(context(1, tmp_path), job, "metarl-0a1b2c3d-1")
    assert backend.launch(context(1, tmp_path), job, "metarl-0a1b2c3d-1").external_id == retried.external_id, "a retried launch made a new pod"
    # the job's time cap is the task's GPU cap, not the CPU stand-in's
    job_record = json.loads((tmp_path / "artifacts" / "runpod" / "jobs" / "metarl-0a1b2c3d-1" / "job.json").read_text())
    task = context(1, tmp_path).task
    assert job_record["max_train_seconds"] == task.budget.max_gpu_train_seconds != task.budget.max_train_seconds
    (pod_env,) = cloud.pod_environments()
    # the listed storage variables that are set reach the pod (the secret base64-encoded for the GraphQL), nothing else of the worker's
    assert pod_env["AWS_ACCESS_KEY_ID"] == "AKIAFAKE" and decode_env_value(pod_env["AWS_SECRET_ACCESS_KEY"]) == "fake/secret+value"
    assert "AWS_REGION" not in pod_env and "UNLISTED_TOKEN" not in pod_env
    assert "fake/secret+value" not in repr(backend._launch_request("metarl-0a1b2c3d-9", "metarl-0a1b2c3d-9", "a0"))
    first = run_to_end(backend, context(1, tmp_path), job, "metarl-0a1b2c3d-1", ledger)
    assert (
        first.status == "succeeded"
        and first.checkpoint_uri.endswith("a0/weights/step_4")
        and first.metrics_uri.endswith("a0/metrics/metrics.jsonl")
        and first.train_seconds > 0
    )
    assert cloud.capacity_refusals["NVIDIA A40"] == 1 and "A6000" in first.state["gpu_type"]
    second = run_to_end(backend, context(2, tmp_path), job, "metarl-0a1b2c3d-2", ledger)
    assert second.status == "succeeded" and second.state["pod_id"] == first.state["pod_id"], "the warm pod was not reused"
    # job 2 had no learning signal and saved nothing: a result, scored as the base by the eval
    assert second.checkpoint_uri is None and second.state["trained_is_base"] and not first.state["trained_is_base"]
    assert len(cloud.pods) == 1

    third = run_to_end(backend, context(3, tmp_path), job, "metarl-0a1b2c3d-3", ledger, mid_job=cloud.preempt)
    assert third.status == "succeeded" and third.state["attempt"] == 1 and "preempted" in third.state["restarts"][0]
    fourth = run_to_end(backend, context(4, tmp_path), job, "metarl-0a1b2c3d-4", ledger, mid_job=cloud.hang)
    assert fourth.status == "succeeded" and "watchdog" in fourth.state["restarts"][0]
    assert [pod.preempted for pod in cloud.pods.values()].count(True) == 1
    hung = [pod for pod in cloud.pods.values() if pod.hung]
    assert len(hung) == 1 and hung[0].terminated, "the watchdog did not terminate the hung pod"

    assert backend.release_run(RUN_ID) >= 1
    assert cloud.live_pods() == []
    billed: dict[str, float] = {}
    for _, item in {item.key: (episode, item) for episode, item in ledger}.values():
        pod_id = item.key.split(":")[1]
        billed[pod_id] = billed.get(pod_id, 0.0) + item.quantity
    assert billed == {row["pod_id"]: float(row["seconds"]) for row in cloud.billing() if row["seconds"]}
    assert cloud.deploys_by_name.most_common(1)[0][1] == 1


def test_a_start_up_past_its_timeout_is_billed_for_the_time_it_held_the_pod_and_says_so(cloud, tmp_path):
    ledger: list[tuple[int | None, CostItem]] = []
    config = RunpodTrainBackend(
        type="runpod",
        image="ghcr.io/metarl/inner:0.8.0",
        max_pods=2,
        warm_pool_size=0,
        poll_interval_s=0.1,
        startup_timeout_s=1.0,
        max_restarts=0,
        billing_interval_s=1,
        api_timeout_s=1.0,
        api_backoff_s=0.01,
        capacity_cooldown_s=0.0,
    )
    backend = RunpodTrain(config, str(tmp_path / "artifacts"), BudgetConfig(), ledger=lambda run, episode, items: ledger.extend((episode, i) for i in items))
    cloud.faults.dead_containers = 1  # a host that cannot start the image: the pod shows no uptime while it is billed
    job = JobSpec(model=JobModel(name="Qwen/Qwen3-0.6B"))
    ended = run_to_end(backend, context(1, tmp_path), job, "metarl-0a1b2c3d-1", ledger)
    assert ended.status == "failed" and "start-up timeout" in ended.error and "startup_timeout_s = 1s" in ended.error
    (pod,) = cloud.pods.values()
    assert pod.container_dead and pod.terminated
    charged = {item.key: item for _, item in ledger}
    billed_here = sum(item.quantity for item in charged.values())
    (billed_there,) = [row["seconds"] for row in cloud.billing()]
    assert billed_there - 2 <= billed_here <= billed_there and billed_here >= 1, (billed_here, billed_there)
    assert all(key.startswith(f"runpod:{pod.id}:") and "start-up timed out" in item.description for key, item in charged.items())
    assert f"billed for {int(billed_here)}s" in ended.error


# --- the run database, injected ---------------------------------------------------------------


class InMemoryRuns:
    """`metarl.interfaces.RunpodRuns` in memory (the store's `RunpodRunStore` is tested on PostgreSQL in
    tests/integration/test_stage_work.py): a ledger kept once per key, run states, and locks held by this test."""

    def __init__(self, name: str, config, status: RunStatus = RunStatus.running):  # type: ignore[no-untyped-def]
        self.name = name
        self.config = config
        self.status = status
        self.ledger: dict[str, CostItem] = {}
        self.held: set[int] = set()

    def record_costs(self, run_id: str, episode_id: int | None, items: list[CostItem]) -> None:
        for item in items:
            self.ledger.setdefault(item.key, item)

    def run_total_usd(self, run_id: str) -> float:
        return sum(item.quantity * item.unit_price_usd for item in self.ledger.values())

    def run_state(self, run_id: str) -> RunState | None:
        return RunState(status=self.status, stop_requested=False) if run_id == RUN_ID else None

    def base_score_cached(self, task, model_name, eval_backend, identity) -> bool:  # type: ignore[no-untyped-def]
        return False

    @contextlib.contextmanager
    def holding_lock(self, key: int) -> Iterator[None]:
        self.held.add(key)
        try:
            yield
        finally:
            self.held.discard(key)

    @contextlib.contextmanager
    def trying_lock(self, key: int) -> Iterator[bool]:
        if key in self.held:
            yield False
            return
        with self.holding_lock(key):
            yield True

    def reap_view(self, run_key: str) -> ReapView | None:
        if not RUN_ID.startswith(run_key):
            return None
        return ReapView(run_id=RUN_ID, status=self.status, config=self.config, live_jobs=frozenset())


def test_the_reaper_and_the_ledger_go_through_the_injected_run_database(cloud, tmp_path):
    artifacts = tmp_path / "artifacts"
    text = (REPO / "examples" / "runpod.toml").read_text()
    text = text.replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{REPO / "tasks_specs"}"').replace(
        'root = "s3://your-bucket/metarl"', f'root = "{artifacts}"'
    )
    (tmp_path / "run.toml").write_text(text)
    run_config, _ = load_run(tmp_path / "run.toml")
    train = run_config.backends.train.model_copy(
        update={"poll_interval_s": 0.1, "billing_interval_s": 1, "api_timeout_s": 1.0, "api_backoff_s": 0.01, "capacity_cooldown_s": 0.0}
    )
    runs = InMemoryRuns(f"in-memory-{uuid.uuid4()}", run_config.model_copy(update={"backends": run_config.backends.model_copy(update={"train": train})}))
    backend = RunpodTrain(train, str(artifacts), BudgetConfig(), runs, reap_schedule=ReapSchedule())
    job = JobSpec(model=JobModel(name="Qwen/Qwen3-0.6B"))
    launched = backend.launch(context(1, tmp_path), job, "metarl-0a1b2c3d-1")
    assert backend._run_accepting(RUN_ID) and not backend._run_accepting("another-run")
    (pod,) = cloud.live_pods()
    time.sleep(1.5)  # a second of uptime to bill

    runs.status = RunStatus.finished
    assert not backend._run_accepting(RUN_ID)
    with runs.holding_lock(REAP_LOCK_KEY):  # another process is reaping
        assert backend.maintain(force=True) == 0 and cloud.live_pods() == [pod]
    assert backend.maintain() == 0 and cloud.live_pods() == [pod], "the reaper ran moments ago: it waits out reap_interval_s"
    assert backend.maintain(force=True) == 1, "the pod of a run that ended is reaped"
    assert cloud.live_pods() == [] and launched.external_id == pod.id
    billed = {row["pod_id"]: float(row["seconds"]) for row in cloud.billing() if row["seconds"]}
    assert {pod.id: sum(item.quantity for item in runs.ledger.values())} == billed, "the settled pod's seconds are in the run's ledger"


def test_the_reap_schedule_lets_each_run_database_reap_once_per_interval() -> None:
    schedule = ReapSchedule()
    assert schedule.take("db", 100.0, 60.0), "a reaper that never ran is due"
    assert not schedule.take("db", 159.9, 60.0)
    assert schedule.take("other-db", 120.0, 60.0), "each run database has its own schedule"
    assert schedule.take("db", 160.0, 60.0) and not schedule.take("db", 170.0, 60.0)
    assert schedule.take("db", 170.0, float("-inf")), "a forced reap always runs"
    assert not schedule.take("db", 229.0, 60.0), "and counts as the last one"
