"""The inner-job runner that runs inside the prime-rl pod image (``docker/inner.Dockerfile``).

Lifecycle (one job per process): **setup** (read the config, fetch the job bundle from artifact
storage and check it against its manifest), **start** (install the environment package into
prime-rl's environment, start ``rl @ rl.toml`` in its own session with a clean environment),
**main loop** (every ``heartbeat_interval_s``: parse the new rows of the run's ``metrics.jsonl``
files and write a heartbeat to ``status.json``; stop the run when it exits, stalls, never starts
producing metrics, outlives ``max_runtime_s`` or reaches the task's ``max_train_seconds``),
**stop** (kill what is left of rl's session, so none of the agent's code runs any more; pick the
newest *complete* weights folder; merge a LoRA adapter into it; upload weights, metrics and logs;
write ``exit.json``: an :class:`ExitReport`), then, when the job's hidden eval runs on this pod,
**eval** (``metarl.backends.runpod.pod.eval_server``: wait for the request the train backend publishes after
``exit.json``, generate, upload the completions, delete the hidden prompts).

Its settings are :class:`~metarl.backends.runpod.pod.runner_config.RunnerConfig`; what it writes for the train
backend, :mod:`metarl.backends.runpod.pod.protocol`; what it reads of prime-rl's outputs,
:mod:`metarl.backends.runpod.pod.rl_outputs`; what rl may see and how it is swept away,
:mod:`metarl.backends.runpod.pod.confinement`.

Facts of prime-rl v0.8.0 this relies on (paths relative to its ``src/prime_rl/``):

- a weights folder ``<output_dir>/weights/step_N`` is complete only once its ``STABLE`` file
  exists (``trainer/ckpt.py`` ``WeightCheckpointManager.mark_stable``); a folder being written when
  rl is stopped has none and is never used;
- rl exits 1 on SIGTERM (``entrypoints/rl.py``), so after the runner stops rl itself the reason is
  the runner's (``train_timeout``, ``stalled``, ...), never rl's exit code; a job cut at the task's
  ``max_train_seconds`` succeeds with its newest complete weights;
- a LoRA job's weights folder holds the untrained base; the adapter is in ``lora_adapters/`` only
  with ``save_adapter_separately`` (``trainer/weights.py``, ``trainer/lora.py``,
  ``trainer/ckpt.py``). The runner merges it (``metarl/backends/runpod/pod/lora_merge.py``, run with the image's
  Python) and uploads the merged model: every evaluator then scores the trained model with no LoRA
  support of its own; a LoRA job without an adapter fails (``adapter_missing``) instead of passing
  the base off as trained;
- after 10 empty train batches in a row the orchestrator raises and rl exits 1
  (``orchestrator/orchestrator.py``: "... consecutive empty train batches ..." in
  ``logs/orchestrator.log``). Errored rollouts never reach a batch, and post-batch filters empty one
  only where they enforce (:mod:`metarl.backends.runpod.pod.rl_outputs`). With no filter enforcing,
  as compiled bundles have it, every rollout errored: the job fails (``rollouts_errored``) with the
  cause the orchestrator logged (``orchestrator/dispatcher.py``). With an enforcing zero-advantage
  filter it may be batches without a learning signal: an outcome, not a failure: ``no_signal``
  succeeds with the newest complete weights, or with none (``trained_is_base``: the trained model is
  the base).

Storage is any fsspec URL (``file://`` or a plain path in tests, ``s3://...`` on pods). The
``rl`` process (which runs the agent's reward code) gets only the environment variables listed
in ``passthrough_env`` and never a name that looks like a credential, so the storage keys the
runner itself uses do not reach it. Only pydantic, fsspec and the stdlib are imported: the pod
image installs nothing else for the runner.

Usage: ``python -m metarl.backends.runpod.pod.runner --job-url URL --result-url URL`` (or the same settings in
``METARL_RUNNER_*`` environment variables; ``--config-json`` takes the whole config). Exit code
0: the job succeeded; 1: it failed (the report says why); 2: the runner could not run at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from metarl.backends.runpod.pod.confinement import child_environment, read_processes, sweep_targets
from metarl.backends.runpod.pod.eval_server import RESULT_FILE, EvalServer
from metarl.backends.runpod.pod.manifest import (
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
from metarl.backends.runpod.pod.protocol import LOG_TAIL_CHARS, SUCCESS_REASONS, ExitReport, Heartbeat, Reason, State, decode_environ
from metarl.backends.runpod.pod.rl_outputs import (
    ADAPTER_DIR,
    ORCHESTRATOR_LOG,
    TRAINING_FINISHED,
    MetricsFollower,
    empty_batches_logged,
    is_lora_job,
    latest_weights_step,
    post_batch_filters_enforce,
    rollout_failures,
    tail_text,
)
from metarl.backends.runpod.pod.runner_config import RunnerConfig, parse_args
from metarl.backends.runpod.pod.storage import Storage

MERGE_SCRIPT = Path(__file__).with_name("lora_merge.py")
MERGED_DIR = "merged"


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


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


def exit_reason(exit_code: int, has_weights: bool, empty_batches: bool = False, filters_enforce: bool = True) -> Reason:
    """Reason for an rl process that exited by itself. ``empty_batches``: its orchestrator aborted after 10 empty train
    batches; with no post-batch filter enforcing (``filters_enforce`` False) that means every rollout errored, else
    the batches may have had no learning signal."""
    if exit_code != 0:
        if empty_batches:
            return "no_signal" if filters_enforce else "rollouts_errored"
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
    """One job: setup, start, main loop, stop, then the on-pod eval when asked (see the module docstring)."""

    def __init__(self, config: RunnerConfig, environ: Mapping[str, str] | None = None, still_assigned: Callable[[], bool] = lambda: True):
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        self.still_assigned = still_assigned
        self.work = Path(config.work_dir).resolve()
        self.bundle_dir = self.work / "bundle"
        self.run_dir = self.work / "run"
        self.log_path = self.work / "rl.log"
        self.results = Storage(config.result_url)
        self.started = time.time()
        self.sequence = 0
        self.manifest: BundleManifest | None = None
        self.rl_config: dict[str, Any] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.rl_started = 0.0
        self.follower: MetricsFollower | None = None
        self.last_progress: float | None = None
        self.first_progress: float | None = None
        self.stop_requested: str | None = None
        self.trained_dir: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def run(self) -> ExitReport:
        """Run the job to the end, write its exit report, then serve its on-pod eval if asked; never raises for a job failure."""
        exit_code: int | None = None
        try:
            self.setup()
            self.start()
            reason, exit_code = self.main_loop()
            message = self.reason_message(reason, exit_code)
        except RunnerError as err:
            reason, message = err.reason, err.message
        report = self.stop(reason, exit_code, message)
        if report.eval_on_pod:
            self.serve_eval(report)
        return report

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
        try:
            self.rl_config = tomllib.loads(files[RL_TOML_FILE].decode("utf-8"))
        except (KeyError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise RunnerError("bad_bundle", f"{RL_TOML_FILE} cannot be read: {err}") from None
        for relative, data in files.items():
            target = self.bundle_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        self.manifest = manifest

    def start(self) -> None:
        """Install the environment package, then start rl in a session of its own."""
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
        """Heartbeat and watch rl until it exits or must be stopped; returns (reason, exit code).

        When the runner stops rl, the reason is the runner's: rl's own exit code after a SIGTERM is 1
        whatever it trained (prime-rl v0.8.0 src/prime_rl/entrypoints/rl.py)."""
        assert self.process is not None and self.follower is not None
        next_beat = time.time() + self.config.heartbeat_interval_s
        while True:
            code = self.process.poll()
            now = time.time()
            if self.follower.poll():
                self.last_progress = now
                self.first_progress = self.first_progress or now
            if code is not None:
                empty_batches = code != 0 and empty_batches_logged(self.orchestrator_log())
                return exit_reason(code, self.weights_step() is not None, empty_batches, post_batch_filters_enforce(self.rl_config)), code
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
        """Stop the agent's code, settle the weights (newest complete step, LoRA merged), upload, write the exit report."""
        if self.process is not None and self.process.poll() is None:
            exit_code = self.kill_rl()
        agent_stopped = self.sweep_agent_processes()
        if self.follower is not None:
            self.follower.poll()
        self.heartbeat("uploading", f"uploading results ({reason})")
        output = self.run_dir / (self.manifest.output_dir if self.manifest else "outputs")
        weights_step = self.weights_step()
        reason, message, weights_dir, merged = self.trained_weights(reason, message, weights_step)
        uploaded: list[str] = []
        weights_url = None
        upload_errors = []
        try:
            if weights_dir is not None:
                uploaded += self.results.upload_tree(weights_dir, f"{WEIGHTS_DIR}/step_{weights_step}")
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
        trained_is_base = reason == "no_signal" and weights_step is None
        succeeded = reason in SUCCESS_REASONS and (weights_url is not None or trained_is_base) and not upload_errors
        if upload_errors:
            message = f"{message}; upload failed: {upload_errors[0]}"[:2000]
        self.trained_dir = weights_dir if succeeded else None
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
            trained_is_base=succeeded and trained_is_base,
            lora_merged=merged and weights_url is not None,
            agent_stopped=agent_stopped,
            eval_on_pod=self.config.eval_on_pod and succeeded and agent_stopped,
        )
        self.results.write_bytes(EXIT_FILE, (report.model_dump_json(indent=2) + "\n").encode())
        self.heartbeat("finished", f"{reason}: {message}"[:1000])
        return report

    def trained_weights(self, reason: Reason, message: str, step: int | None) -> tuple[Reason, str, Path | None, bool]:
        """(reason, message, folder to upload, merged): the newest complete weights, a LoRA adapter merged into them.

        A LoRA job's folder without its adapter is the untrained base: the job fails (``adapter_missing``)."""
        if step is None or self.manifest is None:
            return reason, message, None, False
        step_dir = self.run_dir / self.manifest.output_dir / WEIGHTS_DIR / f"step_{step}"
        if not is_lora_job(self.rl_config):
            return reason, message, step_dir, False
        if not (step_dir / ADAPTER_DIR).is_dir():
            return (
                "adapter_missing",
                f"rl.toml trains a LoRA adapter but weights/step_{step} has no {ADAPTER_DIR}/: prime-rl {self.config.expected_tag} saves the "
                "untrained base there and the adapter only with [trainer.ckpt.weights] save_adapter_separately = true",
                None,
                False,
            )
        merged_dir = self.work / MERGED_DIR / f"step_{step}"
        command = [*self.config.pod_python, str(MERGE_SCRIPT), str(step_dir), str(merged_dir)]
        try:
            done = subprocess.run(command, capture_output=True, timeout=self.config.merge_timeout_s, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return "merge_failed", f"merging the LoRA adapter of step {step} ran past {self.config.merge_timeout_s:g} s", None, False
        except OSError as err:
            return "merge_failed", f"the LoRA merge could not start: {err}", None, False
        if done.returncode != 0:
            tail = done.stderr.decode("utf-8", errors="replace")[-800:].strip()
            return "merge_failed", f"merging the LoRA adapter of step {step} failed: {tail}", None, False
        return reason, f"{message}; LoRA adapter merged", merged_dir, True

    def serve_eval(self, report: ExitReport) -> None:
        """Answer the job's hidden-eval request on this pod (``metarl.backends.runpod.pod.eval_server``), then report ``finished``."""
        base_model = str((self.rl_config.get("model") or {}).get("name") or "")
        env = child_environment(self.environ, self.config.passthrough_env, (), self.config.eval_extra_env)
        server = EvalServer(
            self.results,
            self.config.eval_settings(),
            self.work / "eval",
            env,
            self.still_assigned,
            lambda state, note: self.heartbeat(state, note),  # type: ignore[arg-type]
        )
        trained = None if report.trained_is_base else self.trained_dir
        if trained is None and not report.trained_is_base and report.weights_url:
            trained = self.download_weights(report.weights_url)
        server.serve(trained, base_model)
        self.heartbeat("finished", f"{report.reason}: eval served")

    def resume_eval(self) -> bool:
        """A restarted pod whose job reported but has no eval result yet: fetch rl.toml and the weights, serve the eval.

        Returns False when there is nothing to serve."""
        try:
            report = ExitReport.model_validate_json(self.results.read_bytes(EXIT_FILE))
        except (FileNotFoundError, ValidationError):
            return False
        if not report.eval_on_pod or self.results.fs.exists(self.results.path(RESULT_FILE)):
            return False
        try:
            self.rl_config = tomllib.loads(Storage(self.config.job_url).read_bytes(RL_TOML_FILE).decode("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            print(f"[metarl-runner] cannot read rl.toml to resume the eval: {err}", file=sys.stderr, flush=True)
            return False
        self.serve_eval(report)
        return True

    def download_weights(self, weights_url: str) -> Path:
        """The uploaded weights, fetched back into the work folder (a restarted pod lost its local copy)."""
        target = self.work / "eval-weights"
        source = Storage(weights_url)
        for path in source.fs.find(source.root):
            relative = path[len(source.root) :].lstrip("/")
            local = target / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            source.fs.get_file(path, str(local))
        return target

    # -- helpers ---------------------------------------------------------------------------------

    def weights_step(self) -> int | None:
        """Step of the newest complete Hugging Face weights folder rl wrote, if any."""
        if self.manifest is None:
            return None
        return latest_weights_step(self.run_dir / self.manifest.output_dir / WEIGHTS_DIR)

    def orchestrator_log(self) -> str:
        """The end of prime-rl's orchestrator log ('' when absent)."""
        if self.manifest is None:
            return ""
        return tail_text(self.run_dir / self.manifest.output_dir / ORCHESTRATOR_LOG, 20 * LOG_TAIL_CHARS)

    def errored_message(self) -> str:
        """Why every rollout errored, in the orchestrator's own words."""
        failures = rollout_failures(self.orchestrator_log())
        cause = (
            f"{failures.count} errored rollouts in {ORCHESTRATOR_LOG}, the last: {failures.last}"
            if failures.last
            else f"no errored-rollout warning in the end of {ORCHESTRATOR_LOG}"
        )
        return (
            f"every rollout errored: prime-rl's orchestrator stopped after 10 consecutive empty train batches and no post-batch filter drops rollouts; {cause}"
        )

    def reason_message(self, reason: Reason, exit_code: int | None) -> str:
        """One line for the report."""
        step = self.follower.step if self.follower else None
        weights = self.weights_step()
        return {
            "completed": f"rl finished; weights of step {weights} uploaded",
            "no_signal": (
                "no learning signal: the orchestrator stopped after batches whose rewards were identical within every group; "
                + (f"weights of step {weights} kept" if weights is not None else "no weights were saved: the trained model is the base")
            ),
            "rollouts_errored": self.errored_message(),
            "rl_failed": f"rl exited with code {exit_code}",
            "no_weights": "rl exited 0 but wrote no complete weights folder",
            "stalled": f"no new metrics row for {self.config.stall_timeout_s:g} s (last step {step}); rl stopped",
            "startup_timeout": f"no metrics row within {self.config.startup_timeout_s:g} s of the start; rl stopped",
            "timeout": f"rl ran past max_runtime_s = {self.config.max_runtime_s:g} s; stopped",
            "train_timeout": (
                f"training reached the task's max_train_seconds = {(self.manifest.max_train_seconds or 0) if self.manifest else 0:g} s; "
                f"rl stopped, weights of step {weights} kept"
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

    def sweep_agent_processes(self) -> bool:
        """Kill what is left of rl's session (or, with ``agent_sweep = "uid"``, every other process of this user); True when none is left."""
        if self.process is None:
            return True
        session, uid, own = self.process.pid, os.getuid(), os.getpid()
        for _ in range(20):
            targets = sweep_targets(read_processes(), self.config.agent_sweep, session, uid, own)
            if not targets:
                return True
            for pid in targets:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.1)
        left = sweep_targets(read_processes(), self.config.agent_sweep, session, uid, own)
        print(f"[metarl-runner] processes of rl still alive after the sweep: {left}", file=sys.stderr, flush=True)
        return not left

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
