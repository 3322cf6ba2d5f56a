"""Run agent-written Python (the environment/reward module) in a limited child process.

``run_in_sandbox(workspace_dir, module_file, function, args_json, limits) -> SandboxResult`` runs
one call; ``run_calls_in_sandbox`` runs many calls against one import of the module (the probe
uses it: one process for all sample items). Errors are data: ``SandboxResult.error.kind`` is one
of ``timeout``, ``memory``, ``crash``, ``forbidden``, ``bad_output`` or ``bad_input`` (the
request itself was unusable: a missing module file, arguments that are not JSON).

What is enforced, and how
-------------------------

The parent (this module):

- reads the module file itself, with the workspace tools' confinement (relative safe path, no
  links, size cap, UTF-8), and sends its source on stdin; the child never needs to open it;
- starts ``python -I -S -B metarl/sandbox_runner.py``: isolated mode (no ``PYTHON*`` variables,
  no user site, no current directory or script directory on ``sys.path``), no ``site`` (so
  site-packages are not importable), no bytecode writing;
- passes an almost empty environment (``PATH=/usr/bin:/bin`` and ``LC_ALL=C.UTF-8``): no
  secrets, whatever the worker's own environment holds;
- cwd = the workspace folder, ``close_fds=True``, a new session (its own process group);
- a wall-clock deadline, after which the whole process group is killed with SIGKILL;
- caps on what it reads back: the result frame (``stdout_bytes``) and stderr (only a tail of
  ``stderr_tail_chars`` is kept; a child that writes more than ``max_stderr_bytes`` is killed);
- validates the result frame (size, JSON, shape) before trusting any of it.

The child (``metarl/sandbox_runner.py``, see its docstring for the order of steps):

- RLIMIT_CPU (SIGXCPU at the soft limit, SIGKILL one second later), RLIMIT_AS (memory),
  RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE = 0, RLIMIT_NPROC = 0;
- a new network namespace (``unshare(CLONE_NEWNET)`` through ctypes, as Python 3.11 has no
  ``os.unshare``; with a user namespace when not root), so there is no network device at all;
- when started as root: ``setgroups([])``, ``setgid``/``setuid`` to ``nobody`` (65534), so that
  RLIMIT_NPROC applies (root ignores it), signals to other users' processes fail, and ordinary
  file permissions hold (e.g. ``/proc/<worker>/environ`` is unreadable); ``no_new_privs``;
  not dumpable (no ptrace or /proc/<pid>/mem from other ``nobody`` processes);
- imports limited to an allowlist of pure stdlib modules, imported before the hook;
- an audit hook (``sys.addaudithook``) that denies every event not on an allowlist: ``os.fork``,
  ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``, ``subprocess.Popen``,
  ``socket.*``, ``ctypes.*``, ``os.kill``, ``signal.pthread_kill``, ``resource.setrlimit``, file
  changes (``os.remove``, ``os.rename``, ``os.mkdir``, ``os.symlink``, ``os.link``, ``os.chmod``,
  ...), ``gc.get_objects``/``get_referrers``, ``sys.addaudithook``, ``sys.settrace`` and the
  rest; ``open`` only for reading plain files lexically inside the workspace or the stdlib with
  no symbolic link on the way (a write mode or flag, a file descriptor, a non-``str`` path, ``..``
  or an absolute path elsewhere is denied); ``os.listdir``/``os.scandir`` only inside the
  workspace. A denied event ends the child at once with a ``forbidden`` frame (it cannot be
  caught by the agent's code). The hook uses only values captured before the agent's code
  runs, so monkeypatching ``os``, ``builtins`` or ``str`` subclasses cannot change its decisions.

Residual risks (be honest about them)
-------------------------------------

- Audit hooks are not a security boundary. They are a tripwire inside the same interpreter:
  memory corruption (a crafted ``marshal`` blob or code object, a CPython bug, a C-level stack
  overflow) runs native code that no hook sees. The layers the kernel enforces are the ones that
  hold against such code: the rlimits, the network namespace, and (when started as root) the
  ``nobody`` user with no capabilities. Where ``unshare`` is refused (some containers) or the
  worker does not run as root, those layers are partly missing; ``SandboxResult.isolation``
  says which layers were in place for a run.
- ``nobody`` can still read world-readable files (``/etc/passwd``) if the hook is bypassed, and
  two sandboxed children (both ``nobody``) could signal each other. ``stat``, ``readlink`` and
  ``os.getcwd`` have no audit events: the child can learn whether paths exist and their sizes.
- The child can write to its own result channel (fd), forging its frame. That only lets agent
  code claim results it could have computed anyway; the parent still validates size and shape.
- No seccomp filter, no mount namespace (the file system is visible, subject to permissions),
  no cgroup (RLIMIT_AS bounds address space, not RSS; a child can still use the CPU for its
  CPU-seconds limit and the wall clock until the deadline).

Stronger isolation would run the child in a container or micro-VM (gVisor, Firecracker,
nsjail/bubblewrap with a seccomp allowlist, a read-only bind mount of only the stdlib and the
workspace, a PID namespace and a memory cgroup); the request/frame protocol here would stay.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from metarl.errors import MetarlError
from metarl.workspace import WorkspaceError, WorkspaceLimits, read_workspace_text
from schemas.base import StrictModel, printable

RUNNER = Path(__file__).with_name("sandbox_runner.py")
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
NOBODY = 65534

ErrorKind = Literal["timeout", "memory", "crash", "forbidden", "bad_output", "bad_input"]


class SandboxUnavailable(MetarlError):
    """The sandbox itself could not run (the child could not be started, or its set-up before the
    agent's code failed, e.g. the privilege drop). Raised, not returned: it is not the agent's
    fault, so it must not become probe feedback; the caller retries or fails the stage."""

FIXES: dict[str, str] = {
    "timeout": "make the module fast: no unbounded loops or sleeps, cheap top-level code",
    "memory": "use far less memory: no huge lists, strings or tables",
    "crash": "fix the error (see message and line)",
    "forbidden": "compute the reward from the function's arguments only: no files outside the workspace, writes, network, processes, threads or interpreter tricks",
    "bad_output": "return a finite number (a plain float or int) and print little",
    "bad_input": "check the module file name and the arguments",
}


class SandboxLimits(StrictModel):
    """Limits of one sandboxed run."""

    cpu_seconds: int = Field(default=5, ge=1, le=3600, description="CPU seconds (RLIMIT_CPU)")
    wall_seconds: float = Field(default=15.0, gt=0, le=3600, description="Wall-clock deadline, start-up included")
    memory_bytes: int = Field(default=512 * 1024**2, ge=64 * 1024**2, le=64 * 1024**3, description="Address space (RLIMIT_AS)")
    file_size_bytes: int = Field(default=1024**2, ge=0, le=1024**3, description="Largest file the child may write (RLIMIT_FSIZE)")
    open_files: int = Field(default=32, ge=8, le=4096, description="Open file descriptors (RLIMIT_NOFILE)")
    stdout_bytes: int = Field(default=8 * 1024**2, ge=1024, le=1024**3, description="Largest result frame")
    max_stderr_bytes: int = Field(default=16 * 1024**2, ge=1024, le=1024**3, description="Stderr beyond this kills the child")
    stderr_tail_chars: int = Field(default=4000, ge=0, le=100_000, description="Characters of stderr kept in the result")
    max_source_bytes: int = Field(default=1024**2, ge=1, le=64 * 1024**2, description="Largest module file")
    max_request_bytes: int = Field(default=16 * 1024**2, ge=1024, le=30 * 1024**2, description="Largest request (source + arguments)")
    isolate_network: bool = Field(default=True, description="Try a new network namespace")
    drop_privileges: bool = Field(default=True, description="When root, run the child as nobody")


class SandboxError(BaseModel):
    """Why a run (or one call) failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ErrorKind
    message: str = Field(max_length=4000)
    fix: str = Field(max_length=1000)
    exception_type: str | None = Field(default=None, max_length=200)
    line: int | None = Field(default=None, description="Line of the module file where it happened")
    event: str | None = Field(default=None, max_length=200, description="The refused audit event (forbidden)")


class CallOutcome(BaseModel):
    """The outcome of one call of a batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    value: JsonValue = None
    error: SandboxError | None = None


class ModuleExports(BaseModel):
    """What the module defines, as reported by the child."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    functions: list[str] = Field(default_factory=list, max_length=100)
    components: list[str] | None = Field(default=None, max_length=64)
    components_problem: str | None = Field(default=None, max_length=2000)


class SandboxCall(StrictModel):
    """One call: ``function(*args, **kwargs)``, or ``function[key](...)`` for a dict of functions."""

    function: str = Field(min_length=1, max_length=200)
    key: str | None = Field(default=None, max_length=200)
    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)


