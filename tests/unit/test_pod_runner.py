"""The pod runner as a subprocess against a fake `rl` (tests/fixtures/primerl/fake_rl.py, which
behaves as prime-rl v0.8.0 does: weights at ckpt.interval and at the end with STABLE markers, LoRA
dropped from the weights unless saved separately, exit 1 after 10 no-signal batches, exit 1 on
SIGTERM).

Covers: a job that completes (the environment package really pip-installed, weights, metrics and
logs uploaded, heartbeats, exit report), credentials kept from rl, rl failing, rl hanging (stall
detection), rl never starting (startup timeout), the wall-clock cap, SIGTERM, a tampered bundle, a
failed install; weights only at interval steps, a time cap that keeps the newest complete weights,
no-signal jobs, LoRA adapters merged (or their absence refused), the agent's processes swept before
exit.json, the on-pod eval; and the pure helpers.
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

from metarl.backends.runpod.pod.confinement import ProcessInfo, child_environment, is_secret_name, sweep_targets
from metarl.backends.runpod.pod.eval_server import REQUEST_FILE, RESULT_FILE, EvalRequest, EvalResult, items_digest
from metarl.backends.runpod.pod.manifest import EXIT_FILE, MANIFEST_FILE, STATUS_FILE
from metarl.backends.runpod.pod.pin import PRIME_RL_TAG
from metarl.backends.runpod.pod.protocol import ExitReport, Heartbeat
from metarl.backends.runpod.pod.rl_outputs import (
    empty_batches_logged,
    is_lora_job,
    latest_weights_step,
    numeric_metrics,
    parse_metric_rows,
    post_batch_filters_enforce,
    rollout_failures,
    row_step,
)
from metarl.backends.runpod.pod.runner import decide_stop, exit_reason, fill_command
from metarl.backends.runpod.pod.runner_config import RunnerConfig
from tests.fakes.primerl_bundle import DELETE, ENVIRONMENT, job_spec, store_bundle
from tests.fakes.primerl_bundle import make_bundle as compile_test_bundle

REPO = Path(__file__).resolve().parents[2]
FAKE_RL = REPO / "tests" / "fixtures" / "primerl" / "fake_rl.py"
TINY_SCALE = 0.01
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
__all__ = ["ENVIRONMENT"]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-s stand-in (a real Qwen3ForCausalLM) pretrained for a few steps (the cache the other tests share)."""
    from metarl.learning.models import ensure_base_model

    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=TINY_SCALE)


def make_bundle(tmp_path: Path, max_steps: int = 4, rl: dict | None = None, lora_rank: int = 0, max_train_seconds: float | None = None) -> tuple[str, object]:
    bundle = compile_test_bundle(job_spec(max_steps, lora_rank=lora_rank), rl, max_train_seconds=max_train_seconds)
    return store_bundle(tmp_path / "store" / "jobs" / "job-1", bundle), bundle


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
        "kill_grace_s": 15,  # rl exits by itself on SIGTERM (torch makes its exit slow on a busy machine)
        "extra_env": {"FAKE_RL_MODE": mode, "PYTHONPATH": pythonpath},
    }
    config.update(overrides)
    return config


def start_runner(config: dict, extra_env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, **SECRETS, **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "metarl.backends.runpod.pod.runner", "--config-json", json.dumps(config)],
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
    assert (results / "weights" / "step_4" / "STABLE").is_file()
    from safetensors import safe_open

    with safe_open(str(results / "weights" / "step_4" / "model.safetensors"), framework="pt") as weights:
        assert list(weights.keys()) == ["placeholder.weight"]
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


