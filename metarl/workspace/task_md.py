"""What the agent reads: TASK.md, rendered from a task's public parts only, with the contracts of the environment
module, the grader, the dataset and job.toml it states."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from metarl.reward_rule import CLIP, REJECT_ABOVE
from metarl.sandbox_runner import ALLOWED_MODULES, GRADERS_MODULE
from metarl.workspace.files import (
    COMPONENTS_NAME,
    ENVIRONMENT_FUNCTION,
    TASK_FILE,
    WorkspaceLimits,
)
from schemas.base import FieldProblem, printable
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

# ---------------------------------------------------------------------------------------------
# TASK.md


def _example_limit(field: str) -> int:
    from metarl.learning.families import Example

    for item in Example.model_fields[field].metadata:
        if getattr(item, "max_length", None) is not None:
            return int(item.max_length)
    return 0


def environment_contract() -> str:
    """The environment-module contract as shown to the agent (and enforced by the probe)."""
    modules = ", ".join(sorted(name for name in ALLOWED_MODULES if not name.startswith(("_", "encodings.")) and name != GRADERS_MODULE))
    return f"""The environment module (job.toml `[environment] module`, default `environment.py`) is plain
Python 3.11 that scores sampled completions during training. It must define

    def {ENVIRONMENT_FUNCTION}(prompt: str, completion: str, answer: str) -> float

returning the reward of one completion of a dataset item (`answer` is the item's reference
answer): a finite int or float, higher is better; deterministic and fast. Training counts it
clamped to [-{CLIP:g}, {CLIP:g}], so the correct answer must still score higher than wrong ones after
clamping (the probe checks); a magnitude above {REJECT_ABOVE:,.0f}, NaN or a non-number fails the job.
Rewards within [0, 1] are the usual choice.
Optionally it defines

    {COMPONENTS_NAME} = {{"correctness": fn, "format": fn, ...}}

mapping reward-component names to functions with the same signature; when present, every name in
job.toml `[reward.components]` must be one of its keys.

Rules: the module runs in a sandbox with no network, no processes or threads, no file writes and
no environment; it may read only files inside the workspace and may import only these standard
modules: {modules}; and `{GRADERS_MODULE}`, the task families' own graders (see "This task's grader" below).
Top-level code runs once at import, under the same time and memory limits.
The probe imports it, calls `{ENVIRONMENT_FUNCTION}` on sample items of this task and requires the
correct answer to score strictly higher than wrong ones."""


def task_grader(task: TaskSpec) -> Mapping[str, Any]:
    """The grader mapping of the task's family: its spec's ``[grader]``, else the registered family's own
    (exact match when the family cannot be built here)."""
    from metarl.learning.data_families import family_for, grader_mapping

    try:
        generator = family_for(task) if task.grader is None else None
    except KeyError:
        generator = None
    return grader_mapping(task, generator)


def grader_contract(task: TaskSpec) -> str:
    """How the agent's environment module grades with this task's own grader (the mapping is public)."""
    return f"""`{GRADERS_MODULE}` grades with a grader mapping; this task's is

    GRADER = {dict(task_grader(task))!r}

Pass it where a grader is asked for: `{GRADERS_MODULE}.grade(GRADER, answer, completion)` (1 for an
exact answer, else a share in [0, 1] for a near miss), `{GRADERS_MODULE}.is_exact(answer, completion, GRADER)`,
`{GRADERS_MODULE}.is_well_formed(GRADER, completion)` and
`{GRADERS_MODULE}.reward_components("{task.family}", max_tokens, GRADER)` (a {COMPONENTS_NAME} mapping)."""


def dataset_contract(task: TaskSpec) -> str:
    return f"""The dataset file (job.toml `[dataset] path`, default `dataset.jsonl`) is UTF-8 JSON Lines: one object
