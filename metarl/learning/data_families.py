"""Task families defined by files alone: a spec's `[items]`, `hidden_eval.path` and `[grader]`.

:func:`family_for` is the family of any task spec: the registered family of its name, or a
:class:`DataFamily` built from its data files. :func:`data_problems` checks those files (every
problem at once, each naming the file, the line and the field, with a fix) for
:func:`metarl.runconfig.load_task_spec` and ``metarl tasks check``.

Contamination for a data-defined family: a prompt is a hidden-eval item when it equals a hidden
prompt exactly or after normalisation (:func:`normalised_prompt`: Unicode NFKC, case-folded,
whitespace removed), or (for a generator) when the generator's canonical key says so.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import random
import stat
import unicodedata
from pathlib import Path

from pydantic import ValidationError

from metarl import graders
from metarl.learning.families import MAX_GENERATION_ATTEMPTS, Example, TaskFamily
from metarl.learning.grader_plugins import grader_problems
from schemas.base import FieldProblem
from schemas.config_error import printable
from schemas.task_spec import TaskSpec

MAX_DATA_FILE_BYTES = 50_000_000
MAX_LINE_PROBLEMS = 20
EXACT_GRADER = {"kind": "exact", "case_sensitive": True, "charset": "any", "min_chars": 1, "max_chars": 100, "format_pattern": None}


def normalised_prompt(prompt: str) -> str:
    """A prompt's normalised form for contamination checks: NFKC, case-folded, whitespace removed."""
    return "".join(unicodedata.normalize("NFKC", prompt).casefold().split())


def line_problem(line: str) -> tuple[Example | None, str | None, str]:
    """(item, the bad field or None, the message) of one JSONL line; the item is None when the line is bad."""
    try:
        data = json.loads(line)
    except RecursionError:
        return None, "(line)", "is nested too deeply"
    except ValueError as exc:
        return None, "(line)", f"is not valid JSON ({printable(str(exc))[:120]})"
    if not isinstance(data, dict):
        return None, "(line)", f"is a JSON {type(data).__name__}, not an object"
    for key in ("prompt", "answer"):
        if key not in data:
            return None, key, "is missing"
        if not isinstance(data[key], str):
            return None, key, f"is a JSON {type(data[key]).__name__}, not a string"
    extra = sorted(printable(str(key))[:40] for key in data if key not in ("prompt", "answer"))
    if extra:
        return None, extra[0], "is not an item field (only prompt and answer)"
    try:
        return Example(prompt=data["prompt"], answer=data["answer"]), None, ""
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        return None, ".".join(str(part) for part in first["loc"]), str(first["msg"])