class SandboxResult(BaseModel):
    """Outcome of one sandboxed run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool = Field(description="The module imported and (for a single call) the call returned a JSON value")
    value: JsonValue = Field(default=None, description="The return value of a single call")
    error: SandboxError | None = None
    calls: list[CallOutcome] = Field(default_factory=list, description="Per-call outcomes of a batch")
    exports: ModuleExports | None = None
    stderr_tail: str = Field(default="", description="The end of the child's stderr (its prints go there too)")
    wall_seconds: float = 0.0
    isolation: list[str] = Field(default_factory=list, description="Isolation layers that were in place")


def _error(kind: ErrorKind, message: str, **extra: Any) -> SandboxError:
    return SandboxError(kind=kind, message=printable(message)[:4000], fix=FIXES[kind], **extra)


def _failed(kind: ErrorKind, message: str, **extra: Any) -> SandboxResult:
    return SandboxResult(ok=False, error=_error(kind, message), **extra)


def run_in_sandbox(
    workspace_dir: str | Path,
    module_file: str,
    function: str,
    args_json: str | list[Any] | dict[str, Any] = "[]",
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Import ``module_file`` from the workspace in a sandbox and call ``function`` once.

    ``args_json`` is a JSON array of positional arguments or a JSON object of keyword
    arguments (text or already parsed). Never raises on bad input; see SandboxResult.
    """
    if isinstance(args_json, (str, bytes)):
        try:
            parsed = json.loads(args_json)
        except (ValueError, RecursionError) as exc:
            return _failed("bad_input", f"the arguments are not JSON: {exc}")
    else:
        parsed = args_json
    try:
        if isinstance(parsed, list):
            call = SandboxCall(function=function, args=parsed)
        elif isinstance(parsed, dict):
            call = SandboxCall(function=function, kwargs=parsed)
        else:
            return _failed("bad_input", "the arguments must be a JSON array (positional) or object (keyword)")
    except ValidationError as exc:
        return _failed("bad_input", f"bad call: {exc.errors(include_url=False)[0]['msg']}")
    batch = run_calls_in_sandbox(workspace_dir, module_file, [call], limits)
    if batch.error is not None or not batch.calls:
        return batch
    outcome = batch.calls[0]
    return batch.model_copy(update={"ok": outcome.ok, "value": outcome.value, "error": outcome.error})


