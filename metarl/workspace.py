"""The trainer agent's workspace: one folder per episode attempt, reached only through JSON tools.

Layout of an attempt folder ``root``::

    root/
      files/             the agent-visible folder: TASK.md (read-only), job.toml, the
                         environment module, the dataset, anything else the agent writes
      transcript.jsonl   every tool call and its result, one JSON record a line (not reachable
                         by the tools, which only see ``files/``)

Tools (``Workspace.dispatch(tool_call_json) -> result_json``): ``list_files()``,
``read_file(path, offset=0)``, ``write_file(path, content)``, ``baseline_score(model)``,
``submit()``. A call is ``{"name": ..., "arguments": {...}}`` (``arguments`` may also be a JSON
string, and the OpenAI shape ``{"type": "function", "function": {...}, "id": ...}`` is accepted).
Every result is ``{"ok": true, "tool": ..., "result": {...}}`` or
``{"ok": false, "tool": ..., "error": {"kind": ..., "message": ..., "fix": ...}}``; nothing is
raised to the caller.

Confinement (enforced here, for every path, on every call):

- paths are relative, ``/``-separated, at most ``max_depth`` components, each matching
  ``SAFE_NAME`` (letters, digits, ``_ . -``, not starting with a dot: so no ``..``, no hidden or
  temporary files, no absolute paths, no backslashes, no NUL);
- the folder is walked one component at a time with ``openat``-style calls (``dir_fd``) and
  ``O_NOFOLLOW``, so a symbolic link anywhere on the path (planted in the folder or as a parent
  component) is refused rather than followed; a hard-linked file (``st_nlink > 1``), a FIFO, a
  device or a socket is refused too; files are written to a temporary name and renamed into
  place, which replaces a link instead of writing through it;
- per-file, file-count and total-size caps, and UTF-8 text only (no NUL bytes);
- ``TASK.md`` is read-only; the transcript lives outside ``files/``.

Nothing of a task's ``[hidden_eval]`` table is written into the folder: ``TASK.md`` is rendered
from ``[public]``, ``[data]`` bounds, ``[grader]`` and ``[budget]`` only.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticUndefined

from metarl.reward_rule import CLIP, REJECT_ABOVE
from metarl.sandbox_runner import ALLOWED_MODULES, GRADERS_MODULE
from schemas.base import FieldProblem, StrictModel, printable, problems_from_validation
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

FILES_DIR = "files"
TRANSCRIPT_FILE = "transcript.jsonl"
TASK_FILE = "TASK.md"
JOB_FILE = "job.toml"
READ_ONLY_FILES = frozenset({TASK_FILE.lower()})
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
"""One path component (the same rule as job.toml's file names)."""

ENVIRONMENT_FUNCTION = "reward"
COMPONENTS_NAME = "COMPONENTS"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_SCAN_ENTRIES = 10_000

ErrorKind = Literal[
    "bad_call",
    "bad_path",
    "not_found",
    "link_refused",
    "not_a_file",
    "not_text",
    "too_large",
    "too_many_files",
    "workspace_full",
    "read_only",
    "incomplete",
    "already_submitted",
    "baseline_unavailable",
    "too_many_calls",
    "io_error",
]
ToolName = Literal["list_files", "read_file", "write_file", "baseline_score", "submit"]
TOOL_NAMES: tuple[str, ...] = ("list_files", "read_file", "write_file", "baseline_score", "submit")


class WorkspaceLimits(StrictModel):
    """Caps of one workspace."""

    max_file_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=1024**3, description="Largest file (bytes, UTF-8)")
    max_files: int = Field(default=32, ge=1, le=10_000, description="Most files the agent may keep (TASK.md not counted)")
    max_total_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=16 * 1024**3, description="Most bytes in the agent's files (TASK.md not counted)")
    max_depth: int = Field(default=3, ge=1, le=16, description="Most path components (folder levels + the file name)")
    max_path_chars: int = Field(default=200, ge=8, le=4096, description="Longest path string")
    max_read_chars: int = Field(default=65_536, ge=256, le=16 * 1024**2, description="Characters returned by one read_file")
    max_calls: int = Field(default=400, ge=1, le=100_000, description="Tool calls per attempt")


