"""The agent's tools on one attempt folder (:class:`Workspace`): their argument models, their JSON specs, and the
transcript every call is recorded in."""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metarl.workspace.files import (
    FILES_DIR,
    JOB_FILE,
    READ_ONLY_FILES,
    TASK_FILE,
    TRANSCRIPT_FILE,
    WRITE_FLAGS,
    FileInfo,
    RefusedEntry,
    ToolError,
    WorkspaceError,
    WorkspaceLimits,
    kind_of,
    open_dirs,
    parse_relpath,
    read_workspace_bytes,
    read_workspace_text,
    scan_files,
)
from metarl.workspace.task_md import (
    render_task_md,
)
from schemas.base import FieldProblem, StrictModel, printable, problems_from_validation
from schemas.task_spec import TaskSpec

ToolName = Literal["list_files", "read_file", "write_file", "baseline_score", "submit"]
TOOL_NAMES: tuple[str, ...] = ("list_files", "read_file", "write_file", "baseline_score", "submit")


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
        dir_fd = open_dirs(self.files_dir, parts[:-1], create=True)
        try:
            name = parts[-1]
            mode = kind_of(dir_fd, name)
            if mode is not None and stat.S_ISLNK(mode):
                raise WorkspaceError("link_refused", f"{shown!r} is a symbolic link; links are never followed", "write to another name")
            if mode is not None and not stat.S_ISREG(mode):
                raise WorkspaceError("not_a_file", f"{shown!r} is not a regular file", "write to another name")
            temp = f".tmp-{secrets.token_hex(8)}"
            fd = os.open(temp, WRITE_FLAGS, 0o644, dir_fd=dir_fd)
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
