"""The pod supervisor (the image's main process) as a subprocess, following a real assignment file.

Jobs are real bundles run by the real runner against the fake `rl` of tests/fixtures/primerl.
Covers: a warm pod taking two jobs in turn (each in a fresh work folder, so the second job cannot
upload the first one's weights), termination through the assignment file, a restarted container
not running a reported job again, SIGTERM during a job, the task's training-time cap, and the pure
helpers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metarl.backends.runpod.pod.eval_server import REQUEST_FILE, RESULT_FILE, EvalRequest, EvalResult, items_digest
from metarl.backends.runpod.pod.manifest import EXIT_FILE
from metarl.backends.runpod.pod.protocol import ExitReport, PodAssignment, decode_environ
from metarl.backends.runpod.pod.runner import decide_stop
from metarl.backends.runpod.pod.runner_config import RunnerConfig
from metarl.backends.runpod.pod.supervisor import POD_NAME_ENV, POD_ROOT_ENV, assignment_path, job_config, job_to_run, parse_args, still_this_job
from metarl.backends.runpod.provider import encode_env_value
from tests.fakes.primerl_bundle import job_spec, make_bundle, store_bundle
from tests.unit.test_pod_runner import FAKE_RL, REPO, SECRETS

POD = "metarl-0a1b2c3d-7"


def bundle_url(root: Path, job_name: str, max_steps: int, max_train_seconds: float | None = None, interval: int | None = None) -> str:
    rl = {"ckpt": {"interval": interval}} if interval else {}
    bundle = make_bundle(job_spec(max_steps, components={"correctness": 1.0}), rl, max_train_seconds=max_train_seconds)
    return store_bundle(root / "jobs" / job_name / "bundle", bundle)


def assign(root: Path, seq: int, job_name: str | None, job_url: str | None = None, terminated: bool = False, eval_on_pod: bool = False) -> Path:
    result = root / "jobs" / job_name / "a0" if job_name else None
    assignment = PodAssignment(
        pod_name=POD, seq=seq, job_name=job_name, job_url=job_url, result_url=str(result) if result else None, terminated=terminated, eval_on_pod=eval_on_pod
    )
    path = root / assignment_path(POD)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(assignment.model_dump_json())
    path.with_suffix(".tmp").replace(path)
    return result or root


def runner_settings(tmp_path: Path, **extra_env: str) -> dict:
    return {
        "work_dir": str(tmp_path / "work"),
        "rl_command": [sys.executable, str(FAKE_RL)],
        "install_command": [sys.executable, "-c", "import sys; sys.exit(0)", "{package}"],
        "heartbeat_interval_s": 0.2,
        "poll_interval_s": 0.05,
        "startup_timeout_s": 20,
        "stall_timeout_s": 20,
        "max_runtime_s": 60,
        "kill_grace_s": 15,
        "extra_env": dict(extra_env),
    }


def start_supervisor(root: Path, settings: dict, *extra: str) -> subprocess.Popen:
    env = {**os.environ, **SECRETS, POD_ROOT_ENV: str(root), POD_NAME_ENV: POD}
    argv = [sys.executable, "-m", "metarl.backends.runpod.pod.supervisor", "--assignment-poll-s", "0.1", "--runner-config-json", json.dumps(settings), *extra]
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for_report(result: Path, timeout: float = 60) -> ExitReport:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (result / EXIT_FILE).is_file():
            return ExitReport.model_validate_json((result / EXIT_FILE).read_text())
        time.sleep(0.1)
    raise AssertionError(f"no {EXIT_FILE} in {result} within {timeout} s")


def finish(process: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError("the supervisor did not exit:\n" + output.decode()) from None
    return process.returncode, output.decode()


@pytest.fixture
def settings_with_package_path(tmp_path: Path):
    """Runner settings whose PYTHONPATH reaches each job's unpacked package (job-<seq>/bundle/env)."""

    def make(seq_paths: list[int], **extra_env: str) -> dict:
        settings = runner_settings(tmp_path, **extra_env)
        settings["extra_env"]["PYTHONPATH"] = os.pathsep.join(str(tmp_path / "work" / f"job-{seq}" / "bundle" / "env") for seq in seq_paths)
        return settings

    return make


