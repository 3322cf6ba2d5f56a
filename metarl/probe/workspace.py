"""Workspace-level probe checks: the environment module run in the sandbox, the dataset, contamination.

These complement :func:`metarl.probe.job.probe_job_text` (schema, semantics, budget, backend compile
check). :func:`probe_workspace` runs both on a workspace folder and returns one ProbeVerdict;
:func:`workspace_problems` is the workspace part alone. Every failure is a FieldProblem with an
actionable fix; nothing raises on bad agent input.

The environment-module contract (shown to the agent in TASK.md, see
:func:`metarl.workspace.environment_contract`):

- ``reward(prompt: str, completion: str, answer: str) -> float``: required; judged by the reward
  rule every backend applies (:mod:`metarl.reward_rule`, with the local trainer's
  :class:`metarl.probe.reward_source.RewardBounds`): a finite number of magnitude at most 1e6, counted
  clamped to [-100, 100]. On sample items of the task (drawn by the family's generator at the
  job's difficulty, from the training partition only), the reference answer's reward *after the
  clamp* must be strictly higher than each of two wrong completions' (another item's answer, or a
  mutated one, and the empty string): a module whose clamped rewards carry no signal is refused;
- ``COMPONENTS: dict[str, callable]``: optional; same signature; when present, every name in
  job.toml ``[reward.components]`` must be a key, and each named component must return numbers
  the trainer accepts on the sample items;
- the module runs exactly as the local trainer runs it (:class:`metarl.probe.reward_source.SandboxRewardSource`):
  one persistent :class:`metarl.sandbox.parent.SandboxSession` (the same runner, layout, working directory
  ``/workspace``, memory and file limits and isolation), the import first, then one batch of
  calls, under one deadline for both (``SandboxLimits.wall_seconds``, 15 s by default). The
  isolation level it ran under comes back in :attr:`metarl.probe.job.ProbeVerdict.isolation`.

The dataset (job.toml ``[dataset] path``): UTF-8 JSON Lines of ``{"prompt": str, "answer": str}``
objects (blank lines ignored) that validate as :class:`metarl.learning.families.Example`; as
many items as ``[dataset] size``, within the task's bounds; no item of the hidden-eval partition;
the longest prompt plus ``rollout.max_tokens`` within the sequence an inner job is compiled with
(:mod:`metarl.domain.sequence`: the prompt counted as its UTF-8 bytes plus the chat template, an
upper bound on its tokens, not a tokenization).
Contamination is reported as a count only: which items are hidden-eval items is never disclosed.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from metarl import reward_rule
from metarl.domain.sequence import CHAT_FRAMING_TOKENS, MIN_SEQ_LEN, PROMPT_TOKEN_BUDGET, SEQ_LEN_MULTIPLE, compiled_seq_len, prompt_tokens_at_most
from metarl.learning.data_families import family_for
from metarl.learning.families import Example, TaskFamily
from metarl.learning.registry import contaminated_prompts
from metarl.learning.reward_checks import RewardBounds
from metarl.probe.job import BackendCheck, ProbeVerdict, capped, probe_job_text
from metarl.sandbox.isolation import IsolationLevel
from metarl.sandbox.parent import (
    SandboxCall,
    SandboxLimits,
    SandboxResult,
    SandboxSession,
)
from metarl.sandbox.results import CallOutcome
from metarl.workspace import (
    COMPONENTS_NAME,
    ENVIRONMENT_FUNCTION,
    JOB_FILE,
    TASK_FILE,
    WorkspaceError,
    WorkspaceLimits,
    decode_text,
    read_workspace_bytes,
)
from schemas.base import FieldProblem, field_path, printable
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

DEFAULT_SAMPLES = 8
MAX_LINE_PROBLEMS = 5
PROBE_SEED_NAMESPACE = "metarl-probe"


def _show(text: str, limit: int = 60) -> str:
    text = printable(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def sample_items(family: TaskFamily, n: int, difficulty: float, seed: int = 0) -> list[Example]:
    """``n`` training-partition items of the family for the reward check (safe to show to the agent)."""
    rng = random.Random(f"{PROBE_SEED_NAMESPACE}\x1f{family.name}\x1f{seed}")
    return [family.generate(rng, difficulty) for _ in range(n)]


def wrong_answer(item: Example, others: Sequence[Example]) -> str:
    """A plausible wrong completion: another item's different answer, else a mutation of this one."""
    for other in others:
        if other.answer != item.answer:
            return other.answer
    for candidate in (item.answer[::-1], item.answer + "0", "x" + item.answer):
        if candidate != item.answer:
            return candidate
    return item.answer + "x"


