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

from metarl.workspace.files import (
    COMPONENTS_NAME,
    DIR_FLAGS,
    ENVIRONMENT_FUNCTION,
    FILES_DIR,
    JOB_FILE,
    MAX_SCAN_ENTRIES,
    READ_FLAGS,
    READ_ONLY_FILES,
    SAFE_NAME,
    TASK_FILE,
    TRANSCRIPT_FILE,
    WRITE_FLAGS,
    ErrorKind,
    FileInfo,
    RefusedEntry,
    ToolError,
    WorkspaceError,
    WorkspaceLimits,
    decode_text,
    kind_of,
    open_dirs,
    open_root,
    parse_relpath,
    read_fd,
    read_workspace_bytes,
    read_workspace_text,
    scan_files,
)
from metarl.workspace.task_md import (
    dataset_contract,
    environment_contract,
    grader_contract,
    job_reference,
    render_task_md,
    task_grader,
)
from metarl.workspace.tools import (
    ARGUMENT_MODELS,
    TOOL_NAMES,
    BaselineLookup,
    BaselineScoreArgs,
    ListFilesArgs,
    ReadFileArgs,
    SubmitArgs,
    ToolName,
    ToolResult,
    TranscriptEntry,
    Workspace,
    WriteFileArgs,
    tool_specs,
)

__all__ = [
    "ARGUMENT_MODELS",
    "BaselineLookup",
    "BaselineScoreArgs",
    "COMPONENTS_NAME",
    "DIR_FLAGS",
    "ENVIRONMENT_FUNCTION",
    "ErrorKind",
    "FILES_DIR",
    "FileInfo",
    "JOB_FILE",
    "ListFilesArgs",
    "MAX_SCAN_ENTRIES",
    "READ_FLAGS",
    "READ_ONLY_FILES",
    "ReadFileArgs",
    "RefusedEntry",
    "SAFE_NAME",
    "SubmitArgs",
    "TASK_FILE",
    "TOOL_NAMES",
    "TRANSCRIPT_FILE",
    "ToolError",
    "ToolName",
    "ToolResult",
    "TranscriptEntry",
    "WRITE_FLAGS",
    "Workspace",
    "WorkspaceError",
    "WorkspaceLimits",
    "WriteFileArgs",
    "dataset_contract",
    "decode_text",
    "environment_contract",
    "grader_contract",
    "job_reference",
    "kind_of",
    "open_dirs",
    "open_root",
    "parse_relpath",
    "read_fd",
    "read_workspace_bytes",
    "read_workspace_text",
    "render_task_md",
    "scan_files",
    "task_grader",
    "tool_specs",
]
