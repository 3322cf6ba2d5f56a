"""What a sandboxed run returns, and how the parent reads what its child wrote: the limits, the result and error
models, and the frame reader. Nothing the child says after the agent's code started is believed about the sandbox
itself; every number is checked before it is converted; a forged or malformed frame is the workspace's fault.
The parent side that starts the child is :mod:`metarl.sandbox.parent`."""

from __future__ import annotations

import json
import math
import signal
import subprocess
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from metarl.errors import MetarlError
from metarl.sandbox.isolation import IsolationLevel
from metarl.sandbox_runner import READY_STATUS
from schemas.base import StrictModel, printable

ErrorKind = Literal["timeout", "memory", "crash", "forbidden", "bad_output", "bad_input"]


class SandboxUnavailable(MetarlError):
    """The sandbox itself could not run (the child could not be started, or its set-up before the
    agent's code failed, e.g. the privilege drop). Raised, not returned: it is not the agent's
    fault, so it must not become probe feedback; the caller retries or fails the stage."""


class IsolationUnavailable(SandboxUnavailable):
    """The host cannot provide the isolation level the deployment requires (``min_isolation``).

    Not transient: retrying on the same host will not help. The message names the setting and the fixes."""


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
    isolate_network: bool = Field(default=True, description="Try a new network namespace (process isolation; full always has one)")
    drop_privileges: bool = Field(default=True, description="Ignored: a root start runs the agent's code as nobody at every level")
    min_isolation: IsolationLevel = Field(
        default="full", description="Least isolation accepted ([sandbox] min_isolation); IsolationUnavailable when the host gives less"
    )
    audit_hook: bool = Field(default=True, description="Install the audit hook (tests switch it off to check the kernel layers alone)")


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
    level: IsolationLevel | None = Field(default=None, description="Isolation level of the run (None: nothing ran)")


def sandbox_error(kind: ErrorKind, message: str, fix: str | None = None, **extra: Any) -> SandboxError:
    return SandboxError(kind=kind, message=printable(message)[:4000], fix=fix or FIXES[kind], **extra)


def failed_run(kind: ErrorKind, message: str, **extra: Any) -> SandboxResult:
    return SandboxResult(ok=False, error=sandbox_error(kind, message), **extra)


class ChildRun:
    def __init__(self, launch: Launch | None = None) -> None:
        self.stdout = bytearray()
        self.stderr_tail = bytearray()
        self.stderr_total = 0
        self.timed_out = False
        self.overflow: str | None = None
        self.status: int | None = None
        self.cpu_seconds = 0.0
        self.launch = launch


class Launch:
    """A started child: the process, its isolation level and the layers set up outside it."""

    def __init__(self, process: subprocess.Popen[bytes], level: IsolationLevel, layers: list[str]) -> None:
        self.process = process
        self.level = level
        self.layers = layers

    @property
    def bubblewrap(self) -> bool:
        """True when the child is bubblewrap (its exit status says how the runner ended)."""
        return self.level == "full"