def run_calls_in_sandbox(
    workspace_dir: str | Path,
    module_file: str,
    calls: list[SandboxCall],
    limits: SandboxLimits | None = None,
) -> SandboxResult:
    """Import the module once in a sandbox and make every call; per-call outcomes in ``calls``."""
    limits = limits or SandboxLimits()
    started = time.monotonic()
    workspace = Path(workspace_dir)
    try:
        info = os.lstat(workspace)
    except OSError:
        return _failed("bad_input", "the workspace folder does not exist")
    if not os.path.isdir(workspace) or os.path.islink(workspace):
        return _failed("bad_input", "the workspace is not a folder (or is a link)")
    try:
        source = read_workspace_text(workspace, module_file, WorkspaceLimits(), max_bytes=limits.max_source_bytes)
    except WorkspaceError as err:
        return _failed("bad_input", f"cannot read the module: {err.message} ({err.fix})")
    del info
    request = {
        "source": source,
        "filename": module_file,
        "calls": [call.model_dump(mode="json") for call in calls],
        "limits": {
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
        },
        "isolate_network": limits.isolate_network,
        "drop_privileges": limits.drop_privileges,
        "uid": NOBODY,
        "gid": NOBODY,
    }
    payload = json.dumps(request).encode("utf-8")
    if len(payload) > limits.max_request_bytes:
        return _failed("bad_input", f"the request has {len(payload)} bytes; keep the source and arguments under {limits.max_request_bytes}")
    run = _run_child(workspace, payload, limits)
    return _interpret(run, limits, len(calls), time.monotonic() - started)


