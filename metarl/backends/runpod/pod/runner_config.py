"""The pod runner's settings and how they are read: ``--config-json``, then ``METARL_RUNNER_*`` environment
variables, then flags (pydantic and stdlib only: parsed before the runner starts anything)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from metarl.backends.runpod.pod.confinement import DEFAULT_PASSTHROUGH
from metarl.backends.runpod.pod.eval_server import EvalSettings
from metarl.backends.runpod.pod.pin import PRIME_RL_TAG, PRIME_RL_VENV_PYTHON
from metarl.backends.runpod.pod.protocol import ENV_PREFIX, decode_env_value


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
    agent_sweep: Literal["session", "uid"] = Field(
        default="session",
        description="What is killed once rl stops: rl's session, or (on a pod, where nothing else runs as this user) every other process of this user",
    )
    pod_python: list[str] = Field(
        default_factory=lambda: [PRIME_RL_VENV_PYTHON],
        min_length=1,
        max_length=8,
        description="The image's Python with torch, safetensors and vLLM (LoRA merge, eval)",
    )
    merge_timeout_s: float = Field(default=1800.0, gt=0, le=86_400, description="Cap on merging a LoRA adapter into the weights")
    eval_on_pod: bool = Field(default=False, description="After exit.json, serve the job's hidden-eval request on this pod (set from the assignment)")
    eval_engine: Literal["vllm", "torch"] = Field(default="vllm", description="Engine of the on-pod eval (torch: CPU, tests)")
    eval_wait_s: float = Field(default=3600.0, gt=0, le=86_400, description="Longest wait for the eval request after exit.json")
    eval_timeout_s: float = Field(default=3600.0, gt=0, le=86_400, description="Cap on scoring one model on the pod")
    eval_poll_s: float = Field(default=2.0, gt=0, le=60, description="Seconds between looks for the eval request")
    eval_model_aliases: dict[str, str] = Field(default_factory=dict, max_length=16, description="Base model name -> weights to load instead (tests)")
    eval_extra_env: dict[str, str] = Field(default_factory=dict, max_length=50, description="Variables set for the eval's scoring processes")
    eval_base_source: Literal["download", "cache"] = Field(
        default="download", description="Base model of the eval: downloaded afresh once the agent's code stopped, or read from the pod's cache"
    )
    eval_stack_manifest: str | None = Field(
        default=None, max_length=1000, description="The image's manifest of prime-rl's venv and source, verified before scoring (the image sets it)"
    )

    def eval_settings(self) -> EvalSettings:
        """The on-pod eval's settings."""
        return EvalSettings(
            python_command=self.pod_python,
            engine=self.eval_engine,
            wait_s=self.eval_wait_s,
            timeout_s=self.eval_timeout_s,
            poll_s=self.eval_poll_s,
            model_aliases=self.eval_model_aliases,
            stack_manifest=self.eval_stack_manifest,
            base_source=self.eval_base_source,
        )


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
    parser = argparse.ArgumentParser(prog="python -m metarl.backends.runpod.pod.runner", description="Run one metarl inner job with prime-rl.")
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