class DataFileError(Exception):
    """A spec's data file that cannot be used: what is wrong with it (``message``, naming the file) and the ``fix``."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


NOT_REGULAR_FIX = "give a regular JSONL file (not a device, FIFO, socket or folder), relative to the spec file"


def _kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_regular_file(path: Path, shown: str, max_bytes: int = MAX_DATA_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; :class:`DataFileError` for anything else.

    Devices, FIFOs and sockets are refused before they are opened (``stat``), and again on the open
    descriptor (``fstat``, in case the path changed in between); the file is opened non-blocking, so a
    FIFO swapped in never blocks, and at most ``max_bytes + 1`` bytes are read, so a file that grows
    (or lies about its size) cannot take more memory than that.
    """
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise DataFileError(f"{shown} is {_kind_of(mode)}, not a regular file", NOT_REGULAR_FIX)
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DataFileError(f"{shown} does not exist", "give a JSONL file, relative to the spec file") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket or a FIFO without a writer swapped in after the stat
            raise DataFileError(f"{shown} is not a regular file", NOT_REGULAR_FIX) from None
        raise DataFileError(f"{shown} cannot be read: {exc.strerror}", "make the file readable") from None
    except ValueError as exc:  # an embedded NUL byte
        raise DataFileError(f"{shown} is not a usable path: {exc}", "give a JSONL file, relative to the spec file") from None
    with os.fdopen(descriptor, "rb", buffering=0) as handle:
        try:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise DataFileError(f"{shown} is {_kind_of(info.st_mode)}, not a regular file", NOT_REGULAR_FIX)
            chunks: list[bytes] = []
            total = 0
            while total <= max_bytes:
                chunk = handle.read(min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        except OSError as exc:
            raise DataFileError(f"{shown} cannot be read: {exc.strerror}", "make the file readable") from None
    if total > max_bytes:
        raise DataFileError(f"{shown} is larger than {max_bytes} bytes", f"keep it under {max_bytes} bytes")
    return b"".join(chunks)


def read_items(path: Path, shown: str, field: str) -> tuple[list[Example], list[FieldProblem], list[int]]:
    """The items of a JSONL file, one problem per bad line (``shown`` names the file in messages) and each item's line number."""
    try:
        text = read_regular_file(path, shown).decode("utf-8")
    except DataFileError as exc:
        return [], [FieldProblem(field=field, message=exc.message, fix=exc.fix)], []
    except UnicodeDecodeError as exc:
        return [], [FieldProblem(field=field, message=f"{shown} is not UTF-8 at byte {exc.start}", fix="save the file as UTF-8")], []
    items: list[Example] = []
    lines: list[int] = []
    problems: list[FieldProblem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        item, bad_field, message = line_problem(line)
        if item is not None:
            items.append(item)
            lines.append(number)
        elif len(problems) < MAX_LINE_PROBLEMS:
            fix = 'write one JSON object per line: {"prompt": "...", "answer": "..."} (strings, prompt up to 200 and answer up to 100 characters)'
            problems.append(FieldProblem(field=f"{field} ({shown} line {number}) {bad_field}", message=message, fix=fix))
    if not items and not problems:
        problems.append(FieldProblem(field=field, message=f"{shown} has no items", fix='add lines {"prompt": "...", "answer": "..."}'))
    return items, problems, lines


class DataFamily(TaskFamily):
    """A family from a spec's files: items from a JSONL pool or a registered generator, a JSONL or generated hidden eval, a grader (built-in or plugin)."""

    def __init__(
        self,
        name: str,
        description: str,
        grader: graders.Grader,
        *,
        pool: list[Example] | None = None,
        generator: TaskFamily | None = None,
        hidden: list[Example] | None = None,
    ) -> None:
        if (pool is None) == (generator is None):
            raise ValueError("a data family takes exactly one of pool and generator")
        if pool is not None and hidden is None:
            raise ValueError("a family with a pool of items needs a hidden-eval file")
        self.name = name
        self.description = description
        self.grader = grader
        self.generator = generator
        self.hidden = hidden
        self.hidden_prompts = {normalised_prompt(item.prompt) for item in hidden or []}
        self.hidden_keys = {self.item_key(item.prompt) for item in hidden or []}
        self.pool = [item for item in pool or [] if not self.is_hidden_eval_item(item.prompt)]
        if pool is not None and not self.pool:
            raise ValueError(f"family {name!r}: every pool item is in the hidden eval")
        answers = [item.answer for item in (pool or []) + (hidden or [])]
        self.max_answer_chars = generator.max_answer_chars if generator is not None else max(len(answer) for answer in answers)

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        if self.generator is not None:
            return self.generator.sample_item(rng, difficulty)
        return rng.choice(self.pool)

    def item_key(self, prompt: str) -> str:
        if self.generator is not None:
            return self.generator.item_key(prompt)
        return normalised_prompt(prompt)

    def is_hidden_eval_item(self, prompt: str, secret: bytes | None = None) -> bool:
        if self.hidden is not None:
            return normalised_prompt(prompt) in self.hidden_prompts or self.item_key(prompt) in self.hidden_keys
        assert self.generator is not None
        return self.generator.is_hidden_eval_item(prompt, secret)

    def generate(self, rng: random.Random, difficulty: float, secret: bytes | None = None) -> Example:
        if self.generator is None:
            return rng.choice(self.pool)
        if self.hidden is None:
            return self.generator.generate(rng, difficulty, secret)
        for _ in range(MAX_GENERATION_ATTEMPTS):
            example = self.generator.generate(rng, difficulty, secret)
            if not self.is_hidden_eval_item(example.prompt):
                return example
        raise RuntimeError(f"family {self.name!r}: no training item found at difficulty {difficulty}")

    def hidden_eval(self, n: int, version: int = 1, secret: bytes | None = None) -> list[Example]:
        if self.hidden is not None:
            if len(self.hidden) < n:
                raise RuntimeError(f"family {self.name!r}: the hidden-eval file has {len(self.hidden)} items, fewer than n_items = {n}")
            return list(self.hidden[:n])
        assert self.generator is not None
        return self.generator.hidden_eval(n, version, secret)


class GradingFamily(TaskFamily):
    """A family that only grades (the local trainer's subprocess, given the grader by job.json): no items, no hidden eval."""

    def __init__(self, name: str, grader: graders.Grader, max_answer_chars: int) -> None:
        self.name = name
        self.description = name
        self.grader = grader
        self.max_answer_chars = max_answer_chars

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        raise RuntimeError(f"family {self.name!r} only grades here")

    def item_key(self, prompt: str) -> str:
        return normalised_prompt(prompt)


def is_data_defined(task: TaskSpec) -> bool:
    """True when the spec defines its family by files (items, a hidden-eval file or its own grader)."""
    return task.items is not None or task.hidden_eval.path is not None or task.grader is not None


def grader_mapping(task: TaskSpec, generator: TaskFamily | None) -> graders.Grader:
    """The grader of a spec's family: its `[grader]`, else the generator's own, else exact match."""
    if task.grader is not None:
        return task.grader.model_dump()
    if generator is not None:
        return generator.grader
    return dict(EXACT_GRADER)


def resolved_path(task_dir: Path | None, value: str) -> Path:
    """A spec's data path: relative to the spec's folder (absolute paths are kept)."""
    path = Path(value)
    return path if path.is_absolute() or task_dir is None else task_dir / path


def build_family(task: TaskSpec, task_dir: Path | None = None) -> tuple[TaskFamily | None, list[FieldProblem]]:
    """The family of a spec and every problem of its data files (the family is None when there is one)."""
    from metarl.learning.registry import registered_families

    families = registered_families()
    if not is_data_defined(task):
        if task.family in families:
            return families[task.family], []
        return None, [
            FieldProblem(
                field="family",
                message=f"unknown task family {printable(task.family)!r}",
                fix=f"use one of {', '.join(sorted(families))} or define it with [items]",
            )
        ]
    problems: list[FieldProblem] = []
    generator_name = task.items.generator if task.items is not None else task.family
    generator = families.get(generator_name) if generator_name else None
    if task.items is not None and task.family in families:
        problems.append(
            FieldProblem(
                field="family",
                message=f"{task.family!r} is a registered family; [items] defines a new one",
                fix="give the family defined by [items] its own name",
            )
        )
    if generator_name is not None and generator is None:
        where = "items.generator" if task.items is not None else "family"
        problems.append(FieldProblem(field=where, message=f"unknown generator {printable(generator_name)!r}", fix=f"use one of {', '.join(sorted(families))}"))
    pool: list[Example] | None = None
    pool_lines: list[int] = []
    hidden_lines: list[int] = []
    if task.items is not None and task.items.pool is not None:
        pool, found, pool_lines = read_items(resolved_path(task_dir, task.items.pool), task.items.pool, "items.pool")
        problems += found
    hidden: list[Example] | None = None
    if task.hidden_eval.path is not None:
        hidden, found, hidden_lines = read_items(resolved_path(task_dir, task.hidden_eval.path), task.hidden_eval.path, "hidden_eval.path")
        problems += found
        if hidden and len(hidden) < task.hidden_eval.n_items:
            problems.append(
                FieldProblem(
                    field="hidden_eval.n_items",
                    message=f"{task.hidden_eval.n_items} items asked but {task.hidden_eval.path} has {len(hidden)}",
                    fix=f"set n_items <= {len(hidden)} or add items to the file",
                )
            )
        problems += duplicate_problems(hidden, hidden_lines, task.hidden_eval.path)
    elif pool is not None:
        problems.append(
            FieldProblem(
                field="hidden_eval.path", message="a pool of items needs a hidden-eval file", fix="set hidden_eval.path to a JSONL file of held-back items"
            )
        )
    grader = grader_mapping(task, generator)
    plugin_problems = grader_problems(grader) if task.grader is not None else []  # a registered family's own grader is checked at registration
    problems += plugin_problems
    if not plugin_problems:
        try:
            problems += answer_problems(grader, pool or [], pool_lines, task.items.pool if task.items is not None and task.items.pool else "", "items.pool")
            problems += answer_problems(grader, hidden or [], hidden_lines, task.hidden_eval.path or "", "hidden_eval.path")
        except graders.PluginGraderError as exc:
            problems.append(
                FieldProblem(field="grader.plugin", message=printable(str(exc))[:500], fix="fix the plugin grader: it must return scores in [0, 1] and bools")
            )
    if pool and hidden:
        problems += overlap_problems(pool, pool_lines, hidden, task.items.pool if task.items is not None and task.items.pool else "")
    if problems:
        return None, problems
    try:
        family = DataFamily(task.family, task.public.description, grader, pool=pool, generator=None if pool is not None else generator, hidden=hidden)
    except ValueError as exc:
        return None, [FieldProblem(field="items.pool", message=str(exc), fix="add training items that are not in the hidden eval")]
    return family, []


def overlap_problems(pool: list[Example], lines: list[int], hidden: list[Example], shown: str) -> list[FieldProblem]:
    """One problem per pool item whose prompt is a hidden-eval prompt (exactly or after normalisation)."""
    hidden_prompts = {normalised_prompt(item.prompt) for item in hidden}
    problems: list[FieldProblem] = []
    for index, item in zip(lines, pool):
        if normalised_prompt(item.prompt) in hidden_prompts and len(problems) < MAX_LINE_PROBLEMS:
            problems.append(
                FieldProblem(
                    field=f"items.pool ({shown} line {index}) prompt",
                    message="is a hidden-eval prompt (same text after normalising case and whitespace)",
                    fix="remove the item from the training pool: hidden-eval items must stay out of training",
                )
            )
    return problems


def duplicate_problems(items: list[Example], lines: list[int], shown: str) -> list[FieldProblem]:
    """One problem per hidden-eval prompt that repeats an earlier one (after normalisation)."""
    seen: dict[str, int] = {}
    problems: list[FieldProblem] = []
    for index, item in zip(lines, items):
        key = normalised_prompt(item.prompt)
        if key in seen and len(problems) < MAX_LINE_PROBLEMS:
            problems.append(
                FieldProblem(field=f"hidden_eval.path ({shown} line {index}) prompt", message=f"repeats line {seen[key]}", fix="keep each hidden prompt once")
            )
        seen.setdefault(key, index)
    return problems


def answer_problems(grader: graders.Grader, items: list[Example], lines: list[int], shown: str, field: str) -> list[FieldProblem]:
    """One problem per reference answer its own grader would not give full marks (for example not one of the choices)."""
    problems: list[FieldProblem] = []
    for index, item in zip(lines, items):
        if graders.grade(grader, item.answer, item.answer) == 1.0 and graders.is_well_formed(grader, item.answer):
            continue
        if len(problems) < MAX_LINE_PROBLEMS:
            problems.append(
                FieldProblem(
                    field=f"{field} ({shown} line {index}) answer",
                    message=f"answer {printable(item.answer)[:60]!r} is not a well-formed answer for the {grader['kind']} grader",
                    fix="correct the answer or the [grader] options (choices, charset, max_chars, format_pattern)",
                )
            )
    return problems


@functools.lru_cache(maxsize=64)
def _family_from_json(task_json: str) -> TaskFamily:
    task = TaskSpec.model_validate_json(task_json)
    family, problems = build_family(task)
    if family is None:
        raise KeyError(f"task {task.id!r}: " + "; ".join(f"{problem.field}: {problem.message}" for problem in problems))
    return family


def family_for(task: TaskSpec) -> TaskFamily:
    """The family of a task spec (paths already resolved by metarl.runconfig.load_task_spec); ``KeyError`` when it cannot be built."""
    if not is_data_defined(task):
        from metarl.learning.registry import registered_family

        return registered_family(task.family)
    return _family_from_json(task.model_dump_json())


def model_families(task: TaskSpec) -> dict[str, TaskFamily]:
    """The families a base model for ``task`` is pretrained on: the built-in ones, plus the task's own when it is another.

    A task of a built-in family keeps the built-in set (and its model); a new family gets a model
    that also knows its format, keyed by its content (:func:`metarl.learning.models.build_key`).
    """
    from metarl.learning.registry import FAMILIES

    families: dict[str, TaskFamily] = dict(FAMILIES)
    own = family_for(task)
    if own.name not in families:
        families[own.name] = own
    return families