class ToolError(BaseModel):
    """A structured tool error: what went wrong and how to fix it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ErrorKind
    message: str = Field(max_length=4000)
    fix: str = Field(max_length=2000)


class ToolResult(BaseModel):
    """The answer to one tool call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    tool: str = Field(max_length=200, description="The tool called ('(invalid)' when the call did not parse)")
    call_id: str | None = Field(default=None, max_length=200)
    result: dict[str, Any] | None = None
    error: ToolError | None = None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


class TranscriptEntry(BaseModel):
    """One tool call and its result, as recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=0)
    at: float = Field(description="Unix time of the call")
    tool: str = Field(max_length=200)
    call_id: str | None = Field(default=None, max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw: str | None = Field(default=None, max_length=2000, description="Start of an unparseable call")
    ok: bool
    result: dict[str, Any] | None = None
    error: ToolError | None = None


class WorkspaceError(Exception):
    """A refused or failed file operation; becomes a ToolError (or a FieldProblem in the probe)."""

    def __init__(self, kind: ErrorKind, message: str, fix: str):
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.fix = fix

    def as_tool_error(self) -> ToolError:
        return ToolError(kind=self.kind, message=self.message[:4000], fix=self.fix[:2000])


# ---------------------------------------------------------------------------------------------
# tool arguments


class _Args(StrictModel):
    pass


class ListFilesArgs(_Args):
    """list_files(): the files in the workspace with their sizes, and the caps."""


class ReadFileArgs(_Args):
    """read_file(path, offset=0): a UTF-8 file's text, at most max_read_chars characters from offset."""

    path: str = Field(max_length=4096, description="Relative path, e.g. job.toml")
    offset: int = Field(default=0, ge=0, le=2**40, description="First character to return (for long files)")


class WriteFileArgs(_Args):
    """write_file(path, content): create or replace a UTF-8 text file."""

    path: str = Field(max_length=4096, description="Relative path, e.g. environment.py")
    content: str = Field(description="The whole new text of the file")


class BaselineScoreArgs(_Args):
    """baseline_score(model): the untrained base model's score on this task's evaluation."""

    model: str = Field(max_length=200, description="A base model allowed for this task")


class SubmitArgs(_Args):
    """submit(): hand in the job (job.toml, the environment module, the dataset) for validation."""


ARGUMENT_MODELS: dict[str, type[_Args]] = {
    "list_files": ListFilesArgs,
    "read_file": ReadFileArgs,
    "write_file": WriteFileArgs,
    "baseline_score": BaselineScoreArgs,
    "submit": SubmitArgs,
}


def tool_specs() -> list[dict[str, Any]]:
    """Function-calling specs of the tools (name, description, JSON-schema parameters) for the policy prompt."""
    specs = []
    for name, model in ARGUMENT_MODELS.items():
        schema = model.model_json_schema()
        parameters = {
            "type": "object",
            "properties": {key: {k: v for k, v in prop.items() if k != "title"} for key, prop in schema.get("properties", {}).items()},
            "required": schema.get("required", []),
            "additionalProperties": False,
        }
        specs.append({"name": name, "description": (model.__doc__ or "").strip(), "parameters": parameters})
    return specs


# ---------------------------------------------------------------------------------------------
# confined file access (also used by the probe and the sandbox, outside any transcript)


def parse_relpath(path: object, limits: WorkspaceLimits) -> tuple[str, ...]:
    """The components of a safe relative path; WorkspaceError(bad_path) naming the rule otherwise."""
    fix = "use a relative path like `environment.py` or `data/train.jsonl`: letters, digits, `_`, `.` and `-`, not starting with `.`"
    if not isinstance(path, str):
        raise WorkspaceError("bad_path", "the path must be a string", fix)
    shown = printable(path[:100])
    if not path:
        raise WorkspaceError("bad_path", "the path is empty", fix)
    if len(path) > limits.max_path_chars:
        raise WorkspaceError("bad_path", f"the path has {len(path)} characters", f"use at most {limits.max_path_chars} characters")
    if path.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", path):
        raise WorkspaceError("bad_path", f"{shown!r} is absolute; only paths inside the workspace are allowed", fix)
    if "\\" in path:
        raise WorkspaceError("bad_path", f"{shown!r} contains a backslash", "separate folders with `/`")
    parts = path.split("/")
    for part in parts:
        if part == "..":
            raise WorkspaceError("bad_path", f"{shown!r} goes up a level (`..`); the tools cannot leave the workspace", fix)
        if part in ("", "."):
            raise WorkspaceError("bad_path", f"{shown!r} has an empty or `.` component", "write the path without `//`, `./` or a trailing `/`")
        if not SAFE_NAME.fullmatch(part):
            raise WorkspaceError("bad_path", f"{printable(part[:70])!r} is not an allowed file or folder name", fix)
    if len(parts) > limits.max_depth:
        raise WorkspaceError("bad_path", f"{shown!r} is {len(parts)} levels deep", f"use at most {limits.max_depth} levels")
    return tuple(parts)


