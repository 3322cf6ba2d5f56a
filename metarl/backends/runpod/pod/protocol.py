"""What the train backend and a pod exchange (pydantic and stdlib only: the pod runner imports it).

The pod's environment: the launcher (``metarl.backends.runpod.provider.encode_env_value``) base64-encodes
values the Runpod SDK's unescaped GraphQL cannot carry (``b64:`` prefix) and the pod decodes them
(:func:`decode_environ`); the runner's settings come as ``METARL_RUNNER_<FIELD>`` variables. Artifact
storage, under the layout of :mod:`metarl.backends.runpod.train`: ``pods/<name>/assignment.json``
(:class:`PodAssignment`, written by the backend, followed by the pod's supervisor), and per job attempt
``status.json`` (:class:`Heartbeat`) and ``exit.json`` (:class:`ExitReport`), written by the runner.
"""

from __future__ import annotations

import base64
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "METARL_RUNNER_"
ENCODED_PREFIX = "b64:"
"""Prefix of an environment value the launcher base64-encoded (``metarl.backends.runpod.provider.encode_env_value``)."""

LOG_TAIL_CHARS = 4000
LATEST_METRICS_MAX = 32

Reason = Literal[
    "completed",
    "no_signal",
    "rollouts_errored",
    "rl_failed",
    "no_weights",
    "adapter_missing",
    "merge_failed",
    "stalled",
    "startup_timeout",
    "timeout",
    "train_timeout",
    "terminated",
    "install_failed",
    "fetch_failed",
    "bad_bundle",
]


SUCCESS_REASONS = ("completed", "train_timeout", "no_signal")
"""Ends whose newest uploaded weights are the job's result (a job cut at the task's training time
keeps what it trained, as the local backend's time budget does; a job without a learning signal
keeps what it trained before, or the base)."""


State = Literal["fetching", "installing", "running", "uploading", "awaiting_eval", "evaluating", "finished"]


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

    succeeded: bool = Field(description="True when the job's result is its uploaded weights (or the base, see trained_is_base)")
    reason: Reason = Field(description="Why the job ended")
    exit_code: int | None = Field(default=None, description="rl's exit code (negative: killed by that signal); None if it never ran")
    steps: int | None = Field(default=None, ge=0, description="Highest trainer step seen in metrics.jsonl")
    max_steps: int | None = Field(default=None, ge=1, description="Steps the job was to run")
    weights_step: int | None = Field(default=None, ge=0, description="Step of the uploaded weights folder")
    weights_url: str | None = Field(default=None, max_length=2100, description="Where the Hugging Face weights were uploaded")
    training_finished_logged: bool = Field(default=False, description="rl printed prime-rl's success line (Training finished!)")
    prime_rl_tag: str = Field(description="prime-rl tag of the image")
    env_id: str | None = Field(default=None, max_length=100, description="Environment id of the bundle")
    started_at: float = Field(ge=0, description="Unix time the runner started")
    finished_at: float = Field(ge=0, description="Unix time the report was written")
    duration_s: float = Field(ge=0, description="Runner wall-clock seconds")
    uploaded: list[str] = Field(default_factory=list, max_length=100_000, description="Result files uploaded (relative paths)")
    message: str = Field(default="", max_length=2000, description="One-line explanation")
    log_tail: str = Field(default="", max_length=LOG_TAIL_CHARS, description="End of rl's output")
    trained_is_base: bool = Field(default=False, description="A no-signal job that saved no weights: the trained model is the base")
    lora_merged: bool = Field(default=False, description="The uploaded weights are the base with the trained LoRA adapter merged in")
    agent_stopped: bool = Field(default=False, description="No process of rl's (the agent's code) was left when the report was written")
    eval_on_pod: bool = Field(default=False, description="The runner serves the job's hidden eval after this report")


class PodAssignment(BaseModel):
    """``pods/<name>/assignment.json``: the job a pod runs now; ``job_name`` None means the pod is idle.

    Written by the train backend (``metarl.backends.runpod.train``), followed by the pod's
    supervisor (``metarl.backends.runpod.pod.supervisor``).
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
    eval_on_pod: bool = Field(default=False, description="The job's hidden eval runs on this pod after training (metarl.backends.runpod.pod.eval_server)")


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