def test_a_warm_pod_runs_job_after_job_then_exits_when_terminated(tmp_path: Path, settings_with_package_path) -> None:
    root = tmp_path / "store"
    first = assign(root, 1, "job-a", bundle_url(root, "job-a", max_steps=5))
    process = start_supervisor(root, settings_with_package_path([1, 2]))
    try:
        report_a = wait_for_report(first)
        assert report_a.succeeded and report_a.weights_step == 5
        second = assign(root, 2, "job-b", bundle_url(root, "job-b", max_steps=3))
        report_b = wait_for_report(second)
        # a fresh work folder: job b uploads its own step-3 weights, not job a's step-5 ones
        assert report_b.succeeded and report_b.weights_step == 3 and report_b.steps == 3
        assert sorted(p.name for p in (second / "weights").iterdir()) == ["step_3"]
        assert not (tmp_path / "work" / "job-1").exists()
        assign(root, 3, None, terminated=True)
        code, output = finish(process)
    finally:
        process.kill()
    assert code == 0, output
    assert "job job-a (seq 1) completed" in output and "job job-b (seq 2) completed" in output and "terminated; exiting" in output
    for secret in SECRETS.values():
        assert secret not in output


def test_a_restarted_container_does_not_run_a_reported_job_again(tmp_path: Path, settings_with_package_path) -> None:
    root = tmp_path / "store"
    result = assign(root, 4, "job-a", bundle_url(root, "job-a", max_steps=2))
    code, output = finish(start_supervisor(root, settings_with_package_path([4]), "--max-idle-s", "1.5"))
    assert code == 0 and "completed" in output, output
    written = (result / EXIT_FILE).stat().st_mtime_ns
    code, output = finish(start_supervisor(root, settings_with_package_path([4]), "--max-idle-s", "1.5"))
    assert code == 0 and "already has exit.json; not run again" in output, output
    assert (result / EXIT_FILE).stat().st_mtime_ns == written


def test_sigterm_stops_the_running_job_and_the_supervisor(tmp_path: Path, settings_with_package_path) -> None:
    root = tmp_path / "store"
    result = assign(root, 1, "job-a", bundle_url(root, "job-a", max_steps=4))
    process = start_supervisor(root, settings_with_package_path([1], FAKE_RL_MODE="hang"))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (result / "status.json").is_file():
            time.sleep(0.1)
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        code, output = finish(process)
    finally:
        process.kill()
    assert code == 0, output
    report = ExitReport.model_validate_json((result / EXIT_FILE).read_text())
    assert report.reason == "terminated" and not report.succeeded


def test_training_is_cut_at_the_tasks_max_train_seconds_and_keeps_its_weights(tmp_path: Path, settings_with_package_path) -> None:
    root = tmp_path / "store"
    result = assign(root, 1, "job-a", bundle_url(root, "job-a", max_steps=200, max_train_seconds=1.5, interval=2))
    settings = settings_with_package_path([1], FAKE_RL_MODE="slow", FAKE_RL_STEP_S="0.1")
    code, output = finish(start_supervisor(root, settings, "--max-idle-s", "1.0"), timeout=60)
    assert code == 0, output
    report = ExitReport.model_validate_json((result / EXIT_FILE).read_text())
    assert report.reason == "train_timeout" and report.succeeded, report
    assert report.weights_step is not None and 2 <= report.weights_step < 200 and report.weights_step % 2 == 0  # an interval save
    assert "max_train_seconds = 1.5 s" in report.message