def test_the_installed_package_gives_the_agents_module_metarl_graders(tmp_path: Path) -> None:
    """The local agent's module imports metarl_graders: the package's wheel carries that file, and rl scores with it."""
    pytest.importorskip("setuptools", minversion="70.1")
    from metarl import graders
    from metarl.backends.local.agent import environment_source

    components = {"correctness": 1.0, "format": 0.5}
    bundle = compile_test_bundle(job_spec(2, components=components), environment=environment_source(components, "addition", 8))
    job_url = store_bundle(tmp_path / "store" / "jobs" / "job-1", bundle)
    config = runner_config(tmp_path, job_url, real_install=True)
    code, output = run_runner(config)
    assert code == 0, output
    assert (tmp_path / "site" / bundle.manifest.env_module / "metarl_graders.py").read_bytes() == Path(graders.__file__).read_bytes()
    # the reference answer "1" of "add 0+1=" through the graders: correctness 1.0 + format 0.5
    assert "reward of the reference answer 1.5" in (result_dir(config) / "logs" / "rl.log").read_text()


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
    job_url, _ = make_bundle(tmp_path, rl={"ckpt": {"interval": DELETE, "keep_last": DELETE}})  # a bare [ckpt]: no weights before the last step
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
    assert report.exit_code == 1  # rl exits 1 on SIGTERM (prime-rl v0.8.0 entrypoints/rl.py); the reason is the runner's
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
        [
            sys.executable,
            "-m",
            "metarl.backends.runpod.pod.runner",
            "--config-json",
            json.dumps({"job_url": "x", "result_url": "y", "heartbeat_interval_s": 0}),
        ],
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


def test_latest_weights_step_counts_only_complete_folders(tmp_path: Path) -> None:
    assert latest_weights_step(tmp_path / "missing") is None
    for name in ("step_2", "step_10", "step_12", "step_x", "other"):
        (tmp_path / name).mkdir()
    for name in ("step_2", "step_10", "step_x"):
        (tmp_path / name / "STABLE").touch()
    (tmp_path / "step_99").write_text("a file, not a folder")
    assert latest_weights_step(tmp_path) == 10  # step_12 has no STABLE: still being written


def test_no_weights_is_not_success(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=2, rl={"ckpt": DELETE, "trainer": {"ckpt": DELETE}})  # no [ckpt]: prime-rl writes no weights
    config = runner_config(tmp_path, job_url)
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "no_weights" and report.exit_code == 0 and not report.succeeded


def test_manifest_is_what_the_runner_reads(tmp_path: Path) -> None:
    job_url, bundle = make_bundle(tmp_path)
    stored = json.loads((Path(job_url.removeprefix("file://")) / MANIFEST_FILE).read_text())
    assert stored["env_id"] == bundle.manifest.env_id and stored["prime_rl_tag"] == PRIME_RL_TAG


def test_config_from_environment_and_flags() -> None:
    from metarl.backends.runpod.pod.runner_config import parse_args

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


# ---------------------------------------------------------------------------------------------
# prime-rl v0.8.0 behaviours: checkpoint interval, time cap, no signal, LoRA, the agent's processes


def weight_folders(config: dict) -> list[str]:
    return sorted(p.name for p in (Path(config["work_dir"]) / "run" / "outputs" / "weights").iterdir())


def test_weights_are_written_only_at_the_checkpoint_interval_and_at_the_end(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=5, rl={"ckpt": {"interval": 2, "keep_last": DELETE}})
    config = runner_config(tmp_path, job_url)
    code, output = run_runner(config)
    assert code == 0, output
    assert weight_folders(config) == ["step_2", "step_4", "step_5"]
    assert all((Path(config["work_dir"]) / "run" / "outputs" / "weights" / name / "STABLE").is_file() for name in weight_folders(config))
    assert report_of(config).weights_step == 5

    job_url, _ = make_bundle(tmp_path / "kept", max_steps=5, rl={"ckpt": {"interval": 2, "keep_last": 1}})
    config = runner_config(tmp_path / "kept", job_url)
    assert run_runner(config)[0] == 0
    assert weight_folders(config) == ["step_5"]