class _ChildRun:
    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr_tail = bytearray()
        self.stderr_total = 0
        self.timed_out = False
        self.overflow: str | None = None
        self.status: int | None = None
        self.cpu_seconds = 0.0


def _run_child(workspace: Path, payload: bytes, limits: SandboxLimits) -> _ChildRun:
    run = _ChildRun()
    command = [sys.executable, "-I", "-S", "-B", str(RUNNER)]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workspace,
            env=dict(CHILD_ENV),
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxUnavailable(f"cannot start the sandbox child: {exc.strerror or type(exc).__name__}") from None
    deadline = time.monotonic() + limits.wall_seconds
    tail_bytes = max(limits.stderr_tail_chars * 4, 1)
    selector = selectors.DefaultSelector()
    try:
        assert process.stdin and process.stdout and process.stderr
        for stream in (process.stdin, process.stdout, process.stderr):
            os.set_blocking(stream.fileno(), False)
        pending = memoryview(payload)
        if pending:
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        selector.register(process.stdout, selectors.EVENT_READ)
        selector.register(process.stderr, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                run.timed_out = True
                break
            for key, _ in selector.select(timeout=min(remaining, 0.5)):
                stream = key.fileobj
                if stream is process.stdin:
                    try:
                        written = os.write(process.stdin.fileno(), pending[: 1 << 16])
                        pending = pending[written:]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(process.stdin)
                        process.stdin.close()
                    continue
                try:
                    chunk = os.read(stream.fileno(), 1 << 16)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(stream)
                    continue
                if stream is process.stdout:
                    run.stdout += chunk
                    if len(run.stdout) > limits.stdout_bytes:
                        run.overflow = f"the result is larger than {limits.stdout_bytes} bytes"
                else:
                    run.stderr_total += len(chunk)
                    run.stderr_tail = (run.stderr_tail + chunk)[-tail_bytes:]
                    if run.stderr_total > limits.max_stderr_bytes:
                        run.overflow = f"the module printed more than {limits.max_stderr_bytes} bytes"
            if run.overflow:
                break
    finally:
        selector.close()
        _kill_group(process.pid)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            run.cpu_seconds = usage.ru_utime + usage.ru_stime
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): status unknown
            process.returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
        run.status = process.returncode
    return run


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _interpret(run: _ChildRun, limits: SandboxLimits, n_calls: int, elapsed: float) -> SandboxResult:
    tail = run.stderr_tail.decode("utf-8", "replace")[-limits.stderr_tail_chars :] if limits.stderr_tail_chars else ""
    common: dict[str, Any] = {"stderr_tail": tail, "wall_seconds": round(elapsed, 4)}
    ready, frame, frame_problem = _parse_frame(bytes(run.stdout))
    if not ready:
        # the agent's code never ran: a failed or killed set-up is the sandbox's problem
        if frame is not None and frame.get("kind") == "bootstrap":
            raise SandboxUnavailable(printable(str(frame.get("message", "sandbox set-up failed")))[:2000])
        detail = "timed out" if run.timed_out else f"ended with status {run.status}"
        raise SandboxUnavailable(f"the sandbox set-up {detail} before running the module; stderr: {tail[-500:]}")
    if frame is not None:
        common["isolation"] = [printable(str(item))[:100] for item in frame.get("isolation", [])][:20] if isinstance(frame.get("isolation"), list) else []
    if run.timed_out:
        return _failed("timeout", f"the module ran past the wall-clock limit of {limits.wall_seconds:g} s", **common)
    if run.overflow:
        return _failed("bad_output", run.overflow, **common)
    if frame is None:
        status = run.status or 0
        if status in (-signal.SIGXCPU,) or (status == -signal.SIGKILL and run.cpu_seconds >= limits.cpu_seconds - 0.05):
            return _failed("timeout", f"the module used more than its {limits.cpu_seconds} CPU seconds", **common)
        if status == -signal.SIGXFSZ:
            return _failed("forbidden", "the module tried to write a file larger than allowed", **common)
        if "MemoryError" in tail or "Cannot allocate memory" in tail:
            return _failed("memory", f"the module ran out of memory (limit {limits.memory_bytes} bytes)", **common)
        if status < 0:
            return _failed("crash", f"the module was killed by signal {_signal_name(-status)}", **common)
        if frame_problem:
            return _failed("bad_output", frame_problem, **common)
        if status == 0:
            return _failed("bad_output", "the module ended the process without a result (os._exit?)", **common)
        return _failed("crash", f"the module's process exited with status {status}", **common)
    try:
        if frame.get("status") == "error":
            kind = frame.get("kind")
            if kind not in ("memory", "crash", "forbidden", "bad_output"):
                return _failed("bad_output", "the child reported an unknown error kind", **common)
            error = _error(
                kind,
                str(frame.get("message", "")),
                exception_type=_opt_str(frame.get("type")),
                line=_opt_int(frame.get("line")),
                event=_opt_str(frame.get("event")),
            )
            if kind == "memory":
                error = error.model_copy(update={"message": f"{error.message} (limit {limits.memory_bytes} bytes)"})
            return SandboxResult(ok=False, error=error, **common)
        if frame.get("status") != "ok" or not isinstance(frame.get("calls"), list) or len(frame["calls"]) != n_calls:
            return _failed("bad_output", "the child's result does not have the expected shape", **common)
        outcomes = [_outcome(item) for item in frame["calls"]]
        exports = ModuleExports.model_validate(frame.get("exports") or {})
    except (ValidationError, TypeError, ValueError, KeyError):
        return _failed("bad_output", "the child's result does not have the expected shape", **common)
    return SandboxResult(ok=True, calls=outcomes, exports=exports, **common)