def test_bad_supervisor_configuration_exits_2(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in (POD_ROOT_ENV, POD_NAME_ENV)}
    done = subprocess.run([sys.executable, "-m", "metarl.backends.runpod.pod.supervisor"], cwd=REPO, env=env, capture_output=True, timeout=60)
    assert done.returncode == 2 and b"pod_root" in done.stderr
    bad_runner = json.dumps({"max_runtime_s": -1})
    done = subprocess.run(
        [sys.executable, "-m", "metarl.backends.runpod.pod.supervisor", "--pod-root", str(tmp_path), "--pod-name", POD, "--runner-config-json", bad_runner],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2 and b"max_runtime_s" in done.stderr


# --- pure helpers ---------------------------------------------------------------------------------


def test_job_to_run_takes_only_new_complete_assignments() -> None:
    job = PodAssignment(pod_name=POD, seq=3, job_name="j", job_url="file:///b", result_url="/r")
    assert job_to_run(job, done_seq=2) == job
    assert job_to_run(job, done_seq=3) is None
    assert job_to_run(None, done_seq=0) is None
    assert job_to_run(PodAssignment(pod_name=POD, seq=4), done_seq=3) is None  # idle
    assert job_to_run(job.model_copy(update={"terminated": True}), done_seq=0) is None
    assert job_to_run(job.model_copy(update={"result_url": None}), done_seq=0) is None


def test_job_config_gives_each_job_its_own_work_folder_and_urls(tmp_path: Path) -> None:
    job = PodAssignment(pod_name=POD, seq=7, job_name="j", job_url="s3://b/jobs/j/bundle", result_url="s3://b/jobs/j/a0")
    config = job_config({"heartbeat_interval_s": 5.0}, job, tmp_path)
    assert isinstance(config, RunnerConfig)
    assert (config.job_url, config.result_url, config.work_dir) == ("s3://b/jobs/j/bundle", "s3://b/jobs/j/a0", str(tmp_path / "job-7"))
    assert config.heartbeat_interval_s == 5.0 and not config.eval_on_pod
    assert job_config({}, job.model_copy(update={"eval_on_pod": True}), tmp_path).eval_on_pod
    assert still_this_job(job, 7) and still_this_job(None, 7)
    assert not still_this_job(job.model_copy(update={"seq": 8, "job_name": None}), 7) and not still_this_job(job.model_copy(update={"terminated": True}), 7)


def test_settings_come_from_the_launchers_environment() -> None:
    root = "/data/artifact store/runpod"
    environ = {POD_ROOT_ENV: encode_env_value(root), POD_NAME_ENV: POD, "METARL_RUNNER_HEARTBEAT_INTERVAL_S": "7"}
    assert environ[POD_ROOT_ENV].startswith("b64:")
    config, runner = parse_args([], environ)
    assert config.pod_root == root and config.pod_name == POD
    assert runner == {"heartbeat_interval_s": "7"}


def test_training_time_cap_counts_from_the_first_metrics_row() -> None:
    config = RunnerConfig(job_url="a", result_url="b", startup_timeout_s=100, stall_timeout_s=50, max_runtime_s=1000)
    # 90 s of model loading, then 20 s of training under a 30 s cap: keep going
    assert decide_stop(now=110, started=0, last_progress=109, config=config, first_progress=90, max_train_seconds=30) is None
    assert decide_stop(now=121, started=0, last_progress=120, config=config, first_progress=90, max_train_seconds=30) == "train_timeout"
    assert decide_stop(now=121, started=0, last_progress=120, config=config, first_progress=90, max_train_seconds=None) is None


def test_encoded_launcher_values_are_decoded_for_storage_clients() -> None:
    secret = "a secret with spaces/and+symbols"
    environ = {"AWS_SECRET_ACCESS_KEY": encode_env_value(secret), "PATH": "/usr/bin"}
    assert environ["AWS_SECRET_ACCESS_KEY"] != secret
    decode_environ(environ)
    assert environ == {"AWS_SECRET_ACCESS_KEY": secret, "PATH": "/usr/bin"}


# --- the on-pod eval ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from metarl.learning.models import ensure_base_model

    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=0.01)