def test_a_job_cut_at_its_time_cap_keeps_its_newest_complete_weights(tmp_path: Path) -> None:
    """Item 1: the save of step 4 is still being written when the cap stops rl; step 2 is the newest complete one."""
    job_url, _ = make_bundle(tmp_path, max_steps=200, rl={"ckpt": {"interval": 2}}, max_train_seconds=1.5)
    config = runner_config(tmp_path, job_url, mode="slow", kill_grace_s=20)  # time for rl to exit by itself on SIGTERM
    config["extra_env"].update(FAKE_RL_STEP_S="0.1", FAKE_RL_HANG_SAVE_AT="4")
    code, output = run_runner(config)
    assert code == 0, output
    report = report_of(config)
    assert report.reason == "train_timeout" and report.succeeded and report.exit_code == 1  # rl's own exit 1 after SIGTERM is not a failure
    assert report.weights_step == 2 and report.weights_url.endswith("weights/step_2")
    assert weight_folders(config) == ["step_2", "step_4"] and not (Path(config["work_dir"]) / "run" / "outputs" / "weights" / "step_4" / "STABLE").exists()
    assert sorted(p.name for p in (result_dir(config) / "weights").iterdir()) == ["step_2"]
    assert "max_train_seconds = 1.5 s" in report.message and "weights of step 2 kept" in report.message


def test_without_a_checkpoint_interval_a_job_cut_at_its_time_cap_has_no_weights(tmp_path: Path) -> None:
    """A bare [ckpt] saves only after the last step (prime-rl v0.8.0 trainer/rl/train.py): cut early, nothing to score."""
    job_url, _ = make_bundle(tmp_path, max_steps=200, rl={"ckpt": {"interval": DELETE, "keep_last": DELETE}}, max_train_seconds=1.0)
    config = runner_config(tmp_path, job_url, mode="slow")
    config["extra_env"]["FAKE_RL_STEP_S"] = "0.1"
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "train_timeout" and not report.succeeded and report.weights_url is None


def test_a_job_without_learning_signal_is_an_outcome_not_a_failure(tmp_path: Path) -> None:
    """Item 3: prime-rl's orchestrator aborts after 10 empty batches and rl exits 1; the runner reports no_signal."""
    enforcing = {"ckpt": {"interval": 2, "keep_last": DELETE}, "orchestrator": {"post_batch_filters": DELETE}}  # prime-rl's default filters
    job_url, _ = make_bundle(tmp_path, max_steps=50, rl=enforcing)
    config = runner_config(tmp_path, job_url)
    config["extra_env"]["FAKE_RL_SIGNAL_STEPS"] = "0"
    code, output = run_runner(config)
    assert code == 0, output
    report = report_of(config)
    assert report.reason == "no_signal" and report.succeeded and report.exit_code == 1
    assert report.trained_is_base and report.weights_url is None and report.steps is None
    assert "the trained model is the base" in report.message
    assert "10 consecutive empty train batches" in (result_dir(config) / "logs" / "prime-rl" / "orchestrator.log").read_text()

    # signal for 5 batches, then none: the weights of step 4 (the last interval save) are the result
    job_url, _ = make_bundle(tmp_path / "later", max_steps=50, rl=enforcing)
    config = runner_config(tmp_path / "later", job_url)
    config["extra_env"]["FAKE_RL_SIGNAL_STEPS"] = "5"
    assert run_runner(config)[0] == 0
    report = report_of(config)
    assert report.reason == "no_signal" and report.succeeded and not report.trained_is_base and report.weights_step == 4 and report.steps == 5


def test_a_non_enforcing_zero_advantage_filter_lets_a_no_signal_job_finish(tmp_path: Path) -> None:
    filters = [{"type": "gibberish"}, {"type": "repetition"}, {"type": "zero_advantage", "enforce": False}]
    job_url, _ = make_bundle(tmp_path, max_steps=12, rl={"ckpt": {"interval": 4}, "orchestrator": {"post_batch_filters": filters}})
    config = runner_config(tmp_path, job_url)
    config["extra_env"]["FAKE_RL_SIGNAL_STEPS"] = "0"
    code, output = run_runner(config)
    assert code == 0, output
    report = report_of(config)
    assert report.reason == "completed" and report.weights_step == 12 and report.steps == 12


