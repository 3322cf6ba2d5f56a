"""The worker side of `bench.versus_search`: one inner job launched, polled and scored with the local backends, in a worker process.

A module of its own so that what crosses between processes (requests, results, these functions)
pickles under one importable name in the bench and in its spawned workers.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

SMALL_MODEL = "local-s"
POLL_S = 0.25


class InnerJobRequest(BaseModel):
    """A job that passed the probe, for a worker: its text, its task (with the bench's time budget) and the backends' settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_toml: str = Field(min_length=1, max_length=100_000, description="The job.toml text")
    task: TaskSpec = Field(description="The task, its budget.max_train_seconds the bench's")
    name: str = Field(pattern=r"^[a-z0-9_\-]{1,128}$", description="Job folder name")
    jobs_dir: str = Field(min_length=1, max_length=4096, description="Folder of the job folders")
    model_scale: float = Field(gt=0.0, le=10.0, description="Base models' pretraining scale")
    cache_dir: str | None = Field(default=None, max_length=4096, description="Base-model cache")
    workers: int = Field(ge=1, le=64, description="Trainers at once (sets each trainer's torch threads)")


class InnerJobResult(BaseModel):
    """What a trained job gave."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    outcome: Literal["passed", "failed"] = Field(description="passed: trained and scored; failed: the trainer failed")
    score: float | None = Field(default=None, ge=0.0, le=1.0, description="Hidden-eval score (passed only)")
    steps: int | None = Field(default=None, ge=0, description="GRPO steps run")
    cpu_s: float = Field(ge=0.0, description="CPU seconds: the trainer process and the scoring")
    wall_s: float = Field(ge=0.0, description="Wall seconds from launch to score")
    error: str = Field(default="", max_length=4000, description="Why it failed")


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def reap(pid: int) -> None:
    """Wait for a finished trainer process so its CPU time counts among this process's children."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        return  # already reaped (subprocess cleans up finished children it started)


def run_inner_job(request: InnerJobRequest) -> InnerJobResult:
    """Launch, poll and score one job with the local backends, as a run's train and eval stages do."""
    from metarl.artifact_store import ArtifactStore
    from metarl.backends.local.config import LocalEvalBackend, LocalTrainBackend
    from metarl.backends.local.train import LocalEval, LocalTrain
    from metarl.interfaces import EpisodeContext
    from schemas.base import parse_toml_text, validate_model

    started, cpu = time.monotonic(), cpu_seconds()
    job = validate_model(JobSpec, parse_toml_text(request.job_toml, "job.toml"), "job.toml")
    ctx = EpisodeContext(
        run_id="versus-search", episode_id=1, task=request.task, policy_version=0, probe_attempt=1, seed=job.training.seed, artifacts_root=request.jobs_dir
    )
    trainer = LocalTrain(
        LocalTrainBackend(
            type="local", max_concurrent_jobs=request.workers, torch_threads_per_job=1, model_scale=request.model_scale, model_cache_dir=request.cache_dir
        ),
        ArtifactStore(request.jobs_dir),
        jobs_dir=Path(request.jobs_dir),
    )
    launched = trainer.launch(ctx, job, request.name)
    try:
        while (polled := trainer.poll(ctx, job, launched.external_id, launched.state)).status == "running":
            time.sleep(POLL_S)
        reap(int(launched.state["pid"]))
        status_file = Path(launched.state["job_dir"]) / "status.json"
        steps = json.loads(status_file.read_text(encoding="utf-8")).get("steps") if status_file.is_file() else None
        if polled.status != "succeeded":
            return InnerJobResult(
                outcome="failed", steps=steps, cpu_s=cpu_seconds() - cpu, wall_s=time.monotonic() - started, error=(polled.error or "failed")[:4000]
            )
        evaluator = LocalEval(LocalEvalBackend(type="local", model_scale=request.model_scale, model_cache_dir=request.cache_dir))
        score = evaluator.score_trained(ctx, job, polled.checkpoint_uri, launched.state)
    finally:
        shutil.rmtree(launched.state["job_dir"], ignore_errors=True)
    return InnerJobResult(outcome="passed", score=score.score, steps=steps, cpu_s=cpu_seconds() - cpu, wall_s=time.monotonic() - started)


def build_base_model(model: str, task: TaskSpec, scale: float, cache_dir: str | None) -> float:
    """Build (or find) a base model for the task's families; wall seconds."""
    from metarl.learning.data_families import model_families
    from metarl.learning.models import ensure_base_model

    started = time.monotonic()
    ensure_base_model(model, cache_dir, scale=scale, families=model_families(task))
    return time.monotonic() - started


def base_model_records(task: TaskSpec, scale: float, cache_dir: str | None) -> dict[str, dict[str, Any]]:
    """Each base model's build record (`bench.base_models.build_record`: build key, weight digest, kept step) for the task's families."""
    from bench.base_models import build_record
    from metarl.learning.data_families import model_families
    from metarl.learning.models import BASE_MODELS, ensure_base_model

    return {model: build_record(ensure_base_model(model, cache_dir, scale=scale, families=model_families(task))) for model in BASE_MODELS}


def base_score(task: TaskSpec, scale: float, cache_dir: str | None) -> float:
    """The floor: the small base model's hidden-eval score on the task."""
    from metarl.backends.local.config import LocalEvalBackend
    from metarl.backends.local.train import LocalEval
    from metarl.learning.models import BASE_MODELS

    return (
        LocalEval(LocalEvalBackend(type="local", model_scale=scale, model_cache_dir=cache_dir)).score_base(task, BASE_MODELS[SMALL_MODEL].stands_in_for).score
    )


def worker_setup() -> None:
    """A worker process: one torch thread, quiet model loading."""
    from metarl.learning.runtime import THREADS_ENV, configure_torch_threads, quiet_transformers

    os.environ[THREADS_ENV] = "1"
    configure_torch_threads()
    quiet_transformers()