def eval_settings(settings: dict, tiny_model: Path) -> dict:
    settings.update(eval_engine="torch", pod_python=[sys.executable], eval_poll_s=0.1, eval_model_aliases={"Qwen/Qwen3-0.6B": str(tiny_model)})
    settings["extra_env"]["FAKE_RL_BASE_MODEL"] = str(tiny_model)
    return settings


def publish(result: Path, targets: list[str]) -> EvalRequest:
    from metarl.learning.registry import get_family

    prompts = [example.prompt for example in get_family("addition").hidden_eval(4, 1)]
    request = EvalRequest(
        request_id="job:a0",
        targets=targets,
        prompts=prompts,
        digest=items_digest(prompts),
        max_tokens=6,
        pass_k=1,
        temperature=1.0,
        seed=0,
        published_at=time.time(),
    )
    (result / "eval").mkdir(exist_ok=True)
    (result / REQUEST_FILE).write_text(request.model_dump_json())
    return request


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not path.is_file():
        time.sleep(0.1)
    assert path.is_file(), f"no {path} within {timeout} s"


def test_a_job_with_on_pod_eval_serves_its_request_then_leaves_when_the_pod_moves_on(tmp_path: Path, settings_with_package_path, tiny_model: Path) -> None:
    root = tmp_path / "store"
    first = assign(root, 1, "job-a", bundle_url(root, "job-a", max_steps=2, interval=1), eval_on_pod=True)
    process = start_supervisor(root, eval_settings(settings_with_package_path([1, 3]), tiny_model))
    try:
        report = wait_for_report(first)
        assert report.eval_on_pod and report.succeeded
        request = publish(first, ["trained"])
        wait_for(first / RESULT_FILE)
        result = EvalResult.model_validate_json((first / RESULT_FILE).read_text())
        assert result.error is None and result.digest == request.digest and list(result.outputs) == ["trained"]
        assert not (first / REQUEST_FILE).exists()
        assign(root, 2, None)  # the backend released the pod to the warm pool
        second = assign(root, 3, "job-b", bundle_url(root, "job-b", max_steps=2, interval=1), eval_on_pod=True)
        assert wait_for_report(second).eval_on_pod
        assign(root, 4, None)  # moved on without publishing a request (e.g. the base score was cached and the trained is the base)
        time.sleep(1.0)
        assign(root, 5, None, terminated=True)
        code, output = finish(process, timeout=30)
    finally:
        process.kill()
    assert code == 0, output
    assert "no eval request came" in output and not (second / RESULT_FILE).exists()


def test_a_restarted_pod_serves_the_eval_its_job_still_owes_from_the_uploaded_weights(tmp_path: Path, settings_with_package_path, tiny_model: Path) -> None:
    root = tmp_path / "store"
    result = assign(root, 1, "job-a", bundle_url(root, "job-a", max_steps=2, interval=1), eval_on_pod=True)
    settings = eval_settings(settings_with_package_path([1]), tiny_model)
    process = start_supervisor(root, settings)
    try:
        wait_for_report(result)
    finally:
        process.kill()  # the container dies while waiting for the request
        process.communicate()
    import shutil

    shutil.rmtree(tmp_path / "work")  # with its local files
    restarted = start_supervisor(root, settings)
    try:
        publish(result, ["trained", "base"])
        wait_for(result / RESULT_FILE)
        assign(root, 2, None, terminated=True)
        code, output = finish(restarted)
    finally:
        restarted.kill()
    assert code == 0, output
    served = EvalResult.model_validate_json((result / RESULT_FILE).read_text())
    assert served.error is None and set(served.outputs) == {"trained", "base"}
    assert served.outputs["trained"].model.endswith("eval-weights") and "eval served after a restart" in output