def test_every_rollout_erroring_fails_the_job_with_the_cause_the_orchestrator_logged(tmp_path: Path) -> None:
    """Item 3: errored rollouts never reach a batch; with the compiled filters (none enforcing) the orchestrator's
    abort after 10 empty batches means every rollout errored: a failure, not a job without learning signal."""
    job_url, bundle = make_bundle(tmp_path, max_steps=50, rl={"ckpt": {"interval": 2, "keep_last": DELETE}})
    assert not post_batch_filters_enforce(bundle.rl_config)
    config = runner_config(tmp_path, job_url)
    config["extra_env"]["FAKE_RL_ERRORED_FROM"] = "3"
    config["extra_env"]["FAKE_RL_ROLLOUT_ERROR"] = "BadRequestError: This model's maximum context length is 512 tokens"
    code, output = run_runner(config)
    assert code == 1, output
    report = report_of(config)
    assert report.reason == "rollouts_errored" and not report.succeeded and report.exit_code == 1
    batch_size = bundle.rl_config["orchestrator"]["batch_size"]
    assert report.message.startswith("every rollout errored") and f"{10 * batch_size} errored rollouts in logs/orchestrator.log" in report.message
    assert report.message.endswith("the last: BadRequestError: This model's maximum context length is 512 tokens"), report.message


def test_errored_rollouts_and_filters_are_read_as_prime_rl_writes_them() -> None:
    log = (
        "\x1b[33m\x1b[1mWARNING\x1b[0m | \x1b[33mRollout failed in group 5f1c (metarl-job) — ValueError: bad prompt\x1b[0m\n"
        "WARNING | Empty trajectory in group 5f1d (metarl-job)\n"
        "WARNING | Rollout failed in group 5f1d (metarl-job) — EmptyTrajectory: Rollout returned with no trajectory steps\n"
        "WARNING | Rollout task failed in group 5f1e (metarl-job): RuntimeError('env server died')\n"
        "WARNING | Step 3: empty train batch (0 of 8 generated rollouts shipped — all errored or filtered out) (consecutive empty batches: 1/10)\n"
    )
    assert rollout_failures(log).model_dump() == {"count": 3, "last": "RuntimeError('env server died')"}
    assert rollout_failures(log.split("WARNING | Rollout task")[0]).last == "EmptyTrajectory: Rollout returned with no trajectory steps"
    assert rollout_failures("Step 3: empty train batch").model_dump() == {"count": 0, "last": None}
    # configs/orchestrator.py: the default post_batch_filters enforce zero_advantage; the compiled ones enforce nothing
    assert post_batch_filters_enforce({}) and post_batch_filters_enforce({"orchestrator": {"post_batch_filters": [{"type": "zero_advantage"}]}})
    assert not post_batch_filters_enforce({"orchestrator": {"post_batch_filters": [{"type": "gibberish"}, {"type": "zero_advantage", "enforce": False}]}})
    assert post_batch_filters_enforce({"orchestrator": {"post_batch_filters": [{"type": "repetition", "enforce": True}]}})


def test_rl_failing_for_another_reason_is_still_rl_failed(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path, rl={"ckpt": {"interval": 1}})
    config = runner_config(tmp_path, job_url, mode="fail")
    assert run_runner(config)[0] == 1
    report = report_of(config)
    assert report.reason == "rl_failed" and not report.succeeded  # its weights are uploaded for inspection, never scored


def lora_rl(separately: bool) -> dict:
    return {"ckpt": {"interval": 2}, "trainer": {"ckpt": {"weights": {"save_adapter_separately": separately}}}}


