"""The inner-job runner that runs inside the prime-rl pod image (``docker/inner.Dockerfile``).

Lifecycle (one job per process): **setup** (read the config, fetch the job bundle from artifact
storage and check it against its manifest), **start** (install the environment package into
prime-rl's environment, start ``rl @ rl.toml`` in its own process group with a clean
environment), **main loop** (every ``heartbeat_interval_s``: parse the new rows of the run's
``metrics.jsonl`` files and write a heartbeat to ``status.json``; stop the run when it exits,
stalls, never starts producing metrics, or outlives ``max_runtime_s``), **stop** (upload the
final weights, the metrics and the logs, then write ``exit.json``: an :class:`ExitReport`).

Storage is any fsspec URL (``file://`` or a plain path in tests, ``s3://...`` on pods). The
``rl`` process (which runs the agent's reward code) gets only the environment variables listed
in ``passthrough_env`` and never a name that looks like a credential, so the storage keys the
runner itself uses do not reach it. Only pydantic, fsspec and the stdlib are imported: the pod
image installs nothing else for the runner.

Usage: ``python -m metarl.pod_runner --job-url URL --result-url URL`` (or the same settings in
``METARL_RUNNER_*`` environment variables; ``--config-json`` takes the whole config). Exit code
0: the job succeeded; 1: it failed (the report says why); 2: the runner could not run at all.
"""

from __future__ import annotations

import argparse
import base64
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metarl.primerl.manifest import (
    EXIT_FILE,
    LOGS_DIR,
    MANIFEST_FILE,
    METRICS_DIR,
    PACKAGE_DIR,
    RL_TOML_FILE,
    STATUS_FILE,
    WEIGHTS_DIR,
    BundleManifest,
)
from metarl.primerl.pin import PRIME_RL_TAG, PRIME_RL_VENV_PYTHON

DEFAULT_PASSTHROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TZ",
    "TERM",
    "TMPDIR",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "UCX_HOME",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_HUB_ETAG_TIMEOUT",
    "HF_HUB_DOWNLOAD_TIMEOUT",
    "UV_CACHE_DIR",
    "UV_PYTHON_PREFERENCE",
    "PRIME_LOG_LEVEL",
    "PRIME_VF_LOG_LEVEL",
    "NCCL_*",
    "VLLM_*",
    "TORCH_*",
    "TRITON_*",
)
"""What ``rl`` may see of the pod's environment: system paths, GPU and cache settings."""

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|SESSION)", re.IGNORECASE)
SECRET_PREFIXES = ("AWS_", "RUNPOD_", "TINKER_", "METARL_", "GOOGLE_", "AZURE_", "WANDB_", "OPENAI_", "ANTHROPIC_")
"""Names never passed to ``rl`` unless listed in ``allow_secret_names``."""

