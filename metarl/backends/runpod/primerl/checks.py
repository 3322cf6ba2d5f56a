"""The probe's check that a job compiles to a valid rl.toml for the pinned prime-rl.

``primerl_compile_problems`` has the shape of :data:`metarl.probe.job.BackendCheck`, so the probe
catches a job that prime-rl would reject before a pod is paid for. It needs only the job and
the task (the environment module and dataset are checked by the workspace probe).
"""

from __future__ import annotations

from metarl.backends.runpod.pod.pin import PRIME_RL_TAG
from metarl.backends.runpod.primerl.compiler import MODEL_RENDERERS, PROBE_ENV_ID, RL_TO_JOB_FIELD, CompileOptions, compile_rl_config
from metarl.backends.runpod.primerl.schema import SchemaProblem, rl_config_problems
from schemas.base import FieldProblem
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

FIELD_PREFIX = "(prime-rl)"

_FIXES = {
    "rollout.temperature": "use a rollout.temperature between 0 and 2.0 (prime-rl's sampling limit)",
    "training.batch_size": "make training.batch_size a multiple of training.group_size",
    "training.group_size": "make training.batch_size a multiple of training.group_size",
    "model.name": f"use one of {sorted(MODEL_RENDERERS)}",
}


def job_field(rl_path: str) -> str | None:
    """The job.toml field an rl.toml key path comes from, or None when the pod settings produced it."""
    return RL_TO_JOB_FIELD.get(rl_path)


def field_problem(problem: SchemaProblem) -> FieldProblem:
    """A schema problem as probe feedback: the job field when known, the rl.toml key in the message."""
    field = job_field(problem.path)
    where = f"{FIELD_PREFIX} {field}" if field else f"{FIELD_PREFIX} rl.toml {problem.path}"
    fix = _FIXES.get(field or "", f"change {field} so prime-rl {PRIME_RL_TAG} accepts it") if field else "an operator problem: report it"
    return FieldProblem(field=where, message=f"rl.toml {problem.path}: {problem.message} (prime-rl {PRIME_RL_TAG})", fix=fix)


def primerl_compile_problems(job: JobSpec, task: TaskSpec, options: CompileOptions | None = None) -> list[FieldProblem]:
    """Every reason the job would not run on the pinned prime-rl (empty when it compiles and validates)."""
    if job.model.name not in MODEL_RENDERERS:
        return [
            FieldProblem(
                field=f"{FIELD_PREFIX} model.name",
                message=f"{job.model.name!r} has no pinned chat renderer for prime-rl {PRIME_RL_TAG} inner jobs",
                fix=_FIXES["model.name"],
            )
        ]
    config = compile_rl_config(job, PROBE_ENV_ID, options)
    return [field_problem(problem) for problem in rl_config_problems(config)]