TRAINER_BOUNDS = RewardBounds()
"""The local trainer's bounds of the reward rule (the defaults of the job's ``reward.bounds``, the
constants of :mod:`metarl.reward_rule` that the prime-rl environment uses too)."""


def _number(outcome: CallOutcome) -> float | None:
    """The reward training uses (clamped by the reward rule), or None when the trainer would fail the job on it."""
    if not outcome.ok:
        return None
    return reward_rule.training_reward(outcome.value, TRAINER_BOUNDS.clip, TRAINER_BOUNDS.reject_above)


def _clamped(outcome: CallOutcome) -> str:
    """`` (R before clamping to [-100, 100])`` when the rule's clamp changed this reward, else ``""``."""
    return reward_rule.clamp_note(outcome.value, TRAINER_BOUNDS.clip)


def _call_failure(outcome: CallOutcome) -> str:
    if not outcome.ok and outcome.error is not None:
        error = outcome.error
        where = f" (line {error.line})" if error.line else ""
        kind = f"{error.exception_type}: " if error.exception_type else ""
        return f"{kind}{error.message}{where}"
    problem = reward_rule.reward_problem(outcome.value, TRAINER_BOUNDS.reject_above)
    if problem is not None and not isinstance(outcome.value, (str, list, dict)):
        return f"{problem} (the trainer fails a job on it)"
    return f"returned {_show(json.dumps(outcome.value), 40)}, not a number"


@dataclass(frozen=True)
class EnvironmentCheck:
    """The environment module's problems and the isolation it ran under (None: it did not run)."""

    problems: list[FieldProblem]
    level: IsolationLevel | None = None
    layers: list[str] = field(default_factory=list)


def run_as_training(files_dir: str | Path, module: str, calls: list[SandboxCall], limits: SandboxLimits | None) -> SandboxResult:
    """Import the module and make ``calls`` the way the trainer's reward session does: one
    persistent sandboxed process, the import, then one batch (the result carries the exports).

    One deadline for the whole probe run: ``limits.wall_seconds`` counts from the start, for the
    start-up, the import and every call together (a probe holds its slot no longer than that).
    """
    with SandboxSession(files_dir, module, limits) as session:
        deadline = time.monotonic() + session.limits.wall_seconds
        imported = session.start()
        if not imported.ok:
            return imported
        return session.call(calls, deadline=deadline)