FIXED_CHILD_ENV = {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
TRAINING_FINISHED = "Training finished!"
LOG_TAIL_CHARS = 4000
LATEST_METRICS_MAX = 32

Reason = Literal[
    "completed",
    "rl_failed",
    "no_weights",
    "stalled",
    "startup_timeout",
    "timeout",
    "train_timeout",
    "terminated",
    "install_failed",
    "fetch_failed",
    "bad_bundle",
]


SUCCESS_REASONS = ("completed", "train_timeout")
"""Ends whose newest uploaded weights are the job's result (a job cut at the task's training time
keeps what it trained, as the local backend's time budget does)."""


State = Literal["fetching", "installing", "running", "uploading", "finished"]


class RunnerConfig(BaseModel):
    """Settings of one runner process (from the command line or ``METARL_RUNNER_*`` variables)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_url: str = Field(min_length=1, max_length=2000, description="Folder holding the job bundle (fsspec URL or path)")
    result_url: str = Field(min_length=1, max_length=2000, description="Folder for status.json, exit.json, metrics, logs, weights")
    work_dir: str = Field(default="/tmp/metarl-job", min_length=1, max_length=1000, description="Local scratch folder")
    rl_command: list[str] = Field(default_factory=lambda: ["rl"], min_length=1, max_length=32, description="Command before `@ rl.toml`")
    install_command: list[str] = Field(
        default_factory=lambda: ["uv", "pip", "install", "--python", PRIME_RL_VENV_PYTHON, "--no-deps", "--no-build-isolation", "{package}"],
        min_length=1,
        max_length=32,
        description="Installs the environment package into prime-rl's venv (setuptools from the image); {package} is its folder",
    )
    expected_tag: str = Field(default=PRIME_RL_TAG, min_length=2, max_length=40, description="prime-rl tag of this image")
    heartbeat_interval_s: float = Field(default=30.0, gt=0, le=3600, description="Seconds between heartbeats")
    poll_interval_s: float = Field(default=1.0, gt=0, le=60, description="Seconds between checks of the rl process")
    startup_timeout_s: float = Field(default=1800.0, gt=0, le=86_400, description="Longest wait for the first metrics row")
    stall_timeout_s: float = Field(default=900.0, gt=0, le=86_400, description="Longest wait between metrics rows once they flow")
    max_runtime_s: float = Field(default=4 * 3600.0, gt=0, le=7 * 86_400, description="Wall-clock cap of the rl process")
    install_timeout_s: float = Field(default=600.0, gt=0, le=7200, description="Cap on the install command")
    kill_grace_s: float = Field(default=20.0, ge=0, le=600, description="SIGTERM to SIGKILL delay when stopping rl")
    passthrough_env: list[str] = Field(default_factory=lambda: list(DEFAULT_PASSTHROUGH), max_length=200, description="Names (or globs) rl may see")
    allow_secret_names: list[str] = Field(default_factory=list, max_length=20, description="Credential-like names rl may still see (e.g. HF_TOKEN)")
    extra_env: dict[str, str] = Field(default_factory=dict, max_length=50, description="Variables set for rl and the install")
    metrics_files: list[str] = Field(
        default_factory=lambda: ["metrics.jsonl", "run_default/metrics.jsonl"],
        min_length=1,
        max_length=8,
        description="metrics.jsonl files under output_dir; the first is the trainer's (steps)",
    )


class Heartbeat(BaseModel):
    """``status.json``: the runner's latest word on the job, rewritten every heartbeat."""

    model_config = ConfigDict(extra="forbid")

    state: State = Field(description="Lifecycle phase")
    sequence: int = Field(ge=0, description="Heartbeat counter (grows by one per write)")
    prime_rl_tag: str = Field(description="prime-rl tag of the image")
    env_id: str | None = Field(default=None, max_length=100, description="Environment id of the bundle")
    started_at: float = Field(ge=0, description="Unix time the runner started")
    updated_at: float = Field(ge=0, description="Unix time of this heartbeat")
    rl_pid: int | None = Field(default=None, ge=1, description="pid of the rl process while it runs")
    step: int | None = Field(default=None, ge=0, description="Highest trainer step in metrics.jsonl")
    max_steps: int | None = Field(default=None, ge=1, description="Steps the job runs")
    metric_rows: int = Field(default=0, ge=0, description="metrics.jsonl rows seen, all files")
    last_progress_at: float | None = Field(default=None, ge=0, description="Unix time a new metrics row was last seen")
    latest: dict[str, float] = Field(default_factory=dict, max_length=LATEST_METRICS_MAX, description="Numbers of the newest rows")
    message: str = Field(default="", max_length=1000, description="What the runner is doing")


class ExitReport(BaseModel):
    """``exit.json``: how the job ended, written once at the end."""

    model_config = ConfigDict(extra="forbid")

    succeeded: bool = Field(description="True only when rl exited 0 and weights were uploaded")
    reason: Reason = Field(description="Why the job ended")
    exit_code: int | None = Field(default=None, description="rl's exit code (negative: killed by that signal); None if it never ran")
    steps: int | None = Field(default=None, ge=0, description="Highest trainer step seen in metrics.jsonl")
    max_steps: int | None = Field(default=None, ge=1, description="Steps the job was to run")
    weights_step: int | None = Field(default=None, ge=0, description="Step of the uploaded weights folder")
    weights_url: str | None = Field(default=None, max_length=2100, description="Where the Hugging Face weights were uploaded")
    training_finished_logged: bool = Field(default=False, description=f"rl printed {TRAINING_FINISHED!r}")
    prime_rl_tag: str = Field(description="prime-rl tag of the image")
    env_id: str | None = Field(default=None, max_length=100, description="Environment id of the bundle")
    started_at: float = Field(ge=0, description="Unix time the runner started")
    finished_at: float = Field(ge=0, description="Unix time the report was written")
    duration_s: float = Field(ge=0, description="Runner wall-clock seconds")
    uploaded: list[str] = Field(default_factory=list, max_length=100_000, description="Result files uploaded (relative paths)")
    message: str = Field(default="", max_length=2000, description="One-line explanation")
    log_tail: str = Field(default="", max_length=LOG_TAIL_CHARS, description="End of rl's output")


class PodAssignment(BaseModel):
    """``pods/<name>/assignment.json``: the job a pod runs now; ``job_name`` None means the pod is idle.

    Written by the train backend (``metarl.backends.runpod_train``), followed by the pod's
    supervisor (``metarl.pod_supervisor``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    pod_name: str = Field(min_length=1, max_length=191, description="Pod name")
    seq: int = Field(ge=0, description="Bumped on every change; the supervisor starts a job when it sees a new seq")
    job_name: str | None = Field(default=None, max_length=191, description="Job to run (None: idle)")
    job_url: str | None = Field(default=None, max_length=4096, description="The job bundle (the runner's job_url)")
    result_url: str | None = Field(default=None, max_length=4096, description="Folder of the job attempt (the runner's result_url)")
    assigned_at: float | None = Field(default=None, description="Wall time of the assignment")
    released_at: float | None = Field(default=None, description="Wall time the pod went idle")
    billed_chunks: int = Field(default=0, ge=0, description="Billing intervals of this pod already charged when it went idle")
    terminated: bool = Field(default=False, description="The pod was settled and terminated (or is being)")


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    """True for a variable name that looks like a credential or one of our own settings."""
    upper = name.upper()
    return bool(SECRET_NAME.search(upper)) or upper.startswith(SECRET_PREFIXES)


def child_environment(
    parent: Mapping[str, str], passthrough: Iterable[str], allow_secret_names: Iterable[str] = (), extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment rl runs with: allowed names of ``parent``, no credentials, plus fixed and extra values."""
    patterns = list(passthrough)
    allowed_secrets = set(allow_secret_names)
    env = {
        name: value
        for name, value in parent.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns) and (name in allowed_secrets or not is_secret_name(name))
    }
    env.update(FIXED_CHILD_ENV)
    env.update(extra or {})
    return env