def test_a_lora_job_uploads_the_trained_model_and_it_scores_differently_from_the_base(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Item 2: prime-rl's weights folder is the base; the runner merges the adapter saved beside it."""
    from safetensors.torch import load_file

    from metarl.backends.runpod.pod.scoring import score_request

    job_url, bundle = make_bundle(tmp_path, max_steps=4, rl=lora_rl(True), lora_rank=8)
    assert bundle.rl_config["trainer"]["model"]["lora"] == {"rank": 8, "alpha": 32.0}
    config = runner_config(tmp_path, job_url, pod_python=[sys.executable])
    config["extra_env"]["FAKE_RL_BASE_MODEL"] = str(tiny_model_dir)
    code, output = run_runner(config)
    assert code == 0, output
    report = report_of(config)
    assert report.succeeded and report.lora_merged and report.weights_step == 4 and "LoRA adapter merged" in report.message
    uploaded = result_dir(config) / "weights" / "step_4"
    saved_by_prime_rl = load_file(str(Path(config["work_dir"]) / "run" / "outputs" / "weights" / "step_4" / "model.safetensors"))
    merged = load_file(str(uploaded / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert saved_by_prime_rl[key].float().allclose(base[key].bfloat16().float()), "prime-rl's own folder holds the untrained base"
    assert not merged[key].float().allclose(saved_by_prime_rl[key].float(), atol=1e-3)
    assert merged["model.embed_tokens.weight"].equal(saved_by_prime_rl["model.embed_tokens.weight"])  # not a LoRA target
    assert (uploaded / "lora_adapters" / "adapter_config.json").is_file() and (uploaded / "metarl_lora_merge.json").is_file()

    from metarl.learning.registry import get_family

    prompts = [example.prompt for example in get_family("addition").hidden_eval(24, 1)]
    request = {"prompts": prompts, "max_tokens": 12, "pass_k": 1, "temperature": 1.0, "seed": 0, "engine": {}}
    trained = score_request(request, str(uploaded), "torch")["completions"]
    untrained = score_request(request, str(tiny_model_dir), "torch")["completions"]
    assert trained != untrained, "the scored checkpoint must be the trained model, not the base"


def test_a_lora_job_without_its_adapter_fails_instead_of_passing_the_base_off(tmp_path: Path, tiny_model_dir: Path) -> None:
    job_url, _ = make_bundle(tmp_path, max_steps=2, rl=lora_rl(False), lora_rank=8)
    config = runner_config(tmp_path, job_url, pod_python=[sys.executable])
    config["extra_env"]["FAKE_RL_BASE_MODEL"] = str(tiny_model_dir)
    code, _ = run_runner(config)
    assert code == 1
    report = report_of(config)
    assert report.reason == "adapter_missing" and not report.succeeded and report.weights_url is None
    assert "save_adapter_separately = true" in report.message
    assert not (result_dir(config) / "weights").exists()


def session_members(session: int) -> list[int]:
    from metarl.backends.runpod.pod.confinement import read_processes

    return [proc.pid for proc in read_processes() if proc.session == session and not proc.zombie]


def test_the_agents_processes_are_gone_before_exit_json(tmp_path: Path) -> None:
    """An env server that leaves rl's process group and ignores SIGTERM is killed before the report (and any eval) happens."""
    job_url, _ = make_bundle(tmp_path, max_steps=3)
    config = runner_config(tmp_path, job_url)
    config["extra_env"]["FAKE_RL_ENV_SERVER"] = "escape"
    process = start_runner(config)
    status = result_dir(config) / STATUS_FILE
    session = None
    deadline = time.time() + 60
    while session is None and time.time() < deadline:
        if status.is_file():
            session = Heartbeat.model_validate_json(status.read_text()).rl_pid
        time.sleep(0.02)
    assert session is not None
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output.decode()
    report = report_of(config)
    assert report.agent_stopped and report.succeeded
    assert session_members(session) == []


def test_the_on_pod_eval_answers_the_request_after_exit_json_and_deletes_the_items(tmp_path: Path, tiny_model_dir: Path) -> None:
    from metarl.learning.registry import get_family

    job_url, _ = make_bundle(tmp_path, max_steps=2, rl={"ckpt": {"interval": 1}})
    config = runner_config(
        tmp_path,
        job_url,
        eval_on_pod=True,
        eval_engine="torch",
        pod_python=[sys.executable],
        eval_poll_s=0.1,
        eval_model_aliases={"Qwen/Qwen3-0.6B": str(tiny_model_dir)},
    )
    config["extra_env"]["FAKE_RL_BASE_MODEL"] = str(tiny_model_dir)
    process = start_runner(config)
    results = result_dir(config)
    deadline = time.time() + 90
    while not (results / EXIT_FILE).is_file() and time.time() < deadline:
        time.sleep(0.05)
    report = report_of(config)
    assert report.succeeded and report.eval_on_pod and report.agent_stopped
    prompts = [example.prompt for example in get_family("addition").hidden_eval(8, 1)]
    request = EvalRequest(
        request_id="job-1:a0",
        targets=["trained", "base"],
        prompts=prompts,
        digest=items_digest(prompts),
        max_tokens=8,
        pass_k=1,
        temperature=1.0,
        seed=0,
        published_at=time.time(),
    )
    (results / "eval").mkdir()
    (results / REQUEST_FILE).write_text(request.model_dump_json())
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0, output.decode()
    result = EvalResult.model_validate_json((results / RESULT_FILE).read_text())
    assert result.error is None and result.request_deleted and result.digest == request.digest
    assert not (results / REQUEST_FILE).exists(), "the hidden prompts stay in storage after scoring"
    assert not (Path(config["work_dir"]) / "eval").exists(), "the pod keeps a copy of the hidden prompts"
    assert set(result.outputs) == {"trained", "base"}
    assert all(len(output.completions) == 8 and all(len(c) == 1 for c in output.completions) for output in result.outputs.values())
    assert result.outputs["base"].model == str(tiny_model_dir) and result.outputs["trained"].model.endswith("weights/step_2")
    assert result.outputs["trained"].prompt_format == "raw"  # the stand-in's tokenizer has no chat template
    assert Heartbeat.model_validate_json((results / STATUS_FILE).read_text()).state == "finished"


def test_no_eval_is_served_for_a_failed_job(tmp_path: Path) -> None:
    job_url, _ = make_bundle(tmp_path)
    config = runner_config(tmp_path, job_url, mode="fail", eval_on_pod=True, eval_wait_s=60)
    started = time.time()
    assert run_runner(config)[0] == 1
    assert time.time() - started < 50 and not report_of(config).eval_on_pod


def test_process_sweep_targets() -> None:
    table = [
        ProcessInfo(pid=1, ppid=0, session=1, uid=1000),
        ProcessInfo(pid=10, ppid=1, session=1, uid=1000),  # the supervisor
        ProcessInfo(pid=20, ppid=10, session=1, uid=1000),  # this runner
        ProcessInfo(pid=30, ppid=20, session=30, uid=1000),  # rl
        ProcessInfo(pid=31, ppid=30, session=30, uid=1000),  # its env server
        ProcessInfo(pid=40, ppid=1, session=40, uid=1000),  # escaped with setsid
        ProcessInfo(pid=41, ppid=1, session=30, uid=1000, zombie=True),
        ProcessInfo(pid=50, ppid=1, session=50, uid=0),  # root's
    ]
    assert sweep_targets(table, "session", session=30, uid=1000, own_pid=20) == [30, 31]
    assert sweep_targets(table, "uid", session=30, uid=1000, own_pid=20) == [30, 31, 40]
    assert exit_reason(1, has_weights=False, empty_batches=True) == "no_signal" and exit_reason(1, True) == "rl_failed"
    assert exit_reason(1, has_weights=True, empty_batches=True, filters_enforce=False) == "rollouts_errored"
    assert empty_batches_logged("RuntimeError: 10 consecutive empty train batches — check filter config")
    assert is_lora_job({"trainer": {"model": {"lora": {"rank": 8}}}}) and not is_lora_job({"trainer": {"model": {}}})
