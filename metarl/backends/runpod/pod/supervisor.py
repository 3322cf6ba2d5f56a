"""The pod's main process: follow the pod's assignment file and run each job assigned to it.

The Runpod train backend (``metarl.backends.runpod.train``) names one file per pod,
``<root>/pods/<pod name>/assignment.json`` (a :class:`~metarl.backends.runpod.pod.protocol.PodAssignment`). It is
written before the pod is created and rewritten whenever a warm pod takes its next job. This
supervisor reads it every ``assignment_poll_s``; for each new ``seq`` with a job it runs that job
with :class:`~metarl.backends.runpod.pod.runner.PodRunner` in a fresh work folder (the previous job's files are
deleted first, so no job sees another's weights), then waits for the next one. It exits when the
assignment says ``terminated``, on SIGTERM/SIGINT (the running job is stopped and reported
``terminated``), or after ``max_idle_s`` without a job when that is set.

An assignment with ``eval_on_pod`` keeps the runner on its job after ``exit.json``: it serves the
job's hidden-eval request (``metarl.backends.runpod.pod.eval_server``) until the result is uploaded, the request does not
come, or the assignment moves on.

A restarted container finds the current assignment again; a job whose ``exit.json`` is already in
its result folder is not run a second time (its on-pod eval, if still owed, is served from the
uploaded weights).

Usage (the image's entry point): ``python -m metarl.backends.runpod.pod.supervisor`` with ``METARL_RUNPOD_ROOT``
and ``METARL_POD_NAME`` set by the launcher, and any ``METARL_RUNNER_*`` settings, which apply to
every job (``job_url`` and ``result_url`` come from the assignment). Exit code 0: terminated or
idle; 2: unusable configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metarl.backends.runpod.pod.manifest import EXIT_FILE
from metarl.backends.runpod.pod.protocol import ExitReport, PodAssignment, decode_env_value, decode_environ
from metarl.backends.runpod.pod.runner import PodRunner
from metarl.backends.runpod.pod.runner_config import RunnerConfig, config_from_environ
from metarl.backends.runpod.pod.storage import Storage

POD_ROOT_ENV, POD_NAME_ENV = "METARL_RUNPOD_ROOT", "METARL_POD_NAME"
ASSIGNMENT_FILE = "assignment.json"


class SupervisorConfig(BaseModel):
    """Settings of the supervisor process (from the launcher's environment or flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pod_root: str = Field(min_length=1, max_length=2000, description="Storage root of the train backend (fsspec URL or path)")
    pod_name: str = Field(min_length=1, max_length=191, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$", description="This pod's name")
    assignment_poll_s: float = Field(default=5.0, gt=0, le=600, description="Seconds between reads of the assignment file")
    max_idle_s: float | None = Field(default=None, gt=0, le=7 * 86_400, description="Exit after this long without a job (None: wait for termination)")


def assignment_path(pod_name: str) -> str:
    """The assignment file of a pod, relative to the storage root."""
    return f"pods/{pod_name}/{ASSIGNMENT_FILE}"


def job_to_run(assignment: PodAssignment | None, done_seq: int) -> PodAssignment | None:
    """The assignment to run now: one with a job and a seq this process has not handled."""
    if assignment is None or assignment.terminated or assignment.job_name is None:
        return None
    if assignment.job_url is None or assignment.result_url is None or assignment.seq <= done_seq:
        return None
    return assignment


def job_config(base: Mapping[str, Any], assignment: PodAssignment, work_root: Path) -> RunnerConfig:
    """The runner config of one assigned job: the pod-wide settings plus the assignment's URLs, eval choice and a work folder of its own."""
    values = dict(base)
    values.update(
        job_url=assignment.job_url, result_url=assignment.result_url, work_dir=str(work_root / f"job-{assignment.seq}"), eval_on_pod=assignment.eval_on_pod
    )
    return RunnerConfig.model_validate(values)


def still_this_job(assignment: PodAssignment | None, seq: int) -> bool:
    """The pod still runs the job of assignment ``seq`` (not moved on, not terminated; an unreadable file changes nothing)."""
    return assignment is None or (assignment.seq == seq and not assignment.terminated and assignment.job_name is not None)


class PodSupervisor:
    """The loop of one pod: read the assignment, run new jobs, stop when told."""

    def __init__(self, config: SupervisorConfig, runner_settings: Mapping[str, Any], environ: Mapping[str, str] | None = None):
        self.config = config
        self.runner_settings = dict(runner_settings)
        self.environ = dict(os.environ if environ is None else environ)
        self.root = Storage(config.pod_root)
        self.work_root = Path(str(self.runner_settings.pop("work_dir", RunnerConfig.model_fields["work_dir"].default)))
        self.runner_settings.pop("job_url", None)
        self.runner_settings.pop("result_url", None)
        self.done_seq = 0
        self.stop_requested: str | None = None
        self.current: PodRunner | None = None

    def read_assignment(self) -> PodAssignment | None:
        """The pod's assignment, or None when it is missing or unreadable (read again next turn)."""
        try:
            return PodAssignment.model_validate_json(self.root.read_bytes(assignment_path(self.config.pod_name)))
        except FileNotFoundError:
            return None
        except (ValidationError, OSError) as err:
            log(f"assignment unreadable, retrying: {err}")
            return None

    def already_reported(self, assignment: PodAssignment) -> bool:
        """True when the job's result folder already holds its exit report (a restarted container)."""
        assert assignment.result_url is not None
        try:
            results = Storage(assignment.result_url)
            return bool(results.fs.exists(results.path(EXIT_FILE)))
        except OSError as err:
            log(f"cannot look for {EXIT_FILE} of {assignment.job_name}, running it: {err}")
            return False

    def run(self, sleep: Callable[[float], None] = time.sleep) -> int:
        """Follow the assignment until terminated, stopped or idle too long; returns the exit code."""
        idle_since = time.monotonic()
        log(f"pod {self.config.pod_name} following {assignment_path(self.config.pod_name)}")
        while self.stop_requested is None:
            assignment = self.read_assignment()
            if assignment is not None and assignment.terminated:
                log("assignment says terminated; exiting")
                return 0
            job = job_to_run(assignment, self.done_seq)
            if job is not None:
                self.run_job(job)
                idle_since = time.monotonic()
                continue
            if self.config.max_idle_s is not None and time.monotonic() - idle_since > self.config.max_idle_s:
                log(f"no job for {self.config.max_idle_s:g} s; exiting")
                return 0
            sleep(self.config.assignment_poll_s)
        log(f"received {self.stop_requested}; exiting")
        return 0

    def run_job(self, assignment: PodAssignment) -> ExitReport | None:
        """Run one assigned job to its exit report (None when it had been reported before)."""
        self.done_seq = assignment.seq
        config = job_config(self.runner_settings, assignment, self.work_root)
        still_assigned = lambda: self.stop_requested is None and still_this_job(self.read_assignment(), assignment.seq)  # noqa: E731
        if self.already_reported(assignment):
            log(f"job {assignment.job_name} (seq {assignment.seq}) already has {EXIT_FILE}; not run again")
            if assignment.eval_on_pod and PodRunner(config, self.environ, still_assigned).resume_eval():
                log(f"job {assignment.job_name} (seq {assignment.seq}) eval served after a restart")
            return None
        shutil.rmtree(self.work_root, ignore_errors=True)
        log(f"job {assignment.job_name} (seq {assignment.seq}) starting")
        self.current = PodRunner(config, self.environ, still_assigned)
        if self.stop_requested:
            self.current.stop_requested = self.stop_requested
        try:
            report = self.current.run()
        except OSError as err:  # its result folder cannot be written; the backend's watchdog sees no progress
            log(f"job {assignment.job_name} (seq {assignment.seq}) could not write its results: {err}")
            return None
        finally:
            self.current = None
        log(f"job {assignment.job_name} (seq {assignment.seq}) {report.reason}: {report.message}")
        return report

    def request_stop(self, signum: int, frame: object) -> None:
        """Signal handler: stop the running job (reported ``terminated``) and exit the loop."""
        self.stop_requested = signal.Signals(signum).name
        if self.current is not None:
            self.current.request_stop(signum, frame)


def log(message: str) -> None:
    print(f"[metarl-supervisor] {message}", flush=True)


def parse_args(argv: list[str] | None, environ: Mapping[str, str]) -> tuple[SupervisorConfig, dict[str, Any]]:
    """Supervisor settings from flags, then the launcher's environment; runner settings from ``METARL_RUNNER_*``."""
    parser = argparse.ArgumentParser(prog="python -m metarl.backends.runpod.pod.supervisor", description="Run the metarl inner jobs assigned to this pod.")
    parser.add_argument("--pod-root", help=f"storage root (default: ${POD_ROOT_ENV})")
    parser.add_argument("--pod-name", help=f"this pod's name (default: ${POD_NAME_ENV})")
    parser.add_argument("--assignment-poll-s", type=float)
    parser.add_argument("--max-idle-s", type=float)
    parser.add_argument("--runner-config-json", help="pod-wide RunnerConfig values as JSON (job_url and result_url come from the assignment)")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {
        "pod_root": args.pod_root or decode_env_value(environ.get(POD_ROOT_ENV, "")),
        "pod_name": args.pod_name or decode_env_value(environ.get(POD_NAME_ENV, "")),
    }
    if args.assignment_poll_s is not None:
        values["assignment_poll_s"] = args.assignment_poll_s
    if args.max_idle_s is not None:
        values["max_idle_s"] = args.max_idle_s
    runner: dict[str, Any] = json.loads(args.runner_config_json) if args.runner_config_json else {}
    runner.update(config_from_environ(environ))
    RunnerConfig.model_validate({**runner, "job_url": "check", "result_url": "check"})
    return SupervisorConfig.model_validate(values), runner


def main(argv: list[str] | None = None) -> int:
    """Follow this pod's assignments; exit code 0 when terminated or idle, 2 on an unusable config."""
    decode_environ(os.environ)
    try:
        config, runner = parse_args(argv, os.environ)
    except (ValidationError, ValueError) as err:
        print(f"[metarl-supervisor] bad configuration: {err}", file=sys.stderr)
        return 2
    supervisor = PodSupervisor(config, runner)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
