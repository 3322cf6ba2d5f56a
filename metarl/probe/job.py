"""The validation probe: schema and semantic checks of a submitted job against its task.

Failures are data (a list of FieldProblem) that go back to the agent as feedback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import ConfigError, FieldProblem, parse_toml_text, validate_model
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec


class ProbeVerdict(BaseModel):
    """Outcome of probing one submission."""

    model_config = ConfigDict(extra="forbid")

    passed: bool = Field(description="True when the job may go to training")
    errors: list[FieldProblem] = Field(default_factory=list, max_length=200, description="Actionable problems, one per field")
    job: JobSpec | None = Field(default=None, description="The parsed job when it parsed")
    isolation: Literal["process", "full"] | None = Field(
        default=None, description="Isolation level the environment module ran under (metarl.sandbox.isolation); None when it did not run"
    )
    isolation_layers: list[str] = Field(default_factory=list, max_length=40, description="The isolation layers of that run")


def semantic_problems(job: JobSpec, task: TaskSpec) -> list[FieldProblem]:
    """Checks that need the task: allowed models, divisibility, compute budget, dataset size and difficulty."""
    problems: list[FieldProblem] = []
    if job.model.name not in task.budget.allowed_models:
        problems.append(
            FieldProblem(field="model.name", message=f"{job.model.name!r} is not allowed for this task", fix=f"use one of {task.budget.allowed_models}")
        )
    resolved = job.resolved()
    if resolved.batch_size % resolved.group_size != 0:
        problems.append(
            FieldProblem(
                field="training.batch_size",
                message=f"batch_size {resolved.batch_size} is not divisible by group_size {resolved.group_size}",
                fix=f"use a multiple of {resolved.group_size}, e.g. {resolved.group_size * max(1, resolved.batch_size // resolved.group_size)}",
            )
        )
    if resolved.rollout_tokens > task.budget.max_rollout_tokens:
        problems.append(
            FieldProblem(
                field="training.max_steps",
                message=f"max_steps x batch_size x max_tokens = {resolved.rollout_tokens} exceeds the task budget {task.budget.max_rollout_tokens}",
                fix="lower max_steps, batch_size or rollout.max_tokens",
            )
        )
    if not task.data.min_dataset_size <= job.dataset.size <= task.data.max_dataset_size:
        problems.append(
            FieldProblem(
                field="dataset.size",
                message=f"{job.dataset.size} examples is outside [{task.data.min_dataset_size}, {task.data.max_dataset_size}]",
                fix=f"use between {task.data.min_dataset_size} and {task.data.max_dataset_size} examples",
            )
        )
    if not task.data.allows_difficulty(job.dataset.difficulty):
        low, high = task.data.difficulty_range
        problems.append(
            FieldProblem(
                field="dataset.difficulty",
                message=f"difficulty {job.dataset.difficulty:g} is outside the task's declared range [{low:g}, {high:g}]",
                fix=f"use a difficulty between {low:g} and {high:g}",
            )
        )
    return problems


BackendCheck = Callable[[JobSpec, TaskSpec], list[FieldProblem]]


MAX_ERRORS = 200


def capped(problems: list[FieldProblem]) -> list[FieldProblem]:
    """At most MAX_ERRORS problems; the last one says how many more there were."""
    if len(problems) <= MAX_ERRORS:
        return problems
    more = len(problems) - (MAX_ERRORS - 1)
    return problems[: MAX_ERRORS - 1] + [
        FieldProblem(field="(more)", message=f"{more} more problems not shown", fix="fix the problems above, then probe again")
    ]


def probe_job_text(job_toml: str | bytes, task: TaskSpec, backend_checks: Sequence[BackendCheck] = ()) -> ProbeVerdict:
    """Parse and check a job.toml (plus the train backend's compile check); never raises on bad input."""
    try:
        job = validate_model(JobSpec, parse_toml_text(job_toml, "job.toml"), "job.toml")
    except ConfigError as err:
        return ProbeVerdict(passed=False, errors=capped([FieldProblem(**problem.model_dump()) for problem in err.problems]))
    problems = semantic_problems(job, task)
    if not problems:
        for check in backend_checks:
            problems += check(job, task)
    return ProbeVerdict(passed=not problems, errors=problems, job=job)