def parse_metric_rows(text: str) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON-object rows of a metrics.jsonl chunk and how many bytes they used (a torn last line waits)."""
    rows: list[dict[str, Any]] = []
    consumed = 0
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        consumed += len(line.encode("utf-8"))
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, consumed


def row_step(row: Mapping[str, Any]) -> int | None:
    """The integer ``step`` of a metrics row, if it has one."""
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != step or step < 0:
        return None
    return int(step)


def numeric_metrics(row: Mapping[str, Any], limit: int = LATEST_METRICS_MAX) -> dict[str, float]:
    """Up to ``limit`` finite numbers of a row (rewards, losses, progress), for heartbeats."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if len(out) >= limit:
            break
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf"):
            out[str(key)[:120]] = float(value)
    return out


def latest_weights_step(weights_dir: Path) -> int | None:
    """Highest N of the ``step_N`` folders prime-rl writes under ``<output_dir>/weights``."""
    steps = []
    if weights_dir.is_dir():
        for child in weights_dir.iterdir():
            match = re.fullmatch(r"step_(\d+)", child.name)
            if match and child.is_dir():
                steps.append(int(match.group(1)))
    return max(steps) if steps else None


def decide_stop(
    now: float,
    started: float,
    last_progress: float | None,
    config: RunnerConfig,
    first_progress: float | None = None,
    max_train_seconds: float | None = None,
) -> Reason | None:
    """Whether the running rl must be stopped: over the wall-clock cap, over the task's training
    time (counted from the first metrics row, so image pull and model load are not training), never
    started, or stalled."""
    if now - started > config.max_runtime_s:
        return "timeout"
    if max_train_seconds is not None and first_progress is not None and now - first_progress > max_train_seconds:
        return "train_timeout"
    if last_progress is None:
        return "startup_timeout" if now - started > config.startup_timeout_s else None
    return "stalled" if now - last_progress > config.stall_timeout_s else None