def environment_problems(
    files_dir: str | Path,
    job: JobSpec,
    family: TaskFamily,
    *,
    limits: SandboxLimits | None = None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> list[FieldProblem]:
    """Import the environment module in the sandbox and check the reward contract on sample items."""
    return check_environment(files_dir, job, family, limits=limits, samples=samples, seed=seed).problems


def check_environment(
    files_dir: str | Path,
    job: JobSpec,
    family: TaskFamily,
    *,
    limits: SandboxLimits | None = None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> EnvironmentCheck:
    """:func:`environment_problems` with the isolation level and layers of the run."""
    module = job.environment.module
    items = sample_items(family, samples, job.dataset.difficulty, seed)
    checks: list[tuple[Example, str]] = []
    calls: list[SandboxCall] = []
    for index, item in enumerate(items):
        others = items[index + 1 :] + items[:index]
        for completion in (item.answer, wrong_answer(item, others), ""):
            checks.append((item, completion))
            calls.append(SandboxCall(function=ENVIRONMENT_FUNCTION, args=[item.prompt, completion, item.answer]))
    component_names = list(job.reward.components)
    for name in component_names:
        for item in items:
            calls.append(SandboxCall(function=COMPONENTS_NAME, key=name, args=[item.prompt, item.answer, item.answer]))

    result = run_as_training(files_dir, module, calls, limits)
    return EnvironmentCheck(_reward_problems(result, module, checks, items, component_names), result.level, list(result.isolation))


def _reward_problems(
    result: SandboxResult, module: str, checks: list[tuple[Example, str]], items: list[Example], component_names: list[str]
) -> list[FieldProblem]:
    field = "environment.module"
    if result.error is not None:
        error = result.error
        if error.kind == "bad_input":
            return [FieldProblem(field=field, message=f"{module}: {error.message}", fix=f"write the environment module with write_file (see {TASK_FILE})")]
        where = f" at line {error.line}" if error.line else ""
        kind = f"{error.exception_type}: " if error.exception_type else ""
        return [FieldProblem(field=field, message=f"{module} failed in the sandbox ({error.kind}){where}: {kind}{error.message}", fix=error.fix)]
    exports = result.exports
    problems: list[FieldProblem] = []
    if exports is None or ENVIRONMENT_FUNCTION not in exports.functions:
        problems.append(
            FieldProblem(
                field=field,
                message=f"{module} defines no function {ENVIRONMENT_FUNCTION}(prompt, completion, answer)",
                fix=f"define `def {ENVIRONMENT_FUNCTION}(prompt: str, completion: str, answer: str) -> float` (see {TASK_FILE})",
            )
        )
    else:
        outcomes = result.calls[: len(checks)]
        failures = [(check, outcome) for check, outcome in zip(checks, outcomes) if _number(outcome) is None]
        if failures:
            (item, completion), outcome = failures[0]
            problems.append(
                FieldProblem(
                    field=field,
                    message=(
                        f"{ENVIRONMENT_FUNCTION}() failed on {len(failures)} of {len(checks)} sample calls; first: "
                        f"prompt={_show(item.prompt)}, completion={_show(completion)}, answer={_show(item.answer)}: {_call_failure(outcome)}"
                    ),
                    fix=(
                        f"return a finite float of magnitude at most {TRAINER_BOUNDS.reject_above:g} (counted clamped to "
                        f"[{-TRAINER_BOUNDS.clip:g}, {TRAINER_BOUNDS.clip:g}]) for every (prompt, completion, answer), including empty or odd completions"
                    ),
                )
            )
        else:
            rewards = [_number(outcome) for outcome in outcomes]  # as training counts them: clamped by the reward rule
            not_better = []
            for start in range(0, len(checks), 3):
                correct, wrong, empty = rewards[start : start + 3]
                assert correct is not None and wrong is not None and empty is not None
                if not correct > max(wrong, empty):
                    not_better.append(start)
            if not_better:
                start = not_better[0]
                item, wrong_text = checks[start][0], checks[start + 1][1]
                shown = [f"{rewards[index]:g}{_clamped(outcomes[index])}" for index in range(start, start + 3)]
                clamped = any(_clamped(outcome) for outcome in outcomes)
                within = (
                    f"; keep rewards within [{-TRAINER_BOUNDS.clip:g}, {TRAINER_BOUNDS.clip:g}]: every trainer clamps them to that range, "
                    "so larger ones all count the same and carry no signal"
                )
                problems.append(
                    FieldProblem(
                        field=field,
                        message=(
                            f"the correct answer does not score higher than wrong ones on {len(not_better)} of {len(items)} sample items; "
                            f"e.g. prompt={_show(item.prompt)}, answer={_show(item.answer)}: reward {shown[0]} for the answer, "
                            f"{shown[1]} for {_show(wrong_text)}, {shown[2]} for an empty completion"
                        ),
                        fix=(
                            f"make {ENVIRONMENT_FUNCTION}() give the reference answer strictly the highest reward (compare the completion with `answer`)"
                            + (within if clamped else "")
                        ),
                    )
                )
    if exports is not None and exports.components_problem:
        problems.append(
            FieldProblem(field=field, message=f"{module}: {exports.components_problem}", fix=f"define {COMPONENTS_NAME} as {{'name': function, ...}}")
        )
    elif exports is not None and exports.components is not None:
        offset = len(checks)
        for index, name in enumerate(component_names):
            component_field = field_path(("reward", "components", name), None)
            if name not in exports.components:
                problems.append(
                    FieldProblem(
                        field=component_field,
                        message=f"{_show(name)} is not a key of {COMPONENTS_NAME} in {module}",
                        fix=f"use one of {exports.components} or add {_show(name)} to {COMPONENTS_NAME}",
                    )
                )
                continue
            outcomes = result.calls[offset + index * len(items) : offset + (index + 1) * len(items)]
            failed_calls = [outcome for outcome in outcomes if _number(outcome) is None]
            if failed_calls:
                problems.append(
                    FieldProblem(
                        field=component_field,
                        message=f"component {_show(name)} failed on {len(failed_calls)} of {len(items)} sample items; first: {_call_failure(failed_calls[0])}",
                        fix=f"return a finite float of magnitude at most {TRAINER_BOUNDS.reject_above:g} for every (prompt, completion, answer)",
                    )
                )
    return problems


def dataset_problems(
    files_dir: str | Path,
    job: JobSpec,
    task: TaskSpec,
    family: TaskFamily,
    *,
    workspace_limits: WorkspaceLimits | None = None,
) -> list[FieldProblem]:
    """Format, size and contamination of the dataset file; contamination as a count only."""
    path = job.dataset.path
    try:
        text = decode_text(read_workspace_bytes(files_dir, path, workspace_limits), printable(path))
    except WorkspaceError as err:
        fix = f"write the dataset with write_file (see {TASK_FILE})" if err.kind == "not_found" else err.fix
        return [FieldProblem(field="dataset.path", message=err.message, fix=fix)]
    problems: list[FieldProblem] = []
    bad_lines: list[str] = []
    prompts: list[str] = []
    longest: tuple[int, str, int] | None = None  # line, prompt, its token bound
    count = 0
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        count += 1
        seen = len(prompts)
        problem = _line_problem(line, prompts)
        if len(prompts) > seen:
            bound = prompt_tokens_at_most(prompts[-1])
            if longest is None or bound > longest[2]:
                longest = (number, prompts[-1], bound)
        if problem:
            bad_lines.append(f"line {number}: {problem}")
    for message in bad_lines[:MAX_LINE_PROBLEMS]:
        problems.append(
            FieldProblem(field="dataset.path", message=f"{printable(path)} {message}", fix='write one JSON object per line: {"prompt": "...", "answer": "..."}')
        )
    if len(bad_lines) > MAX_LINE_PROBLEMS:
        problems.append(
            FieldProblem(field="dataset.path", message=f"{len(bad_lines) - MAX_LINE_PROBLEMS} more malformed lines not shown", fix="fix every line as above")
        )
    if count == 0:
        problems.append(
            FieldProblem(
                field="dataset.path",
                message=f"{printable(path)} has no items",
                fix=f"write between {task.data.min_dataset_size} and {task.data.max_dataset_size} items",
            )
        )
    elif count != job.dataset.size:
        problems.append(
            FieldProblem(
                field="dataset.size",
                message=f"job.toml says {job.dataset.size} items but {printable(path)} has {count}",
                fix=f"set [dataset] size = {count} or write {job.dataset.size} items",
            )
        )
        if not task.data.min_dataset_size <= count <= task.data.max_dataset_size:
            problems.append(
                FieldProblem(
                    field="dataset.path",
                    message=f"{printable(path)} has {count} items, outside [{task.data.min_dataset_size}, {task.data.max_dataset_size}]",
                    fix=f"write between {task.data.min_dataset_size} and {task.data.max_dataset_size} items",
                )
            )
    contaminated = len(contaminated_prompts(family, prompts))
    if contaminated:
        problems.append(
            FieldProblem(
                field="dataset.path",
                message=f"{contaminated} of {count} items belong to the hidden evaluation (which ones is not disclosed)",
                fix="replace items with different ones: items are matched by content (the numbers, letters or words), not wording, so rephrasing does not help",
            )
        )
    if longest is not None:
        too_long = prompt_length_problem(path, longest[0], longest[1], job.resolved().max_tokens)
        if too_long is not None:
            problems.append(too_long)
    return problems


def prompt_length_problem(path: str, line: int, prompt: str, max_tokens: int) -> FieldProblem | None:
    """The dataset's longest prompt (at ``line``) plus ``max_tokens`` against the sequence an inner job is compiled
    with (:func:`metarl.domain.sequence.compiled_seq_len`); None when it fits."""
    needed = prompt_tokens_at_most(prompt)
    seq_len = compiled_seq_len(max_tokens)
    if needed + max_tokens <= seq_len:
        return None
    fix = f"shorten the prompts to at most {seq_len - max_tokens - CHAT_FRAMING_TOKENS} UTF-8 bytes (an ASCII character is one byte, others two to four)"
    if MIN_SEQ_LEN - needed >= 1:  # max_tokens <= 256 compiles seq_len = MIN_SEQ_LEN
        fix += f", or lower rollout.max_tokens to {MIN_SEQ_LEN - needed} or less"
    return FieldProblem(
        field="dataset.path",
        message=(
            f"{printable(path)} line {line}: the longest prompt ({len(prompt.encode('utf-8'))} UTF-8 bytes: up to {needed} tokens with the chat "
            f"template) plus rollout.max_tokens = {max_tokens} exceeds the sequence an inner job is compiled with (seq_len {seq_len}: "
            f"max({MIN_SEQ_LEN}, {PROMPT_TOKEN_BUDGET} + max_tokens) rounded up to a multiple of {SEQ_LEN_MULTIPLE}); its rollouts would be cut short or fail"
        ),
        fix=fix,
    )


def _line_problem(line: str, prompts: list[str]) -> str | None:
    """Why one JSONL line is not a valid item (None when it is); collects every prompt seen."""
    try:
        data = json.loads(line)
    except RecursionError:
        return "is nested too deeply"
    except ValueError as exc:
        return f"is not valid JSON ({printable(str(exc))[:120]})"
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not an object"
    if isinstance(data.get("prompt"), str):
        prompts.append(data["prompt"])
    keys = set(data)
    if keys != {"prompt", "answer"}:
        missing, extra = sorted({"prompt", "answer"} - keys), sorted(printable(str(key))[:40] for key in keys - {"prompt", "answer"})
        parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected keys {extra[:5]}"] if extra else [])
        return "; ".join(parts)
    if not isinstance(data["prompt"], str) or not isinstance(data["answer"], str):
        return "prompt and answer must both be strings"
    try:
        Example(prompt=data["prompt"], answer=data["answer"])
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
    return None


def workspace_problems(
    files_dir: str | Path,
    job: JobSpec,
    task: TaskSpec,
    *,
    limits: SandboxLimits | None = None,
    workspace_limits: WorkspaceLimits | None = None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> list[FieldProblem]:
    """Every workspace-level problem of a parsed job: environment module, dataset, contamination."""
    try:
        family = family_for(task)
    except KeyError:
        return [FieldProblem(field="(task)", message=f"task family {task.family!r} is unknown to the probe", fix="fix the task spec (an operator problem)")]
    problems = environment_problems(files_dir, job, family, limits=limits, samples=samples, seed=seed)
    problems += dataset_problems(files_dir, job, task, family, workspace_limits=workspace_limits)
    return problems


def probe_workspace(
    files_dir: str | Path,
    task: TaskSpec,
    backend_checks: Sequence[BackendCheck] = (),
    *,
    limits: SandboxLimits | None = None,
    workspace_limits: WorkspaceLimits | None = None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> ProbeVerdict:
    """The whole probe on a workspace folder: job.toml (schema, semantics, backend) plus the workspace checks.

    Never raises on bad agent input. Raises :class:`metarl.sandbox.parent.SandboxUnavailable` when the
    sandbox itself cannot run (not the agent's fault: the probe stage retries or fails, and no
    feedback is charged to the attempt).
    """
    try:
        raw = read_workspace_bytes(files_dir, JOB_FILE, workspace_limits)
    except WorkspaceError as err:
        fix = f"write {JOB_FILE} with write_file (see {TASK_FILE})" if err.kind == "not_found" else err.fix
        return ProbeVerdict(passed=False, errors=[FieldProblem(field=JOB_FILE, message=err.message, fix=fix)])
    verdict = probe_job_text(raw, task, backend_checks)
    if verdict.job is None:
        return verdict
    try:
        family = family_for(task)
    except KeyError:
        problem = FieldProblem(field="(task)", message=f"task family {task.family!r} is unknown to the probe", fix="fix the task spec (an operator problem)")
        return ProbeVerdict(passed=False, errors=[problem], job=verdict.job)
    environment = check_environment(files_dir, verdict.job, family, limits=limits, samples=samples, seed=seed)
    problems: list[FieldProblem] = [*verdict.errors, *environment.problems]
    problems += dataset_problems(files_dir, verdict.job, task, family, workspace_limits=workspace_limits)
    return ProbeVerdict(
        passed=not problems,
        errors=capped(problems),
        job=verdict.job,
        isolation=environment.level,
        isolation_layers=environment.layers,
    )