READY = {"status": "ready"}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _parse_frame(stdout: bytes) -> tuple[bool, dict[str, Any] | None, str | None]:
    """(set-up finished, the result frame or None, why the channel is unusable or None)."""
    lines = stdout.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    frames = []
    for line in lines:
        try:
            frames.append(json.loads(line))
        except (ValueError, RecursionError):
            frames.append(None)
    ready = bool(frames) and frames[0] == READY
    body = frames[1:] if ready else frames
    if not body:
        return ready, None, None
    if len(body) != 1:
        return ready, None, "the result channel carried more than one frame"
    if not isinstance(body[0], dict):
        return ready, None, "the result frame is not a JSON object"
    return ready, body[0], None


def _opt_str(value: Any) -> str | None:
    return printable(value)[:200] if isinstance(value, str) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _outcome(item: Any) -> CallOutcome:
    if not isinstance(item, dict):
        raise TypeError("bad outcome")
    if item.get("ok") is True:
        value = item.get("value")
        if isinstance(value, float) and not math.isfinite(value):
            return CallOutcome(ok=False, error=_error("bad_output", "the function returned NaN or infinity"))
        return CallOutcome(ok=True, value=value)
    kind = item.get("kind") if item.get("kind") in ("crash", "bad_output") else "crash"
    return CallOutcome(
        ok=False,
        error=_error(kind, str(item.get("message", "")), exception_type=_opt_str(item.get("type")), line=_opt_int(item.get("line"))),
    )