def interpret_run(run: ChildRun, limits: SandboxLimits, n_calls: int, elapsed: float, forged: str | None = None) -> SandboxResult:
    """What a child's run means (``forged``: the caller found its frame forged, for this reason).

    Raises :class:`SandboxUnavailable` only when the set-up report is missing (the agent's code
    never ran); anything after it is the module's doing, whatever it claims.
    """
    tail = run.stderr_tail.decode("utf-8", "replace")[-limits.stderr_tail_chars :] if limits.stderr_tail_chars else ""
    common: dict[str, Any] = {"stderr_tail": tail, "wall_seconds": round(elapsed, 4)}
    ready_layers, frame, frame_problem = parse_frame(bytes(run.stdout))
    if ready_layers is None:
        # the agent's code never ran (it starts only after the set-up report): a failed or killed set-up is the sandbox's problem
        if frame is not None and frame.get("kind") == "bootstrap":
            raise SandboxUnavailable(_text(frame.get("message"))[:2000] or "sandbox set-up failed")
        detail = "timed out" if run.timed_out else f"ended with status {run.status}"
        raise SandboxUnavailable(f"the sandbox set-up {detail} before running the module; stderr: {tail[-500:]}")
    launch = run.launch
    # the layers come from the set-up report alone: a later frame is within the agent's reach, so its claims are not believed
    common["isolation"] = (list(launch.layers) if launch is not None else []) + ready_layers
    common["level"] = launch.level if launch is not None else None
    if launch is not None and launch.bubblewrap and run.status is not None and run.status > 128:
        run.status = -(run.status - 128)  # bubblewrap exits with 128 + the signal that ended the runner
    if forged is not None:
        return SandboxResult(ok=False, error=_forged(forged), **common)
    if run.timed_out:
        return failed_run("timeout", f"the module ran past the wall-clock limit of {limits.wall_seconds:g} s", **common)
    if run.overflow:
        return failed_run("bad_output", run.overflow, **common)
    if frame is None:
        status = run.status or 0
        # Under bubblewrap the runner is not bubblewrap's direct child, so its CPU seconds are not in the
        # rusage read here: a SIGKILL the sandbox did not send itself (no wall-clock or output kill) is
        # the hard CPU limit's, the only SIGKILL its own limits send.
        cpu_kill = status == -signal.SIGKILL and (run.cpu_seconds >= limits.cpu_seconds - 0.05 or (launch is not None and launch.bubblewrap))
        if status in (-signal.SIGXCPU,) or cpu_kill:
            return failed_run("timeout", f"the module used more than its {limits.cpu_seconds} CPU seconds", **common)
        if status == -signal.SIGXFSZ:
            return failed_run("forbidden", "the module tried to write a file larger than allowed", **common)
        if status == -signal.SIGSYS:
            message = "the module made a system call the sandbox forbids (seccomp: devices, other processes, mounts, namespaces, sockets...)"
            return SandboxResult(ok=False, error=sandbox_error("forbidden", message, event="seccomp"), **common)
        if "MemoryError" in tail or "Cannot allocate memory" in tail:
            return failed_run("memory", f"the module ran out of memory (limit {limits.memory_bytes} bytes)", **common)
        if status < 0:
            return failed_run("crash", f"the module was killed by signal {_signal_name(-status)}", **common)
        if frame_problem:
            return SandboxResult(ok=False, error=_forged(frame_problem), **common)
        if status == 0:
            return failed_run("bad_output", "the module ended the process without a result (os._exit?)", **common)
        return failed_run("crash", f"the module's process exited with status {status}", **common)
    try:
        return _from_frame(frame, limits, n_calls, common)
    except _ForgedFrame as forged:
        return SandboxResult(ok=False, error=_forged(str(forged)), **common)


ERROR_KINDS_AFTER_SETUP = ("memory", "crash", "forbidden", "bad_output")
"""The error kinds a frame may carry once the agent's code has started (``bootstrap`` is the set-up's alone)."""
MAX_VALUE_DEPTH = 16
"""Deepest container the runner sends in a value (sandbox_runner._plain): containers at depth 0 to 16."""
MAX_SAFE_INT = 2**53
"""Largest integer magnitude the runner sends in a value (sandbox_runner._plain)."""
MAX_LINE = 10**7
FORGED_FIX = (
    "return the reward from the function and write nothing on the sandbox's file descriptors: the result channel "
    "(fd 3) is the sandbox's, and its own reports end before the module's code starts"
)


class _ForgedFrame(Exception):
    """A frame the runner never writes: its problem, for the message."""