per line with exactly two string keys, `{{"prompt": "...", "answer": "..."}}` (prompt 1-{_example_limit("prompt")}
characters, answer 1-{_example_limit("answer")}); blank lines are ignored. It must hold exactly
`[dataset] size` items, between {task.data.min_dataset_size} and {task.data.max_dataset_size}. Items of
the hidden evaluation are rejected: the probe says how many, not which; items are matched by
content, so rewording a prompt does not change the item."""


def _bounds(field: Any) -> str:
    words = []
    for item in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                words.append(f"{sign} {value}")
    return f" ({', '.join(words)})" if words else ""


def job_reference() -> str:
    """Every job.toml table and key with its default, bounds and description (from the schema)."""
    lines = []
    for section, section_field in JobSpec.model_fields.items():
        model = section_field.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        lines.append(f"[{section}]{'' if section_field.is_required() else ' (optional)'}")
        for name, field in model.model_fields.items():
            if field.is_required():
                default = "required"
            elif field.default_factory is not None:
                default = f"default {json.dumps(field.get_default(call_default_factory=True, validated_data={}))}"
            elif field.default is None:
                default = "default: backend's choice"
            elif field.default is not PydanticUndefined:
                default = f"default {json.dumps(field.default)}"
            else:
                default = ""
            lines.append(f"  {name}: {field.description or ''}; {default}{_bounds(field)}")
    return "\n".join(lines)


def _is_hidden_item(task: TaskSpec, prompt: str) -> bool:
    """True when a public example happens to be a hidden-eval item (then it is left out of TASK.md)."""
    from metarl.learning.data_families import family_for
    from metarl.learning.eval_secret import EvalSecretMissing

    try:
        return family_for(task).is_hidden_eval_item(prompt)
    except (KeyError, EvalSecretMissing):
        return True


def render_task_md(task: TaskSpec, feedback: Sequence[FieldProblem] = (), limits: WorkspaceLimits | None = None, train_seconds: float | None = None) -> str:
    """TASK.md for one attempt: the public part of the task only (never `[hidden_eval]`).

    ``train_seconds`` is the training-time cap on the run's train backend (default: the CPU cap)."""
    limits = limits or WorkspaceLimits()
    public, budget = task.public, task.budget
    parts = [f"# Task: {public.title}", "", public.description.strip(), ""]
    if public.example_prompt and not _is_hidden_item(task, public.example_prompt):
        parts += [f"Example prompt: `{public.example_prompt}`", f"Expected answer: `{public.example_answer}`", ""]
    parts += [
        "## Your job",
        "",
        "Write a complete RL training job that teaches a small base model this task, then call submit().",
        "The job is validated (schema, budget, a sandboxed run of your environment, the dataset); when",
        "validation fails you get the problems and another attempt. The trained model is then scored",
        "on a hidden evaluation of this task; your reward is its improvement over the untrained model.",
        "",
        "## Limits",
        "",
        f"- base models you may choose (job.toml `[model] name`): {', '.join(budget.allowed_models)}",
        f"- rollout budget: max_steps x batch_size x rollout.max_tokens <= {budget.max_rollout_tokens}",
        f"- training time: at most {budget.max_train_seconds if train_seconds is None else train_seconds:g} seconds",
        f"- dataset: between {task.data.min_dataset_size} and {task.data.max_dataset_size} items",
        f"- difficulty (job.toml `[dataset] difficulty`): between {task.data.difficulty_range[0]:g} and {task.data.difficulty_range[1]:g}",
        "- the hidden evaluation counts an answer only when it is exactly right (surrounding whitespace ignored)",
        "",
        "## Files to write",
        "",
        "### job.toml",
        "",
        "```",
        job_reference(),
        "```",
        "",
        "### The environment module",
        "",
        environment_contract(),
        "",
        "### This task's grader",
        "",
        grader_contract(task),
        "",
        "### The dataset",
        "",
        dataset_contract(task),
        "",
        "## Tools",
        "",
        "- list_files(): the files here with their sizes",
        f"- read_file(path, offset=0): a file's text ({limits.max_read_chars} characters at a time)",
        "- write_file(path, content): create or replace a text file",
        "- baseline_score(model): the untrained base model's score on this task",
        "- submit(): hand in the job for validation (needs job.toml)",
        "",
        f"Paths are relative (letters, digits, `_ . -`, at most {limits.max_depth} levels); links are",
        f"refused; files are UTF-8 text of at most {limits.max_file_bytes} bytes, at most {limits.max_files}",
        f"files and {limits.max_total_bytes} bytes in all ({TASK_FILE}, which is read-only, not counted).",
    ]
    if feedback:
        parts += ["", "## Problems with your previous attempt", ""]
        for problem in feedback:
            parts.append(f"- {printable(problem.field)}: {printable(problem.message)}. Fix: {printable(problem.fix)}")
    return "\n".join(parts) + "\n"