def exit_reason(exit_code: int, has_weights: bool) -> Reason:
    """Reason for an rl process that exited by itself."""
    if exit_code != 0:
        return "rl_failed"
    return "completed" if has_weights else "no_weights"


def fill_command(command: list[str], **values: str) -> list[str]:
    """A command with ``{name}`` placeholders filled in."""
    out = []
    for part in command:
        for name, value in values.items():
            part = part.replace("{" + name + "}", value)
        out.append(part)
    return out


def tail_text(path: Path, limit: int = LOG_TAIL_CHARS) -> str:
    """The last ``limit`` characters of a text file ('' when it is missing)."""
    if not path.is_file():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 4 * limit))
        text = handle.read().decode("utf-8", errors="replace")
    return text[-limit:]


# ---------------------------------------------------------------------------------------------
# Metrics following
# ---------------------------------------------------------------------------------------------


class MetricsFollower:
    """Reads the new complete rows of the run's metrics.jsonl files since the last call."""

    def __init__(self, output_dir: Path, files: list[str]):
        self.paths = [output_dir / name for name in files]
        self.offsets = [0 for _ in self.paths]
        self.rows = 0
        self.step: int | None = None
        self.latest: dict[str, float] = {}

    def poll(self) -> int:
        """Read what was appended; returns how many new rows there were."""
        new = 0
        for index, path in enumerate(self.paths):
            if not path.is_file():
                continue
            with path.open("rb") as handle:
                handle.seek(self.offsets[index])
                chunk = handle.read()
            rows, consumed = parse_metric_rows(chunk.decode("utf-8", errors="replace"))
            self.offsets[index] += consumed
            new += len(rows)
            for row in rows:
                if index == 0:
                    step = row_step(row)
                    if step is not None:
                        self.step = step if self.step is None else max(self.step, step)
                self.latest.update(numeric_metrics(row))
        while len(self.latest) > LATEST_METRICS_MAX:
            self.latest.pop(next(iter(self.latest)))
        self.rows += new
        return new


# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------


class Storage:
    """A folder in artifact storage (fsspec), addressed by relative paths."""

    def __init__(self, url: str):
        import fsspec

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(url)
        self.root = root.rstrip("/")

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def url_of(self, relative: str) -> str:
        return f"{self.url}/{relative}"

    def read_bytes(self, relative: str) -> bytes:
        return self.fs.cat_file(self.path(relative))

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Write one file; written to a temporary name first and moved, so readers never see half a file."""
        target = self.path(relative)
        self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        temporary = f"{target}.tmp-{os.getpid()}"
        self.fs.pipe_file(temporary, data)
        self.fs.mv(temporary, target)

    def upload_tree(self, local: Path, relative: str) -> list[str]:
        """Upload every file under ``local`` to ``relative``/...; returns the uploaded relative paths."""
        uploaded = []
        if not local.is_dir():
            return uploaded
        for path in sorted(p for p in local.rglob("*") if p.is_file() and not p.is_symlink()):
            name = f"{relative}/{path.relative_to(local).as_posix()}"
            target = self.path(name)
            self.fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            self.fs.put_file(str(path), target)
            uploaded.append(name)
        return uploaded


class RunnerError(Exception):
    """A job-ending failure before rl runs (fetch, bundle or install), with its report reason."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---------------------------------------------------------------------------------------------
# The runner
# ---------------------------------------------------------------------------------------------


