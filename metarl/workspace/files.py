"""Safe access to a workspace folder: the limits, the refusal every bad path gets, and reads, scans and writes that
walk one component at a time with ``O_NOFOLLOW`` (no link is ever followed, no hard-linked file, FIFO or device
read). The confinement rules are in :mod:`metarl.workspace`'s docstring."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.base import StrictModel, printable

FILES_DIR = "files"
TRANSCRIPT_FILE = "transcript.jsonl"
TASK_FILE = "TASK.md"
JOB_FILE = "job.toml"
READ_ONLY_FILES = frozenset({TASK_FILE.lower()})
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}")
"""One path component (the same rule as job.toml's file names)."""

ENVIRONMENT_FUNCTION = "reward"
COMPONENTS_NAME = "COMPONENTS"

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
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


def kind_of(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def open_root(files_dir: Path) -> int:
    try:
        return os.open(files_dir, DIR_FLAGS)
    except FileNotFoundError:
        raise WorkspaceError("io_error", "the workspace folder is missing", "start a new attempt") from None
    except OSError as exc:
        raise WorkspaceError("io_error", f"the workspace folder cannot be opened ({exc.strerror}); is it a link?", "start a new attempt") from None


def open_dirs(files_dir: Path, parts: Sequence[str], create: bool) -> int:
    """An fd of the folder holding ``parts`` (all but the last component), walked without following links."""
    fd = open_root(files_dir)
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
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError:
                mode = kind_of(fd, part)
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


def read_fd(dir_fd: int, name: str, shown: str, max_bytes: int) -> bytes:
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise WorkspaceError("not_found", f"no file {shown!r}", "call list_files() to see what exists") from None
    except OSError:
        mode = kind_of(dir_fd, name)
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
    dir_fd = open_dirs(Path(files_dir), parts[:-1], create=False)
    try:
        return read_fd(dir_fd, parts[-1], path, max_bytes if max_bytes is not None else limits.max_file_bytes)
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
    stack: list[tuple[tuple[str, ...], int]] = [((), open_root(Path(files_dir)))]
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
                    mode = kind_of(fd, name)
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
                            stack.append(((*parts, name), os.open(name, DIR_FLAGS, dir_fd=fd)))
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