def _forged(problem: str) -> SandboxError:
    """The error of a forged or malformed frame: the workspace's fault (``bad_output``), its problem named."""
    return sandbox_error(
        "bad_output", f"forged or malformed result frame: {problem}; the module's code wrote on the sandbox's result channel itself", fix=FORGED_FIX
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _ready_layers(frame: Any) -> list[str] | None:
    """The isolation layers of a set-up report (None: ``frame`` is not one)."""
    if not isinstance(frame, dict) or frame.get("status") != READY_STATUS or not set(frame) <= {"status", "isolation"}:
        return None
    layers = frame.get("isolation")
    return [printable(item)[:100] for item in layers if isinstance(item, str)][:20] if isinstance(layers, list) else []


def parse_frame(stdout: bytes) -> tuple[list[str] | None, dict[str, Any] | None, str | None]:
    """(the set-up report's layers, None when set-up did not finish; the result frame or None; why the channel is unusable or None).

    The set-up report is the first line, written before the agent's code runs; everything after it
    is within the agent's reach. Never raises.
    """
    lines = stdout.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    frames = []
    for line in lines:
        try:
            frames.append(json.loads(line))
        except (ValueError, RecursionError):
            frames.append(None)
    ready = _ready_layers(frames[0]) if frames else None
    body = frames[1:] if ready is not None else frames
    if not body:
        return ready, None, None
    if len(body) != 1:
        return ready, None, "the result channel carried more than one frame"
    if not isinstance(body[0], dict):
        return ready, None, "the result frame is not a JSON object" if body[0] is not None else "the result channel carried a line that is not JSON"
    return ready, body[0], None


def _text(value: Any) -> str:
    return printable(value)[:4000] if isinstance(value, str) else ""


def _opt_str(value: Any) -> str | None:
    return printable(value)[:200] if isinstance(value, str) else None


def _opt_line(value: Any) -> int | None:
    return value if type(value) is int and 1 <= value <= MAX_LINE else None


def _value_problem(value: Any) -> str | None:
    """Why a returned value is not one the runner sends (None: it is one); the runner's own rules
    (``sandbox_runner._plain``) checked again, without recursion and without converting anything."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if item is None or kind is bool or kind is str:
            continue
        if kind is int:
            if not -MAX_SAFE_INT <= item <= MAX_SAFE_INT:
                return f"an integer beyond ±2**53 ({item.bit_length()} bits)"
        elif kind is float:
            if not math.isfinite(item):
                return "NaN or infinity"
        elif kind is list or kind is dict:
            if depth > MAX_VALUE_DEPTH:
                return f"containers nested deeper than {MAX_VALUE_DEPTH + 1} levels"
            stack.extend((child, depth + 1) for child in (item.values() if kind is dict else item))
        else:
            return f"a {kind.__name__}"
    return None


def _outcome(index: int, item: Any) -> CallOutcome:
    """One call's outcome from a result frame; :class:`_ForgedFrame` when the runner would never have written it."""
    if not isinstance(item, dict):
        raise _ForgedFrame(f"the answer to call {index} is not a JSON object")
    if item.get("ok") is True:
        value = item.get("value")
        problem = _value_problem(value)
        if problem is not None:
            raise _ForgedFrame(f"the value of call {index} holds {problem}, which the runner never sends")
        return CallOutcome(ok=True, value=value)
    kind = item.get("kind")
    if item.get("ok") is not False or kind not in ("crash", "bad_output"):
        raise _ForgedFrame(f"the answer to call {index} is neither a value nor a failure of the function")
    return CallOutcome(
        ok=False,
        error=sandbox_error(kind, _text(item.get("message")), exception_type=_opt_str(item.get("type")), line=_opt_line(item.get("line"))),
    )


def _from_frame(frame: dict[str, Any], limits: SandboxLimits, n_calls: int, common: dict[str, Any]) -> SandboxResult:
    """The result a frame written after the set-up report says; :class:`_ForgedFrame` for one the runner never writes.

    Every claim in it is within the agent's reach, so it is believed only where the agent could
    have caused it anyway (its own results and failures), never about the sandbox itself.
    """
    status = frame.get("status")
    if status == "error":
        kind = frame.get("kind")
        if kind == "bootstrap":
            raise _ForgedFrame("a sandbox set-up failure reported after the set-up had finished and the module's code had started")
        if kind not in ERROR_KINDS_AFTER_SETUP:
            raise _ForgedFrame("an error of a kind the runner never reports")
        error = sandbox_error(
            kind,
            _text(frame.get("message")),
            exception_type=_opt_str(frame.get("type")),
            line=_opt_line(frame.get("line")),
            event=_opt_str(frame.get("event")),
        )
        if kind == "memory":
            error = error.model_copy(update={"message": f"{error.message} (limit {limits.memory_bytes} bytes)"})
        return SandboxResult(ok=False, error=error, **common)
    if status != "ok":
        raise _ForgedFrame("a frame that is neither a result nor an error")
    calls = frame.get("calls")
    if not isinstance(calls, list) or len(calls) != n_calls:
        raise _ForgedFrame(f"{len(calls) if isinstance(calls, list) else 'no'} answers for {n_calls} calls")
    outcomes = [_outcome(index, item) for index, item in enumerate(calls)]
    try:
        exports = ModuleExports.model_validate(frame.get("exports") or {})
    except ValidationError:
        raise _ForgedFrame("the module's exports are not of the runner's shape") from None
    return SandboxResult(ok=True, calls=outcomes, exports=exports, **common)