class PodRunner:
    """One job: setup, start, main loop, stop (see the module docstring)."""

    def __init__(self, config: RunnerConfig, environ: Mapping[str, str] | None = None):
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        self.work = Path(config.work_dir).resolve()
        self.bundle_dir = self.work / "bundle"
        self.run_dir = self.work / "run"
        self.log_path = self.work / "rl.log"
        self.results = Storage(config.result_url)
        self.started = time.time()
        self.sequence = 0
        self.manifest: BundleManifest | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.rl_started = 0.0
        self.follower: MetricsFollower | None = None
        self.last_progress: float | None = None
        self.first_progress: float | None = None
        self.stop_requested: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def run(self) -> ExitReport:
        """Run the job to the end and write its exit report; never raises for a job failure."""
        exit_code: int | None = None
        try:
            self.setup()
            self.start()
            reason, exit_code = self.main_loop()
            message = self.reason_message(reason, exit_code)
        except RunnerError as err:
            reason, message = err.reason, err.message
        return self.stop(reason, exit_code, message)

    def setup(self) -> None:
        """Fetch the bundle, check it against its manifest and the image's prime-rl tag."""
        self.heartbeat("fetching", "fetching the job bundle")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            source = Storage(self.config.job_url)
            manifest = BundleManifest.model_validate_json(source.read_bytes(MANIFEST_FILE))
            files = {relative: source.read_bytes(relative) for relative in manifest.files}
        except FileNotFoundError as err:
            raise RunnerError("fetch_failed", f"bundle file not found: {err}") from None
        except ValidationError as err:
            raise RunnerError("bad_bundle", f"{MANIFEST_FILE} is invalid: {err.errors(include_url=False)[0]['msg']}") from None
        except OSError as err:
            raise RunnerError("fetch_failed", f"cannot read the bundle: {err}") from None
        problems = manifest.file_problems(files)
        if problems:
            raise RunnerError("bad_bundle", "bundle does not match its manifest: " + "; ".join(problems[:5]))
        if manifest.prime_rl_tag != self.config.expected_tag:
            raise RunnerError("bad_bundle", f"bundle compiled for prime-rl {manifest.prime_rl_tag}, image has {self.config.expected_tag}")
        for relative, data in files.items():
            target = self.bundle_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        self.manifest = manifest

    def start(self) -> None:
        """Install the environment package, then start rl in its own process group."""
        assert self.manifest is not None
        self.heartbeat("installing", f"installing {self.manifest.env_id}")
        env = child_environment(self.environ, self.config.passthrough_env, self.config.allow_secret_names, self.config.extra_env)
        install = fill_command(self.config.install_command, package=str(self.bundle_dir / PACKAGE_DIR))
        try:
            done = subprocess.run(install, env=env, cwd=self.run_dir, capture_output=True, timeout=self.config.install_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RunnerError("install_failed", f"install command timed out after {self.config.install_timeout_s:g} s") from None
        except OSError as err:
            raise RunnerError("install_failed", f"install command could not start: {err}") from None
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode("utf-8", errors="replace")[-800:]
            raise RunnerError("install_failed", f"install command exited {done.returncode}: {output}")
        command = [*self.config.rl_command, "@", str(self.bundle_dir / RL_TOML_FILE)]
        with self.log_path.open("ab") as log:
            try:
                self.process = subprocess.Popen(
                    command, cwd=self.run_dir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as err:
                raise RunnerError("install_failed", f"rl command could not start: {err}") from None
        self.rl_started = time.time()
        self.follower = MetricsFollower(self.run_dir / self.manifest.output_dir, self.config.metrics_files)
        self.heartbeat("running", "rl started")

    def main_loop(self) -> tuple[Reason, int | None]:
        """Heartbeat and watch rl until it exits or must be stopped; returns (reason, exit code)."""
        assert self.process is not None and self.follower is not None
        next_beat = time.time() + self.config.heartbeat_interval_s
        while True:
            code = self.process.poll()
            now = time.time()
            if self.follower.poll():
                self.last_progress = now
                self.first_progress = self.first_progress or now
            if code is not None:
                return exit_reason(code, self.weights_step() is not None), code
            cap = self.manifest.max_train_seconds if self.manifest else None
            reason: Reason | None = (
                "terminated" if self.stop_requested else decide_stop(now, self.rl_started, self.last_progress, self.config, self.first_progress, cap)
            )
            if reason is not None:
                return reason, self.kill_rl()
            if now >= next_beat:
                self.heartbeat("running", f"step {self.follower.step}" if self.follower.step is not None else "waiting for the first metrics row")
                next_beat = now + self.config.heartbeat_interval_s
            time.sleep(self.config.poll_interval_s)

    def stop(self, reason: Reason, exit_code: int | None, message: str) -> ExitReport:
        """Upload weights, metrics and logs, then write the exit report."""
        if self.process is not None and self.process.poll() is None:
            exit_code = self.kill_rl()
        if self.follower is not None:
            self.follower.poll()
        self.heartbeat("uploading", f"uploading results ({reason})")
        uploaded: list[str] = []
        output = self.run_dir / (self.manifest.output_dir if self.manifest else "outputs")
        weights_step = self.weights_step()
        weights_url = None
        upload_errors = []
        try:
            if weights_step is not None:
                uploaded += self.results.upload_tree(output / "weights" / f"step_{weights_step}", f"{WEIGHTS_DIR}/step_{weights_step}")
                weights_url = self.results.url_of(f"{WEIGHTS_DIR}/step_{weights_step}")
            for name in self.config.metrics_files:
                path = output / name
                if path.is_file():
                    self.results.fs.makedirs(self.results.path(f"{METRICS_DIR}/{name}").rsplit("/", 1)[0], exist_ok=True)
                    self.results.fs.put_file(str(path), self.results.path(f"{METRICS_DIR}/{name}"))
                    uploaded.append(f"{METRICS_DIR}/{name}")
            uploaded += self.results.upload_tree(output / "logs", f"{LOGS_DIR}/prime-rl")
            if self.log_path.is_file():
                self.results.fs.makedirs(self.results.path(LOGS_DIR), exist_ok=True)
                self.results.fs.put_file(str(self.log_path), self.results.path(f"{LOGS_DIR}/rl.log"))
                uploaded.append(f"{LOGS_DIR}/rl.log")
        except OSError as err:
            upload_errors.append(str(err))
        log_tail = tail_text(self.log_path)
        succeeded = reason in SUCCESS_REASONS and weights_url is not None and not upload_errors
        if upload_errors:
            message = f"{message}; upload failed: {upload_errors[0]}"[:2000]
        finished = time.time()
        report = ExitReport(
            succeeded=succeeded,
            reason=reason,
            exit_code=exit_code,
            steps=self.follower.step if self.follower else None,
            max_steps=self.manifest.max_steps if self.manifest else None,
            weights_step=weights_step if weights_url else None,
            weights_url=weights_url,
            training_finished_logged=TRAINING_FINISHED in log_tail,
            prime_rl_tag=self.config.expected_tag,
            env_id=self.manifest.env_id if self.manifest else None,
            started_at=self.started,
            finished_at=finished,
            duration_s=finished - self.started,
            uploaded=uploaded,
            message=message[:2000],
            log_tail=log_tail,
        )
        self.results.write_bytes(EXIT_FILE, (report.model_dump_json(indent=2) + "\n").encode())
        self.heartbeat("finished", f"{reason}: {message}"[:1000])
        return report

    # -- helpers ---------------------------------------------------------------------------------

    def weights_step(self) -> int | None:
        """Step of the newest Hugging Face weights folder rl wrote, if any."""
        if self.manifest is None:
            return None
        return latest_weights_step(self.run_dir / self.manifest.output_dir / "weights")

    def reason_message(self, reason: Reason, exit_code: int | None) -> str:
        """One line for the report."""
        step = self.follower.step if self.follower else None
        return {
            "completed": f"rl finished; weights of step {self.weights_step()} uploaded",
            "rl_failed": f"rl exited with code {exit_code}",
            "no_weights": "rl exited 0 but wrote no weights folder",
            "stalled": f"no new metrics row for {self.config.stall_timeout_s:g} s (last step {step}); rl stopped",
            "startup_timeout": f"no metrics row within {self.config.startup_timeout_s:g} s of the start; rl stopped",
            "timeout": f"rl ran past max_runtime_s = {self.config.max_runtime_s:g} s; stopped",
            "train_timeout": (
                f"training reached the task's max_train_seconds = {(self.manifest.max_train_seconds or 0) if self.manifest else 0:g} s; "
                f"rl stopped, weights of step {self.weights_step()} kept"
            ),
            "terminated": f"the runner received {self.stop_requested}; rl stopped",
        }.get(reason, reason)

    def kill_rl(self) -> int | None:
        """Stop rl's whole process group: SIGTERM, then SIGKILL after the grace period; returns its exit code."""
        process = self.process
        if process is None:
            return None
        for signum, wait in ((signal.SIGTERM, self.config.kill_grace_s), (signal.SIGKILL, 10.0)):
            if process.poll() is not None:
                break
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(process.pid, signal.SIGKILL)  # children that outlived the leader
        except ProcessLookupError:
            pass
        return process.poll()

    def heartbeat(self, state: State, message: str) -> None:
        """Write status.json (a failed write is logged to stderr and retried at the next beat)."""
        follower = self.follower
        beat = Heartbeat(
            state=state,
            sequence=self.sequence,
            prime_rl_tag=self.config.expected_tag,
            env_id=self.manifest.env_id if self.manifest else None,
            started_at=self.started,
            updated_at=time.time(),
            rl_pid=self.process.pid if self.process is not None and self.process.poll() is None else None,
            step=follower.step if follower else None,
            max_steps=self.manifest.max_steps if self.manifest else None,
            metric_rows=follower.rows if follower else 0,
            last_progress_at=self.last_progress,
            latest=dict(follower.latest) if follower else {},
            message=message[:1000],
        )
        self.sequence += 1
        try:
            self.results.write_bytes(STATUS_FILE, (beat.model_dump_json() + "\n").encode())
        except OSError as err:
            print(f"[metarl-runner] heartbeat write failed: {err}", file=sys.stderr, flush=True)

    def request_stop(self, signum: int, frame: object) -> None:
        """Signal handler: stop rl at the next loop turn and report ``terminated``."""
        self.stop_requested = signal.Signals(signum).name


# ---------------------------------------------------------------------------------------------
# Entry point: parse the config before anything heavy
# ---------------------------------------------------------------------------------------------

ENV_PREFIX = "METARL_RUNNER_"
ENCODED_PREFIX = "b64:"
"""Prefix of an environment value the launcher base64-encoded (``metarl.runpod_provider.encode_env_value``)."""


def decode_env_value(value: str) -> str:
    """A pod environment value as the launcher meant it (``b64:`` values decoded, others as they are)."""
    if value.startswith(ENCODED_PREFIX):
        return base64.urlsafe_b64decode(value[len(ENCODED_PREFIX) :].encode("ascii")).decode("utf-8")
    return value


def decode_environ(environ: dict[str, str] | os._Environ[str]) -> None:
    """Decode, in place, every value the launcher base64-encoded (storage credentials included, which
    fsspec/s3fs read from the environment)."""
    for name, value in list(environ.items()):
        if value.startswith(ENCODED_PREFIX):
            environ[name] = decode_env_value(value)


def config_from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    """Config values from ``METARL_RUNNER_<FIELD>`` variables (lists and dicts as JSON)."""
    values: dict[str, Any] = {}
    for name, field in RunnerConfig.model_fields.items():
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        raw = decode_env_value(raw)
        annotation = str(field.annotation)
        values[name] = json.loads(raw) if ("list" in annotation or "dict" in annotation) else raw
    return values


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> RunnerConfig:
    """The runner config from ``--config-json``, then environment variables, then flags (later wins)."""
    parser = argparse.ArgumentParser(prog="python -m metarl.pod_runner", description="Run one metarl inner job with prime-rl.")
    parser.add_argument("--config-json", help="the whole RunnerConfig as JSON")
    parser.add_argument("--job-url")
    parser.add_argument("--result-url")
    parser.add_argument("--work-dir")
    args = parser.parse_args(argv)
    values: dict[str, Any] = json.loads(args.config_json) if args.config_json else {}
    values.update(config_from_environ(environ))
    for name in ("job_url", "result_url", "work_dir"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return RunnerConfig.model_validate(values)


def main(argv: list[str] | None = None) -> int:
    """Run one job; exit code 0 success, 1 job failure, 2 unusable config."""
    decode_environ(os.environ)
    try:
        config = parse_args(argv, os.environ)
    except (ValidationError, ValueError) as err:
        print(f"[metarl-runner] bad configuration: {err}", file=sys.stderr)
        return 2
    runner = PodRunner(config)
    signal.signal(signal.SIGTERM, runner.request_stop)
    signal.signal(signal.SIGINT, runner.request_stop)
    try:
        report = runner.run()
    except OSError as err:  # the result folder itself cannot be written: nobody can be told
        print(f"[metarl-runner] cannot write results to {config.result_url}: {err}", file=sys.stderr)
        return 2
    print(f"[metarl-runner] {report.reason}: {report.message}", flush=True)
    return 0 if report.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