def _kind_of(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _open_root(files_dir: Path) -> int:
    try:
        return os.open(files_dir, _DIR_FLAGS)
    except FileNotFoundError:
        raise WorkspaceError("io_error", "the workspace folder is missing", "start a new attempt") from None
    except OSError as exc:
        raise WorkspaceError("io_error", f"the workspace folder cannot be opened ({exc.strerror}); is it a link?", "start a new attempt") from None


def _open_dirs(files_dir: Path, parts: Sequence[str], create: bool) -> int:
    """An fd of the folder holding ``parts`` (all but the last component), walked without following links."""
    fd = _open_root(files_dir)
    walked: list[str] = []
    try:
        for part in parts:
            walked.append(part)
            shown = "/".join(walked)
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                mode = _kind_of(fd, part)
                if mode is None:
                    raise WorkspaceError("not_found", f"no folder {shown!r}", "call list_files() to see what exists") from None
                if stat.S_ISLNK(mode):
                    raise WorkspaceError("link_refused", f"{shown!r} is a symbolic link; links are never followed", "use a path without links") from None
                raise WorkspaceError("not_a_file", f"{shown!r} is a file, not a folder", "choose another path") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_fd(dir_fd: int, name: str, shown: str, max_bytes: int) -> bytes:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise WorkspaceError("not_found", f"no file {shown!r}", "call list_files() to see what exists") from None
    except OSError:
        mode = _kind_of(dir_fd, name)
        if mode is not None and stat.S_ISLNK(mode):
            raise WorkspaceError("link_refused", f"{shown!r} is a symbolic link; links are never followed", "write a regular file instead") from None
        raise WorkspaceError("not_a_file", f"{shown!r} cannot be opened as a file", "read a regular file") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise WorkspaceError("not_a_file", f"{shown!r} is a folder", "call list_files() to see its files")
        if not stat.S_ISREG(info.st_mode):
            raise WorkspaceError("not_a_file", f"{shown!r} is not a regular file", "read a regular file")
        if info.st_nlink > 1:
            raise WorkspaceError("link_refused", f"{shown!r} is a hard link", "write a regular file instead")
        if info.st_size > max_bytes:
            raise WorkspaceError("too_large", f"{shown!r} has {info.st_size} bytes", f"keep files under {max_bytes} bytes")
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise WorkspaceError("too_large", f"{shown!r} has more than {max_bytes} bytes", f"keep files under {max_bytes} bytes")
        return data
    finally:
        os.close(fd)


def decode_text(data: bytes, shown: str) -> str:
    """UTF-8 text without NUL; WorkspaceError(not_text) naming the byte otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkspaceError("not_text", f"{shown!r} is not valid UTF-8 (byte {exc.start})", "save the file as UTF-8 text") from None
    if "\x00" in text:
        raise WorkspaceError("not_text", f"{shown!r} contains a NUL character", "write text files only") from None
    return text


def read_workspace_bytes(files_dir: str | Path, path: str, limits: WorkspaceLimits | None = None, max_bytes: int | None = None) -> bytes:
    """Read one file of an agent folder with the tools' confinement (for the probe and the sandbox)."""
    limits = limits or WorkspaceLimits()
    parts = parse_relpath(path, limits)
    dir_fd = _open_dirs(Path(files_dir), parts[:-1], create=False)
    try:
        return _read_fd(dir_fd, parts[-1], path, max_bytes if max_bytes is not None else limits.max_file_bytes)
    finally:
        os.close(dir_fd)


def read_workspace_text(files_dir: str | Path, path: str, limits: WorkspaceLimits | None = None, max_bytes: int | None = None) -> str:
    """Like read_workspace_bytes, decoded as UTF-8 text."""
    return decode_text(read_workspace_bytes(files_dir, path, limits, max_bytes), printable(path[:100]))


class FileInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    bytes: int


class RefusedEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    reason: str


def scan_files(files_dir: str | Path, limits: WorkspaceLimits | None = None) -> tuple[list[FileInfo], list[RefusedEntry]]:
    """Regular files of the folder (sorted), and entries the tools refuse (links, special files, odd names)."""
    limits = limits or WorkspaceLimits()
    files: list[FileInfo] = []
    refused: list[RefusedEntry] = []
    seen = 0
    stack: list[tuple[tuple[str, ...], int]] = [((), _open_root(Path(files_dir)))]
    try:
        while stack:
            parts, fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    names = []
                    for entry in entries:
                        seen += 1
                        if seen > MAX_SCAN_ENTRIES:
                            raise WorkspaceError("too_many_files", f"the folder has more than {MAX_SCAN_ENTRIES} entries", "start a new attempt")
                        names.append(entry.name)
                for name in sorted(names):
                    shown = "/".join((*parts, name))
                    if name.startswith(".tmp-"):
                        continue  # an interrupted write
                    mode = _kind_of(fd, name)
                    if mode is None:
                        continue
                    if not SAFE_NAME.fullmatch(name):
                        refused.append(RefusedEntry(path=printable(shown[:200]), reason="name not allowed"))
                    elif stat.S_ISLNK(mode):
                        refused.append(RefusedEntry(path=shown, reason="symbolic link (never followed)"))
                    elif stat.S_ISDIR(mode):
                        if len(parts) + 1 >= limits.max_depth:
                            refused.append(RefusedEntry(path=shown, reason="folder too deep"))
                            continue
                        try:
                            stack.append(((*parts, name), os.open(name, _DIR_FLAGS, dir_fd=fd)))
                        except OSError:
                            refused.append(RefusedEntry(path=shown, reason="folder cannot be opened"))
                    elif stat.S_ISREG(mode):
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        if info.st_nlink > 1:
                            refused.append(RefusedEntry(path=shown, reason="hard link"))
                        else:
                            files.append(FileInfo(path=shown, bytes=info.st_size))
                    else:
                        refused.append(RefusedEntry(path=shown, reason="not a regular file"))
            finally:
                os.close(fd)
    finally:
        for _, fd in stack:
            os.close(fd)
    files.sort(key=lambda item: item.path)
    return files, refused


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


# ---------------------------------------------------------------------------------------------
# the workspace


BaselineLookup = Callable[[str], Any]
"""``model -> score``: a float in [0, 1] (or an object with a ``score`` attribute)."""


class Workspace:
    """One attempt folder and its tools; every call is recorded and never raises."""

    def __init__(
        self,
        root: str | Path,
        task: TaskSpec,
        baseline: BaselineLookup | None = None,
        limits: WorkspaceLimits | None = None,
        feedback: Sequence[FieldProblem] = (),
        train_seconds: float | None = None,
    ):
        self.root = Path(root)
        self.task = task
        self.baseline = baseline
        self.limits = limits or WorkspaceLimits()
        self.files_dir = self.root / FILES_DIR
        self.transcript_path = self.root / TRANSCRIPT_FILE
        self.transcript: list[TranscriptEntry] = []
        self.transcript_write_errors = 0
        self.submitted = False
        self.root.mkdir(parents=True, exist_ok=True)
        if self.root.is_symlink() or not self.root.is_dir():
            raise ValueError(f"workspace root {self.root} is not a folder")
        try:
            os.mkdir(self.files_dir, 0o755)
        except FileExistsError:
            pass
        self._write_bytes((TASK_FILE,), render_task_md(task, feedback, self.limits, train_seconds).encode("utf-8"))

    # -- the tools (each returns a ToolResult and records it) --

    def list_files(self) -> ToolResult:
        return self._invoke("list_files", {})

    def read_file(self, path: str, offset: int = 0) -> ToolResult:
        return self._invoke("read_file", {"path": path, "offset": offset})

    def write_file(self, path: str, content: str) -> ToolResult:
        return self._invoke("write_file", {"path": path, "content": content})

    def baseline_score(self, model: str) -> ToolResult:
        return self._invoke("baseline_score", {"model": model})

    def submit(self) -> ToolResult:
        return self._invoke("submit", {})

    def dispatch(self, tool_call: str | bytes | Mapping[str, Any]) -> str:
        """Run one JSON tool call and return the JSON result (never raises on bad input)."""
        return self.handle(tool_call).to_json()

    def handle(self, tool_call: str | bytes | Mapping[str, Any]) -> ToolResult:
        """Like dispatch, returning the ToolResult."""
        try:
            name, arguments, call_id = self._parse_call(tool_call)
        except WorkspaceError as err:
            raw = tool_call if isinstance(tool_call, str) else repr(tool_call)
            return self._record("(invalid)", {}, None, err.as_tool_error(), None, raw=printable(raw[:1000]))
        return self._invoke(name, arguments, call_id)

    # -- parsing and recording --

    def _parse_call(self, tool_call: str | bytes | Mapping[str, Any]) -> tuple[str, Any, str | None]:
        fix = 'send {"name": "<tool>", "arguments": {...}} with a tool from ' + ", ".join(TOOL_NAMES)
        max_chars = 2 * self.limits.max_file_bytes + 65_536
        data: Any = tool_call
        if isinstance(tool_call, (bytes, bytearray)):
            if len(tool_call) > max_chars:
                raise WorkspaceError("bad_call", f"the call has {len(tool_call)} bytes", f"keep a call under {max_chars} bytes")
            try:
                data = bytes(tool_call).decode("utf-8")
            except UnicodeDecodeError:
                raise WorkspaceError("bad_call", "the call is not UTF-8", fix) from None
        if isinstance(data, str):
            if len(data) > max_chars:
                raise WorkspaceError("bad_call", f"the call has {len(data)} characters", f"keep a call under {max_chars} characters")
            data = _loads(data, "the call", fix)
        if not isinstance(data, Mapping):
            raise WorkspaceError("bad_call", "the call must be a JSON object", fix)
        data = dict(data)
        call_id = data.pop("id", None)
        if call_id is not None and not isinstance(call_id, str):
            raise WorkspaceError("bad_call", "`id` must be a string", "send the call id as a string or leave it out")
        if isinstance(call_id, str):
            call_id = printable(call_id[:200])
        if "function" in data:
            if data.pop("type", "function") != "function" or set(data) != {"function"} or not isinstance(data["function"], Mapping):
                raise WorkspaceError("bad_call", 'a call with `function` must look like {"type": "function", "function": {...}}', fix)
            data = dict(data["function"])
        unknown = set(data) - {"name", "arguments"}
        if unknown:
            raise WorkspaceError("bad_call", f"unknown key(s) {sorted(printable(str(key))[:50] for key in unknown)} in the call", fix)
        name = data.get("name")
        if not isinstance(name, str) or name not in TOOL_NAMES:
            shown = printable(name[:50]) if isinstance(name, str) else type(name).__name__
            raise WorkspaceError("bad_call", f"unknown tool {shown!r}", f"use one of {', '.join(TOOL_NAMES)}")
        arguments = data.get("arguments", {})
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            arguments = _loads(arguments, "the arguments", fix) if arguments.strip() else {}
        return name, arguments, call_id

    def _invoke(self, name: str, arguments: Any, call_id: str | None = None) -> ToolResult:
        recorded = _recordable(arguments)
        if len(self.transcript) >= self.limits.max_calls:
            error = ToolError(kind="too_many_calls", message=f"this attempt has used its {self.limits.max_calls} tool calls", fix="call submit() now")
            if name != "submit":
                return self._record(name, _shorten(recorded), call_id, error, None)
        try:
            if not isinstance(arguments, Mapping):
                raise WorkspaceError("bad_call", "`arguments` must be a JSON object", f"send the arguments of {name} as an object")
            try:
                args = ARGUMENT_MODELS[name].model_validate(dict(arguments))
            except ValidationError as err:
                problems = problems_from_validation(err, dict(arguments))
                message = "; ".join(f"{problem.field}: {problem.message}" for problem in problems[:5])
                raise WorkspaceError(
                    "bad_call", f"bad arguments for {name}: {printable(message)[:1500]}", f"call {name} as described: {ARGUMENT_MODELS[name].__doc__}"
                ) from None
            if self.submitted:
                raise WorkspaceError("already_submitted", "the job was already submitted", "wait for the validation result")
            result = getattr(self, f"_tool_{name}")(args)
        except WorkspaceError as err:
            return self._record(name, recorded, call_id, err.as_tool_error(), None)
        except OSError as exc:
            error = ToolError(
                kind="io_error", message=f"the file system refused the operation ({exc.strerror or type(exc).__name__})", fix="try again or choose another path"
            )
            return self._record(name, recorded, call_id, error, None)
        return self._record(name, recorded, call_id, None, result)

    def _record(
        self, tool: str, arguments: dict[str, Any], call_id: str | None, error: ToolError | None, result: dict[str, Any] | None, raw: str | None = None
    ) -> ToolResult:
        entry = TranscriptEntry(
            seq=len(self.transcript), at=time.time(), tool=tool, call_id=call_id, arguments=arguments, raw=raw, ok=error is None, result=result, error=error
        )
        self.transcript.append(entry)
        try:
            fd = os.open(self.transcript_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                # ASCII JSON: no raw U+0085/U+2028 that some line splitters treat as line ends
                os.write(fd, (json.dumps(entry.model_dump(mode="json"), ensure_ascii=True) + "\n").encode("ascii"))
            finally:
                os.close(fd)
        except OSError:
            self.transcript_write_errors += 1
        return ToolResult(ok=error is None, tool=tool, call_id=call_id, result=result, error=error)

    # -- tool bodies --

    def _usage(self) -> tuple[list[FileInfo], list[RefusedEntry], int]:
        """All files, refused entries, and the bytes that count against the caps (TASK.md does not)."""
        files, refused = scan_files(self.files_dir, self.limits)
        return files, refused, sum(item.bytes for item in files if item.path.lower() not in READ_ONLY_FILES)

    def _tool_list_files(self, args: ListFilesArgs) -> dict[str, Any]:
        files, refused, total = self._usage()
        result: dict[str, Any] = {
            "files": [item.model_dump() for item in files],
            "total_bytes": total,
            "note": f"{TASK_FILE} is read-only and does not count against the limits",
            "limits": {"max_file_bytes": self.limits.max_file_bytes, "max_files": self.limits.max_files, "max_total_bytes": self.limits.max_total_bytes},
        }
        if refused:
            result["refused"] = [item.model_dump() for item in refused[:50]]
        return result

    def _tool_read_file(self, args: ReadFileArgs) -> dict[str, Any]:
        text = read_workspace_text(self.files_dir, args.path, self.limits)
        window = text[args.offset : args.offset + self.limits.max_read_chars]
        result: dict[str, Any] = {"path": args.path, "content": window, "total_chars": len(text)}
        end = args.offset + len(window)
        if end < len(text):
            result["truncated"] = True
            result["next_offset"] = end
        return result

    def _tool_write_file(self, args: WriteFileArgs) -> dict[str, Any]:
        parts = parse_relpath(args.path, self.limits)
        if len(parts) == 1 and parts[0].lower() in READ_ONLY_FILES:
            raise WorkspaceError("read_only", f"{args.path} is read-only", "write your job to job.toml, the environment module and the dataset")
        try:
            data = args.content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise WorkspaceError("not_text", f"the content is not valid Unicode text (character {exc.start})", "write UTF-8 text only") from None
        if "\x00" in args.content:
            raise WorkspaceError("not_text", "the content contains a NUL character", "write text files only")
        if len(data) > self.limits.max_file_bytes:
            raise WorkspaceError("too_large", f"the content has {len(data)} bytes", f"keep files under {self.limits.max_file_bytes} bytes")
        files, _, total = self._usage()
        files = [item for item in files if item.path.lower() not in READ_ONLY_FILES]
        existing = next((item for item in files if item.path == "/".join(parts)), None)
        count = len(files) + (0 if existing else 1)
        if count > self.limits.max_files:
            raise WorkspaceError(
                "too_many_files",
                f"the workspace already has {len(files)} files of yours",
                f"keep at most {self.limits.max_files} files; overwrite an existing one",
            )
        new_total = total - (existing.bytes if existing else 0) + len(data)
        if new_total > self.limits.max_total_bytes:
            raise WorkspaceError(
                "workspace_full", f"the files would use {new_total} bytes", f"keep all files under {self.limits.max_total_bytes} bytes in total"
            )
        self._write_bytes(parts, data)
        return {"path": args.path, "bytes": len(data), "created": existing is None, "files": count, "total_bytes": new_total}

    def _write_bytes(self, parts: tuple[str, ...], data: bytes) -> None:
        shown = "/".join(parts)
        dir_fd = _open_dirs(self.files_dir, parts[:-1], create=True)
        try:
            name = parts[-1]
            mode = _kind_of(dir_fd, name)
            if mode is not None and stat.S_ISLNK(mode):
                raise WorkspaceError("link_refused", f"{shown!r} is a symbolic link; links are never followed", "write to another name")
            if mode is not None and not stat.S_ISREG(mode):
                raise WorkspaceError("not_a_file", f"{shown!r} is not a regular file", "write to another name")
            temp = f".tmp-{secrets.token_hex(8)}"
            fd = os.open(temp, _WRITE_FLAGS, 0o644, dir_fd=dir_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except BaseException:
                os.close(fd)
                os.unlink(temp, dir_fd=dir_fd)
                raise
            os.close(fd)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

    def _tool_baseline_score(self, args: BaselineScoreArgs) -> dict[str, Any]:
        allowed = self.task.budget.allowed_models
        if args.model not in allowed:
            raise WorkspaceError("bad_call", f"{printable(args.model[:100])!r} is not a model of this task", f"use one of {', '.join(allowed)}")
        if self.baseline is None:
            raise WorkspaceError("baseline_unavailable", "no baseline scores are available in this run", "choose a model without it")
        try:
            value = self.baseline(args.model)
        except Exception as exc:  # noqa: BLE001 - only the type is reported: messages may hold secrets
            raise WorkspaceError(
                "baseline_unavailable", f"the baseline lookup failed ({type(exc).__name__})", "try again later or choose a model without it"
            ) from None
        score = getattr(value, "score", value)
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise WorkspaceError("baseline_unavailable", "the baseline lookup gave no score", "try again later or choose a model without it")
        return {"model": args.model, "score": float(score)}

    def _tool_submit(self, args: SubmitArgs) -> dict[str, Any]:
        try:
            read_workspace_bytes(self.files_dir, JOB_FILE, self.limits)
        except WorkspaceError as err:
            raise WorkspaceError("incomplete", f"cannot submit: {err.message}", f"write {JOB_FILE} first (see {TASK_FILE})") from None
        files, _, _ = self._usage()
        self.submitted = True
        return {"submitted": True, "files": [item.path for item in files]}


def _loads(text: str, what: str, fix: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise WorkspaceError("bad_call", f"{what} is nested too deeply", fix) from None
    except ValueError as exc:
        raise WorkspaceError("bad_call", f"{what} is not valid JSON ({printable(str(exc))[:200]})", fix) from None


def _clean(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy: strings made encodable (lone surrogates escaped), odd values as text."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= 20:
        return "(nested too deeply)"
    if isinstance(value, Mapping):
        return {_clean(str(key)): _clean(item, depth + 1) for key, item in list(value.items())[:1000]}
    if isinstance(value, (list, tuple)):
        return [_clean(item, depth + 1) for item in list(value)[:1000]]
    return f"({type(value).__name__})"


def _recordable(arguments: Any) -> dict[str, Any]:
    """The arguments as a JSON-safe dict for the transcript."""
    cleaned = _clean(arguments)
    return cleaned if isinstance(cleaned, dict) else {"(arguments)": cleaned}


def _shorten(arguments: dict[str, Any]) -> dict[str, Any]:
    return {key: (value[:200] + "..." if isinstance(value, str) and len(value) > 200 else value) for key, value in arguments.items()}
