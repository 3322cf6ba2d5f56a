"""The pod runner as a subprocess against a fake `rl` (tests/fixtures/primerl/fake_rl.py).

Covers: a job that completes (the environment package really pip-installed, weights, metrics and
logs uploaded, heartbeats, exit report), credentials kept from rl, rl failing, rl hanging
(stall detection), rl never starting (startup timeout), the wall-clock cap, SIGTERM, a tampered
bundle, a failed install, and the pure helpers.
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

from metarl.pod_runner import (
    ExitReport,
    Heartbeat,
    RunnerConfig,
    child_environment,
    decide_stop,
    exit_reason,
    fill_command,
    is_secret_name,
    latest_weights_step,
    numeric_metrics,
    parse_metric_rows,
    row_step,
)
from metarl.primerl.compiler import build_bundle, write_bundle
from metarl.primerl.manifest import EXIT_FILE, MANIFEST_FILE, STATUS_FILE
from metarl.primerl.pin import PRIME_RL_TAG
from schemas.job import JobSpec

REPO = Path(__file__).resolve().parents[2]
FAKE_RL = REPO / "tests" / "fixtures" / "primerl" / "fake_rl.py"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_ACCESS_KEY_ID": "aws-id",
    "RUNPOD_API_KEY": "rp-key",
    "TINKER_API_KEY": "tk-key",
    "HF_TOKEN": "hf-token",
    "METARL_DATABASE_URL": "postgresql://user:pw@db/metarl",
    "MY_PASSWORD": "pw",
    "NCCL_DEBUG": "WARN",
}
ENVIRONMENT = '''
def correctness(prompt, completion, answer):
    return 1.0 if completion.strip() == answer else 0.0


def is_number(prompt, completion, answer):
    return float(completion.strip().isdigit())


COMPONENTS = {"correctness": correctness, "format": is_number}


def reward(prompt, completion, answer):
    return correctness(prompt, completion, answer) + 0.1 * is_number(prompt, completion, answer)
'''


def make_bundle(tmp_path: Path, max_steps: int = 4) -> tuple[str, object]:
    job = JobSpec.model_validate(
        {
            "model": {"name": "Qwen/Qwen3-0.6B"},
            "training": {"max_steps": max_steps, "batch_size": 16, "group_size": 8},
            "reward": {"components": {"correctness": 1.0, "format": 0.1}},
            "dataset": {"size": 3},
        }
    )
    dataset = b"".join(json.dumps({"prompt": f"add {i}+1=", "answer": str(i + 1)}).encode() + b"\n" for i in range(3))
    bundle = build_bundle(job, ENVIRONMENT.encode(), dataset)
    url = (tmp_path / "store" / "jobs" / "job-1").as_uri()
    write_bundle(bundle, url)
    return url, bundle


def runner_config(tmp_path: Path, job_url: str, *, mode: str = "ok", real_install: bool = False, **overrides: object) -> dict:
    work = tmp_path / "work"
    site = tmp_path / "site"
    if real_install:
        install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "--target", str(site), "{package}"]
        pythonpath = str(site)
    else:
        install = [sys.executable, "-c", "import sys; sys.exit(0)", "{package}"]
        pythonpath = str(work / "bundle" / "env")
    config = {
        "job_url": job_url,
        "result_url": str(tmp_path / "store" / "results" / "job-1"),
        "work_dir": str(work),
        "rl_command": [sys.executable, str(FAKE_RL)],
        "install_command": install,
        "heartbeat_interval_s": 0.2,
        "poll_interval_s": 0.05,
        "startup_timeout_s": 20,
        "stall_timeout_s": 20,
        "max_runtime_s": 60,
        "kill_grace_s": 1,
        "extra_env": {"FAKE_RL_MODE": mode, "PYTHONPATH": pythonpath},
    }
    config.update(overrides)
    return config


def start_runner(config: dict, extra_env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, **SECRETS, **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "metarl.pod_runner", "--config-json", json.dumps(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def run_runner(config: dict, timeout: float = 120) -> tuple[int, str]:
    process = start_runner(config)
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output.decode()


def result_dir(config: dict) -> Path:
    return Path(config["result_url"])


def report_of(config: dict) -> ExitReport:
    return ExitReport.model_validate_json((result_dir(config) / EXIT_FILE).read_text())


def test_completed_job_uploads_weights_metrics_logs_and_reports(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", minversion="70.1")  # builds the package's wheel offline (torch pulls in >= 77)
    job_url, bundle = make_bundle(tmp_path, max_steps=4)
    config = runner_config(tmp_path, job_url, real_install=True)
    code, output = run_runner(config)
    assert code == 0, output
    report = report_of(config)
    assert report.succeeded and report.reason == "completed" and report.exit_code == 0
    assert report.steps == 4 and report.max_steps == 4 and report.weights_step == 4
    assert report.training_finished_logged and report.prime_rl_tag == PRIME_RL_TAG
    assert report.env_id == bundle.manifest.env_id
    results = result_dir(config)
    assert (results / "weights" / "step_4" / "config.json").is_file()
    assert (results / "weights" / "step_4" / "model.safetensors").stat().st_size == 64
    assert report.weights_url is not None and report.weights_url.endswith("weights/step_4")
    rows = [json.loads(line) for line in (results / "metrics" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert (results / "metrics" / "run_default" / "metrics.jsonl").is_file()
    assert (results / "logs" / "prime-rl" / "trainer.log").read_text().count("step") == 4
    rl_log = (results / "logs" / "rl.log").read_text()
    # the installed package scored the reference answer with the agent's components: 1.0 + 0.1
    assert "reward of the reference answer 1.1" in rl_log
    status = Heartbeat.model_validate_json((results / STATUS_FILE).read_text())
    assert status.state == "finished" and status.step == 4 and status.metric_rows == 8
    assert status.latest["train/agg/reward/mean"] == pytest.approx(1.1)
    assert "note" not in status.latest
    assert set(report.uploaded) >= {"metrics/metrics.jsonl", "logs/rl.log", "weights/step_4/config.json"}
    assert not list(results.rglob("*.tmp-*"))


def test_rl_sees_no_credentials(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=2)
    config = runner_config(tmp_path, job_url)
    code, output = run_runner(config)
    assert code == 0, output
    names = set(json.loads((tmp_path / "work" / "run" / "outputs" / "env_names.json").read_text()))
    assert not names & {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "RUNPOD_API_KEY", "TINKER_API_KEY", "HF_TOKEN", "METARL_DATABASE_URL", "MY_PASSWORD"}
    assert {"PATH", "NCCL_DEBUG", "FAKE_RL_MODE", "WANDB_MODE"} <= names
    for path in result_dir(config).rglob("*"):
        if path.is_file():
            text = path.read_bytes()
            assert not any(secret.encode() in text for secret in ("aws-secret", "rp-key", "tk-key", "hf-token"))


def test_allowed_secret_name_is_passed(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=1)
    config = runner_config(tmp_path, job_url, passthrough_env=["PATH", "HF_TOKEN"], allow_secret_names=["HF_TOKEN"])
    code, output = run_runner(config)
    assert code == 0, output
    names = set(json.loads((tmp_path / "work" / "run" / "outputs" / "env_names.json").read_text()))
    assert "HF_TOKEN" in names and "AWS_SECRET_ACCESS_KEY" not in names


def test_failing_rl_is_reported_with_its_exit_code_and_log(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, mode="fail")
    code, output = run_runner(config)
    assert code == 1, output
    report = report_of(config)
    assert not report.succeeded and report.reason == "rl_failed" and report.exit_code == 1
    assert report.steps == 2 and report.weights_url is None
    assert "Trainer failed with exit code 1" in report.log_tail
    assert (result_dir(config) / "metrics" / "metrics.jsonl").is_file()


def test_hanging_rl_is_killed_when_metrics_stop(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, mode="hang", stall_timeout_s=1.5)
    started = time.time()
    code, output = run_runner(config)
    assert code == 1, output
    assert time.time() - started < 30
    report = report_of(config)
    assert report.reason == "stalled" and report.steps == 2
    assert report.exit_code is not None and report.exit_code < 0  # killed by a signal
    assert "no new metrics row" in report.message
    assert_no_fake_rl_left(tmp_path)


def test_rl_that_never_reports_hits_the_startup_timeout(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, mode="silent", startup_timeout_s=1.0)
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "startup_timeout" and report.steps is None
    assert_no_fake_rl_left(tmp_path)


def test_wall_clock_cap_stops_a_slow_run(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=50)
    config = runner_config(tmp_path, job_url, mode="slow", max_runtime_s=3.0)
    config["extra_env"]["FAKE_RL_STEP_S"] = "0.2"
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "timeout" and (report.steps is None or report.steps < 50)
    assert "max_runtime_s = 3 s" in report.message


def test_sigterm_stops_rl_and_still_reports(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, mode="hang")
    process = start_runner(config)
    status = result_dir(config) / STATUS_FILE
    deadline = time.time() + 30
    while time.time() < deadline:
        if status.is_file() and Heartbeat.model_validate_json(status.read_text()).step == 2:
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 1
    report = report_of(config)
    assert report.reason == "terminated" and "SIGTERM" in report.message
    assert_no_fake_rl_left(tmp_path)


def test_tampered_bundle_is_refused_before_anything_runs(tmp_path: Path) -> None:
    job_url, bundle = make_bundle(tmp_path)
    rl_toml = Path(job_url.removeprefix("file://")) / "rl.toml"
    rl_toml.write_text(rl_toml.read_text().replace("max_steps = 4", "max_steps = 400"))
    config = runner_config(tmp_path, job_url)
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "bad_bundle" and "rl.toml: sha256 mismatch" in report.message
    assert report.exit_code is None and not (tmp_path / "work" / "run" / "outputs").exists()


def test_bundle_for_another_release_is_refused(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, expected_tag="v0.7.0")
    code, _ = run_runner(config)
    assert code == 1
    assert "compiled for prime-rl v0.8.0, image has v0.7.0" in report_of(config).message


def test_missing_bundle_and_failed_install(tmp_path: Path) -> None:
    config = runner_config(tmp_path, (tmp_path / "nowhere").as_uri())
    assert run_runner(config)[0] == 1
    assert report_of(config).reason == "fetch_failed"

    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, install_command=[sys.executable, "-c", "import sys; print('no wheel'); sys.exit(3)"])
    assert run_runner(config)[0] == 1
    report = report_of(config)
    assert report.reason == "install_failed" and "exited 3" in report.message and "no wheel" in report.message


def test_bad_config_exits_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "metarl.pod_runner", "--config-json", json.dumps({"job_url": "x", "result_url": "y", "heartbeat_interval_s": 0})],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2 and b"heartbeat_interval_s" in done.stderr


def assert_no_fake_rl_left(tmp_path: Path) -> None:
    """No fake rl process of this test is still alive (the runner kills the whole group)."""
    marker = str(FAKE_RL).encode()
    work = str(tmp_path / "work").encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd").encode()
        except OSError:
            continue
        assert not (marker in cmdline and cwd.startswith(work)), f"fake rl {pid} still running"


# ---------------------------------------------------------------------------------------------
# pure helpers


def test_child_environment_keeps_only_allowed_non_secret_names() -> None:
    parent = {"PATH": "/bin", "HOME": "/root", "NCCL_DEBUG": "INFO", "VLLM_API_KEY": "k", "AWS_REGION": "x", "HF_TOKEN": "t", "OTHER": "1"}
    env = child_environment(parent, ["PATH", "HOME", "NCCL_*", "VLLM_*", "AWS_*", "HF_TOKEN"], extra={"A": "b"})
    assert env == {"PATH": "/bin", "HOME": "/root", "NCCL_DEBUG": "INFO", "A": "b", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    assert "HF_TOKEN" in child_environment(parent, ["HF_TOKEN"], allow_secret_names=["HF_TOKEN"])
    assert all(is_secret_name(n) for n in ("RUNPOD_API_KEY", "aws_secret_access_key", "GITHUB_TOKEN", "DB_PASSWORD", "METARL_BROKER_URL"))
    assert not any(is_secret_name(n) for n in ("PATH", "HF_HOME", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"))


def test_metric_rows_wait_for_a_complete_line() -> None:
    text = '{"step": 1, "loss": 0.5}\nnot json\n[1, 2]\n{"step": 2}\n{"step": 3, "lo'
    rows, consumed = parse_metric_rows(text)
    assert [row["step"] for row in rows] == [1, 2]
    assert text.encode()[consumed:] == b'{"step": 3, "lo'
    assert row_step({"step": 3.0}) == 3 and row_step({"step": True}) is None and row_step({"step": float("nan")}) is None
    assert numeric_metrics({"a": 1, "b": "x", "c": float("inf"), "d": True, "e": 2.5}) == {"a": 1.0, "e": 2.5}


def test_stop_decisions() -> None:
    config = RunnerConfig(job_url="a", result_url="b", startup_timeout_s=10, stall_timeout_s=5, max_runtime_s=100)
    assert decide_stop(now=9, started=0, last_progress=None, config=config) is None
    assert decide_stop(now=11, started=0, last_progress=None, config=config) == "startup_timeout"
    assert decide_stop(now=50, started=0, last_progress=46, config=config) is None
    assert decide_stop(now=50, started=0, last_progress=44, config=config) == "stalled"
    assert decide_stop(now=101, started=0, last_progress=100, config=config) == "timeout"
    assert exit_reason(0, True) == "completed" and exit_reason(0, False) == "no_weights" and exit_reason(1, True) == "rl_failed"
    assert fill_command(["uv", "pip", "install", "{package}"], package="/p") == ["uv", "pip", "install", "/p"]


def test_latest_weights_step(tmp_path: Path) -> None:
    assert latest_weights_step(tmp_path / "missing") is None
    for name in ("step_2", "step_10", "step_x", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_99").write_text("a file, not a folder")
    assert latest_weights_step(tmp_path) == 10


def test_no_weights_is_not_success(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=2)
    config = runner_config(tmp_path, job_url, mode="no_weights")
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "no_weights" and report.exit_code == 0 and not report.succeeded


def test_manifest_is_what_the_runner_reads(tmp_path: Path) -> None:
    job_url, bundle = make_bundle(tmp_path)
    stored = json.loads((Path(job_url.removeprefix("file://")) / MANIFEST_FILE).read_text())
    assert stored["env_id"] == bundle.manifest.env_id and stored["prime_rl_tag"] == PRIME_RL_TAG


def test_config_from_environment_and_flags() -> None:
    from metarl.pod_runner import parse_args

    environ = {
        "METARL_RUNNER_JOB_URL": "s3://bucket/jobs/j1",
        "METARL_RUNNER_RESULT_URL": "s3://bucket/results/j1",
        "METARL_RUNNER_RL_COMMAND": '["uv", "run", "rl"]',
        "METARL_RUNNER_EXTRA_ENV": '{"HF_HUB_OFFLINE": "1"}',
        "METARL_RUNNER_HEARTBEAT_INTERVAL_S": "5",
    }
    config = parse_args([], environ)
    assert config.job_url == "s3://bucket/jobs/j1" and config.rl_command == ["uv", "run", "rl"]
    assert config.extra_env == {"HF_HUB_OFFLINE": "1"} and config.heartbeat_interval_s == 5.0
    assert config.install_command[-1] == "{package}" and "--no-build-isolation" in config.install_command
    overridden = parse_args(["--result-url", "/tmp/r", "--work-dir", "/tmp/w"], environ)
    assert overridden.result_url == "/tmp/r" and overridden.work_dir == "/tmp/w"
