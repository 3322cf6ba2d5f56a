"""Run agent-written Python (the environment/reward module) in a limited child process.

``run_in_sandbox(workspace_dir, module_file, function, args_json, limits) -> SandboxResult`` runs
one call; ``run_calls_in_sandbox`` runs many calls against one import of the module (the probe
uses it: one process for all sample items); ``SandboxSession`` keeps one sandboxed import alive
to answer many batches of calls (the local trainer uses it: one process per inner job, one
request per training step, with the same isolation). Errors are data: ``SandboxResult.error.kind``
is one of ``timeout``, ``memory``, ``crash``, ``forbidden``, ``bad_output`` or ``bad_input`` (the
request itself was unusable: a missing module file, arguments that are not JSON).

What is enforced, and how
-------------------------

Agent code runs under kernel-enforced isolation: bubblewrap with new PID, mount, network, IPC and
UTS namespaces (a user namespace too when the worker is not root), a read-only root made of the
interpreter, its libraries, the standard library and the workspace (at ``/workspace``, the working
directory, in the probe and in training alike), an empty read-only ``/tmp`` (nothing is
writable), no ``/etc``, and a seccomp filter; see :mod:`metarl.sandbox.isolation` and
:mod:`metarl.sandbox.seccomp`. That is isolation level ``full``. Without bubblewrap (a host that refuses
user namespaces) the child runs as a plain process that walls itself in before the agent's code
(level ``process``): Landlock leaves it the workspace, the standard library and the runner's own
files to read and nothing to write (:mod:`metarl.sandbox.landlock`), a stricter seccomp filter keeps it
from sockets, IPC, metadata changes and every other process, a root start becomes ``nobody``, and
the rlimits apply; only where the deployment accepts it (``SandboxLimits.min_isolation``, from the
run config's ``[sandbox] min_isolation``) and the kernel has Landlock. Otherwise
:class:`IsolationUnavailable` is raised, naming the setting, what is missing and the fixes.
``SandboxResult.level`` is the level of each run and ``SandboxResult.isolation`` its layers.

The parent (this module):

- reads the module file itself, with the workspace tools' confinement (relative safe path, no
  links, size cap, UTF-8), and sends its source on stdin; the child never needs to open it;
- starts ``python -I -S -B sandbox_runner.py``: isolated mode (no ``PYTHON*`` variables, no user
  site, no current directory or script directory on ``sys.path``), no ``site`` (so site-packages
  are not importable), no bytecode writing;
- passes an almost empty environment (``PATH=/usr/bin:/bin``, ``LC_ALL=C.UTF-8`` and, under
  bubblewrap, ``LD_LIBRARY_PATH``): no secrets, whatever the worker's own environment holds;
- ``close_fds=True``, a new session (its own process group);
- a wall-clock deadline, after which the sandbox is killed with SIGKILL (the runner first, the
  init of its own PID namespace, which takes that namespace with it; then the process group);
- caps on what it reads back: the result frame (``stdout_bytes``) and stderr (only a tail of
  ``stderr_tail_chars`` is kept; a child that writes more than ``max_stderr_bytes`` is killed);
- reads the channel (fd 3 in the child) by phases: the runner's set-up report (``ready`` with the
  layers it put in place, or a ``bootstrap`` failure) is the first line and comes before any agent
  code; only it speaks for the sandbox (:class:`SandboxUnavailable` when set-up fails, the
  ``isolation`` layers when it succeeds). Every later frame is within the agent's reach, so it is
  believed only where the agent could have caused it anyway (its own results and failures): a
  ``bootstrap`` frame after the report, an unknown error kind, a wrong shape or count, a value the
  runner never sends (an integer beyond 2**53, NaN or infinity, containers nested deeper than 17)
  or a second frame is a forged or malformed frame, the module's fault (``bad_output``, its
  problem named); no number is converted before it is checked, so nothing in a frame can raise.

The child (``metarl/sandbox_runner.py``, see its docstring for the order of steps):

- RLIMIT_CPU (SIGXCPU at the soft limit, SIGKILL one second later), RLIMIT_AS (memory),
  RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE = 0, RLIMIT_NPROC = 0 (no processes or threads);
- when started as root: ``setgroups([])``, ``setgid``/``setuid`` to ``nobody`` (65534) before the
  agent's code, at every level (under bubblewrap with only CAP_SETUID/CAP_SETGID to do it);
- without bubblewrap only: a network namespace where the kernel allows one, no_new_privs, not
  dumpable, PR_SET_PDEATHSIG, then the kernel wall (Landlock, seccomp; see ``_kernel_wall``);
- imports limited to an allowlist of pure stdlib modules, imported before the hook, and the task
  families' graders (:mod:`metarl.graders`, loaded from their file as ``metarl_graders``) with every
  registered plugin grader (:mod:`metarl.learning.grader_plugins`, each file loaded as
  ``metarl_grader_NAME``; all of them, so a run needs no task to know which);
- an audit hook (``sys.addaudithook``) that denies every event not on an allowlist: ``os.fork``,
  ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.spawn*``, ``subprocess.Popen``,
  ``socket.*``, ``ctypes.*``, ``os.kill``, ``signal.pthread_kill``, ``resource.setrlimit``, file
  changes (``os.remove``, ``os.rename``, ``os.mkdir``, ``os.symlink``, ``os.link``, ``os.chmod``,
  ...), ``gc.get_objects``/``get_referrers``, ``sys.addaudithook``, ``sys.settrace`` and the
  rest; ``open`` only for reading plain files lexically inside the workspace or the stdlib with
  no symbolic link on the way; ``os.listdir``/``os.scandir`` only inside the workspace. A denied
  event ends the child at once with a ``forbidden`` frame (it cannot be caught by the agent's
  code). The hook uses only values captured before the agent's code runs.

A system call the seccomp filter refuses kills the child with SIGSYS: a ``forbidden`` error whose
``event`` is ``seccomp``.

Residual risks
--------------

- The audit hook is a tripwire, not a boundary (``os.mknod``, ``os.mkfifo``,
  ``signal.pidfd_send_signal`` and ``_imp.create_builtin`` raise no audit event; memory
  corruption runs native code no hook sees; the agent's code shares its interpreter, and issue 40
  switched it off by rewriting its closure cells): the kernel layers above are what holds, at
  every level.
- Inside the sandbox the agent's code can use its CPU seconds and wall clock and up to
  ``memory_bytes`` of address space; there is no cgroup. Nothing is writable (no ``/tmp`` to fill
  with files or inodes).
- ``stat``, ``readlink`` and ``os.getcwd`` have no audit events, but only the sandbox's own file
  system is there to look at. The child can write to its own result channel, forging its frame;
  that only lets agent code claim results it could have computed anyway (claims about the sandbox
  itself are not believed, see above).
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

from metarl import graders
from metarl.errors import MetarlError
from metarl.learning.grader_plugins import registered_graders
from metarl.sandbox import isolation, landlock, seccomp
from metarl.sandbox.isolation import IsolationLevel
from metarl.sandbox_runner import ALLOWED_MODULES, READY_STATUS
from metarl.workspace import WorkspaceError, WorkspaceLimits, read_workspace_text, scan_files
from schemas.base import StrictModel, printable

RUNNER = Path(__file__).resolve().parent.parent / "sandbox_runner.py"
GRADERS = Path(graders.__file__).resolve()
LANDLOCK = Path(landlock.__file__).resolve()
SECCOMP = Path(seccomp.__file__).resolve()
"""The task families' graders (metarl/graders.py), importable by the agent's module as ``metarl_graders``."""
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
NOBODY = 65534

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


def _error(kind: ErrorKind, message: str, fix: str | None = None, **extra: Any) -> SandboxError:
    return SandboxError(kind=kind, message=printable(message)[:4000], fix=fix or FIXES[kind], **extra)


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
    host = _host_for(limits)
    extra = {"bubblewrap": host is not None, "graders": _graders_path(host), "plugin_graders": _plugin_paths(host), "wall": _wall(host)}
    prepared = _prepare_request(workspace_dir, module_file, [call.model_dump(mode="json") for call in calls], limits, extra)
    if isinstance(prepared, SandboxResult):
        return prepared
    workspace, payload = prepared
    run = _run_child(host, workspace, payload, limits)
    return _interpret(run, limits, len(calls), time.monotonic() - started)


def hard_linked_files(workspace: Path) -> list[str]:
    """The workspace's regular files that have another name (``st_nlink > 1``), at any depth. The kernel walls
    check paths, and a hard link is the outside file under a workspace path, so no sandbox runs over one."""
    _, refused = scan_files(workspace, WorkspaceLimits(max_depth=16))
    return [entry.path for entry in refused if entry.reason == "hard link"]


def _prepare_request(
    workspace_dir: str | Path, module_file: str, calls: list[dict[str, Any]], limits: SandboxLimits, extra: dict[str, Any] | None = None
) -> tuple[Path, bytes] | SandboxResult:
    """The workspace folder and the request bytes for the child (``extra`` keys added), or a ``bad_input`` result."""
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
    linked = hard_linked_files(workspace)
    if linked:
        return _failed(
            "bad_input",
            f"the workspace holds a hard-linked file ({', '.join(linked[:3])}): its other name may lie outside the workspace, where the "
            "sandbox must not read; put a copy of the file there instead of a link",
        )
    request = {
        "source": source,
        "filename": module_file,
        "calls": calls,
        "limits": {
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
        },
        "isolate_network": limits.isolate_network,
        "drop_privileges": limits.drop_privileges,
        "audit_hook": limits.audit_hook,
        "uid": NOBODY,
        "gid": NOBODY,
        **(extra or {}),
    }
    payload = json.dumps(request).encode("utf-8")
    if len(payload) > limits.max_request_bytes:
        return _failed("bad_input", f"the request has {len(payload)} bytes; keep the source and arguments under {limits.max_request_bytes}")
    return workspace, payload


class _ChildRun:
    def __init__(self, launch: _Launch | None = None) -> None:
        self.stdout = bytearray()
        self.stderr_tail = bytearray()
        self.stderr_total = 0
        self.timed_out = False
        self.overflow: str | None = None
        self.status: int | None = None
        self.cpu_seconds = 0.0
        self.launch = launch


class _Launch:
    """A started child: the process, its isolation level and the layers set up outside it."""

    def __init__(self, process: subprocess.Popen[bytes], level: IsolationLevel, layers: list[str]) -> None:
        self.process = process
        self.level = level
        self.layers = layers

    @property
    def bubblewrap(self) -> bool:
        """True when the child is bubblewrap (its exit status says how the runner ended)."""
        return self.level == "full"


def _host_for(limits: SandboxLimits) -> isolation.HostIsolation | None:
    """The bubblewrap set-up to use (None: a plain process, which ``limits.min_isolation`` accepts);
    :class:`IsolationUnavailable` when the host cannot give the required level."""
    host = isolation.host_isolation(str(RUNNER), ALLOWED_MODULES)
    if host.problem is None:
        return host
    if not isolation.level_at_least("process", limits.min_isolation):
        raise IsolationUnavailable(isolation.unavailable_message(host.problem, limits.min_isolation))
    wall_problem = isolation.process_wall_problem()
    if wall_problem is not None:
        raise IsolationUnavailable(isolation.process_unavailable_message(host.problem, wall_problem))
    return None


def _wall(host: isolation.HostIsolation | None) -> dict[str, str] | None:
    """What the runner loads to wall itself in at level ``process`` (None under bubblewrap): the files of
    metarl/sandbox/landlock.py and metarl/sandbox/seccomp.py (standard library only), see ``sandbox_runner._kernel_wall``."""
    return None if host is not None else {"landlock": str(LANDLOCK), "seccomp": str(SECCOMP)}


def _graders_path(host: isolation.HostIsolation | None) -> str:
    """Where the child reads the graders file: bound read-only at ``isolation.SANDBOX_GRADERS`` under bubblewrap, else in place."""
    return isolation.SANDBOX_GRADERS if host is not None else str(GRADERS)


def plugin_grader_files() -> dict[str, str]:
    """The host path of every registered plugin grader's file, by name (the child loads them all)."""
    return {name: str(plugin.path) for name, plugin in registered_graders().items()}


def _plugin_paths(host: isolation.HostIsolation | None) -> dict[str, str]:
    """Where the child reads each plugin grader file: bound read-only at ``isolation.sandbox_plugin_path`` under bubblewrap, else in place."""
    files = plugin_grader_files()
    return {name: isolation.sandbox_plugin_path(name) for name in files} if host is not None else files


def _start_child(host: isolation.HostIsolation | None, workspace: Path, limits: SandboxLimits, *runner_args: str) -> _Launch:
    """Start the sandbox runner on ``workspace``: under bubblewrap (``host``), else as a plain process."""
    if host is not None:
        assert host.bwrap is not None and host.root is not None
        as_root = os.geteuid() == 0
        fd = isolation.seccomp_pipe()
        try:
            command = isolation.bwrap_command(
                host.bwrap,
                host.root,
                runner=str(RUNNER),
                graders=str(GRADERS),
                plugin_graders=plugin_grader_files(),
                workspace=str(workspace.absolute()),
                as_root=as_root,
                seccomp_fd=fd,
                argv=isolation.runner_argv(host.root, runner_args),
            )
            process = _popen(command, cwd="/", env={}, pass_fds=(fd,))
        finally:
            os.close(fd)
        return _Launch(process, "full", isolation.layers(as_root))
    process = _popen([sys.executable, "-I", "-S", "-B", str(RUNNER), *runner_args], cwd=str(workspace), env=dict(CHILD_ENV), pass_fds=())
    return _Launch(process, "process", [])  # the runner walls itself in (Landlock, seccomp, nobody) and reports its layers


def _popen(command: list[str], *, cwd: str, env: dict[str, str], pass_fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            close_fds=True,
            pass_fds=pass_fds,
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxUnavailable(f"cannot start the sandbox child: {exc.strerror or type(exc).__name__}") from None


def _run_child(host: isolation.HostIsolation | None, workspace: Path, payload: bytes, limits: SandboxLimits) -> _ChildRun:
    launch = _start_child(host, workspace, limits)
    run = _ChildRun(launch)
    process = launch.process
    deadline = time.monotonic() + limits.wall_seconds
    tail_bytes = max(limits.stderr_tail_chars * 4, 1)
    selector = selectors.DefaultSelector()
    try:
        assert process.stdin and process.stdout and process.stderr
        for pipe in (process.stdin, process.stdout, process.stderr):
            os.set_blocking(pipe.fileno(), False)
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
                assert not isinstance(stream, int), "only the child's pipes are registered"
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
                    chunk = os.read(stream.fileno(), 1 << 16)
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
        _end_sandbox(process.pid, grace=0.0 if run.timed_out or run.overflow else 1.0)
        for opened in (process.stdin, process.stdout, process.stderr):
            if opened is not None and not opened.closed:
                opened.close()
        try:
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            run.cpu_seconds = usage.ru_utime + usage.ru_stime
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): status unknown
            process.returncode = process.returncode if process.returncode is not None else -signal.SIGKILL
        run.status = process.returncode
    return run


def _exited(pid: int) -> bool:
    """True once ``pid`` (a child) has ended; it is not reaped (the caller reaps it with its usage)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _end_sandbox(pid: int, grace: float) -> None:
    """End a child and everything it started, leaving it to be reaped.

    Waits up to ``grace`` seconds for it to end by itself (a runner that has finished), then kills
    bubblewrap's child (the runner, init of its PID namespace, which goes with it; bubblewrap reaps
    it, so nothing is left to the worker's own init), waits a moment for bubblewrap to exit, and
    kills the process group.
    """
    deadline = time.monotonic() + grace
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    if _exited(pid):
        return
    for child in _children(pid):
        _signal(lambda child=child: os.kill(child, signal.SIGKILL))
    deadline = time.monotonic() + 1.0
    while not _exited(pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    _signal(lambda: os.killpg(pid, signal.SIGKILL))
    _signal(lambda: os.kill(pid, signal.SIGKILL))


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
            return [int(item) for item in handle.read().split()]
    except (OSError, ValueError):
        return []


def _signal(send: Any) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):
        pass


def _interpret(run: _ChildRun, limits: SandboxLimits, n_calls: int, elapsed: float, forged: str | None = None) -> SandboxResult:
    """What a child's run means (``forged``: the caller found its frame forged, for this reason).

    Raises :class:`SandboxUnavailable` only when the set-up report is missing (the agent's code
    never ran); anything after it is the module's doing, whatever it claims.
    """
    tail = run.stderr_tail.decode("utf-8", "replace")[-limits.stderr_tail_chars :] if limits.stderr_tail_chars else ""
    common: dict[str, Any] = {"stderr_tail": tail, "wall_seconds": round(elapsed, 4)}
    ready_layers, frame, frame_problem = _parse_frame(bytes(run.stdout))
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
        return _failed("timeout", f"the module ran past the wall-clock limit of {limits.wall_seconds:g} s", **common)
    if run.overflow:
        return _failed("bad_output", run.overflow, **common)
    if frame is None:
        status = run.status or 0
        # Under bubblewrap the runner is not bubblewrap's direct child, so its CPU seconds are not in the
        # rusage read here: a SIGKILL the sandbox did not send itself (no wall-clock or output kill) is
        # the hard CPU limit's, the only SIGKILL its own limits send.
        cpu_kill = status == -signal.SIGKILL and (run.cpu_seconds >= limits.cpu_seconds - 0.05 or (launch is not None and launch.bubblewrap))
        if status in (-signal.SIGXCPU,) or cpu_kill:
            return _failed("timeout", f"the module used more than its {limits.cpu_seconds} CPU seconds", **common)
        if status == -signal.SIGXFSZ:
            return _failed("forbidden", "the module tried to write a file larger than allowed", **common)
        if status == -signal.SIGSYS:
            message = "the module made a system call the sandbox forbids (seccomp: devices, other processes, mounts, namespaces, sockets...)"
            return SandboxResult(ok=False, error=_error("forbidden", message, event="seccomp"), **common)
        if "MemoryError" in tail or "Cannot allocate memory" in tail:
            return _failed("memory", f"the module ran out of memory (limit {limits.memory_bytes} bytes)", **common)
        if status < 0:
            return _failed("crash", f"the module was killed by signal {_signal_name(-status)}", **common)
        if frame_problem:
            return SandboxResult(ok=False, error=_forged(frame_problem), **common)
        if status == 0:
            return _failed("bad_output", "the module ended the process without a result (os._exit?)", **common)
        return _failed("crash", f"the module's process exited with status {status}", **common)
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
    return _error("bad_output", f"forged or malformed result frame: {problem}; the module's code wrote on the sandbox's result channel itself", fix=FORGED_FIX)


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


def _parse_frame(stdout: bytes) -> tuple[list[str] | None, dict[str, Any] | None, str | None]:
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
        error=_error(kind, _text(item.get("message")), exception_type=_opt_str(item.get("type")), line=_opt_line(item.get("line"))),
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
        error = _error(
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


class SandboxSession:
    """One sandboxed import of a module kept alive to answer many batches of calls.

    The child is the same runner with the same isolation as :func:`run_calls_in_sandbox`
    (rlimits, empty environment, no network, nobody, audit hook, workspace-only reads), started in
    persistent mode (``sandbox_runner.py --serve``, see its docstring), so a trainer pays the
    start-up (~0.1 s) once per job instead of once per step. Differences from a one-shot run:

    - ``limits.cpu_seconds`` and ``limits.max_stderr_bytes`` count over the whole session;
    - ``limits.wall_seconds`` is the deadline of the start-up (import) and, unless :meth:`call`
      is given another (``wall_seconds``, or a shared ``deadline`` as the probe does), of each batch;
    - the module's state persists between batches (it is the agent's own reward: it may cache);
    - the child is killed by the kernel when the thread that started it ends
      (``PR_SET_PDEATHSIG``), so start the session from the thread that uses it for its lifetime
      (a trainer's main thread), never from a short-lived helper thread.

    Errors are data, as in :func:`run_calls_in_sandbox`: :meth:`start` and :meth:`call` return a
    :class:`SandboxResult`, classified by the same rules. After any failure of the whole run
    (timeout, memory, the process ending, a forbidden event, a malformed or unexpected frame) the
    child is killed and the session is closed; every later call returns that same error.
    :class:`SandboxUnavailable` is raised when the sandbox itself cannot run (not the agent's
    fault). Use it as a context manager, or call :meth:`close`: the child is killed and reaped.
    """

    def __init__(self, workspace_dir: str | Path, module_file: str, limits: SandboxLimits | None = None) -> None:
        self.workspace_dir = Path(workspace_dir)
        self.module_file = module_file
        self.limits = limits or SandboxLimits()
        self.exports: ModuleExports | None = None
        self.isolation: list[str] = []
        self.level: IsolationLevel | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._launch: _Launch | None = None
        self._selector: selectors.BaseSelector | None = None
        self._buffer = bytearray()
        self._stderr_tail = bytearray()
        self._stderr_total = 0
        self._overflow: str | None = None
        self._next_id = 0
        self._ready_line = b""
        self._closed_with: SandboxResult | None = None

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """Process id of the child (None before start)."""
        return self._process.pid if self._process is not None else None

    @property
    def alive(self) -> bool:
        """True while the child runs and answers."""
        return self._process is not None and self._closed_with is None

    def start(self) -> SandboxResult:
        """Start the child and import the module: ``ok`` with ``exports``, or the import's error."""
        if self._process is not None or self._closed_with is not None:
            raise RuntimeError("a sandbox session starts once")
        started = time.monotonic()
        host = _host_for(self.limits)
        extra = {
            "die_with_parent": True,
            "parent_pid": os.getpid(),
            "bubblewrap": host is not None,
            "graders": _graders_path(host),
            "plugin_graders": _plugin_paths(host),
            "wall": _wall(host),
        }
        prepared = _prepare_request(self.workspace_dir, self.module_file, [], self.limits, extra)
        if isinstance(prepared, SandboxResult):
            self._closed_with = prepared
            return prepared
        workspace, payload = prepared
        self._launch = _start_child(host, workspace, self.limits, "--serve")
        self._process = process = self._launch.process
        assert process.stdin and process.stdout and process.stderr
        for stream in (process.stdin, process.stdout, process.stderr):
            os.set_blocking(stream.fileno(), False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(process.stdout, selectors.EVENT_READ)
        self._selector.register(process.stderr, selectors.EVENT_READ)
        deadline = started + self.limits.wall_seconds
        try:
            first = self._exchange(payload + b"\n", deadline)
            if first is None or _parse_frame(first + b"\n")[0] is None:
                # set-up failed, was killed or timed out: the sandbox's problem (_interpret raises)
                so_far = (b"" if first is None else first + b"\n") + bytes(self._buffer)
                return self._closed(_interpret(self._end(deadline, so_far), self.limits, 0, time.monotonic() - started))
            self._ready_line = first + b"\n"  # the set-up report: the last word of the sandbox itself in this session
            line = self._exchange(b"", deadline)
            result = self._answer(line, 0, started, deadline, self.limits, request_id=None)
        except BaseException:
            self._kill()
            raise
        if result.ok:
            self.exports = result.exports
        return result

    def call(self, calls: list[SandboxCall], wall_seconds: float | None = None, *, deadline: float | None = None) -> SandboxResult:
        """Make every call against the imported module; per-call outcomes in ``calls``.

        ``wall_seconds`` (default ``limits.wall_seconds``) bounds this batch; past it the child is
        killed and the result is a ``timeout``. ``deadline`` (a :func:`time.monotonic` instant)
        ends the batch at that instant instead: one deadline shared with the start-up, as the probe
        uses it (``limits.wall_seconds`` for the import and every call together; the ``timeout``
        names that total).
        """
        if self._closed_with is not None:
            return self._closed_with
        if self._process is None:
            raise RuntimeError("start the sandbox session before calling it")
        started = time.monotonic()
        limits = self.limits if wall_seconds is None or deadline is not None else self.limits.model_copy(update={"wall_seconds": wall_seconds})
        self._next_id += 1
        request_id = self._next_id
        payload = json.dumps({"id": request_id, "calls": [call.model_dump(mode="json") for call in calls]}).encode("utf-8")
        if len(payload) > limits.max_request_bytes:
            return _failed("bad_input", f"the request has {len(payload)} bytes; send batches under {limits.max_request_bytes}")
        if deadline is None:
            deadline = started + limits.wall_seconds
        try:
            line = self._exchange(payload + b"\n", deadline)
            result = self._answer(line, len(calls), started, deadline, limits, request_id=request_id)
        except BaseException:
            self._kill()
            raise
        if result.ok and self.exports is not None:
            result = result.model_copy(update={"exports": self.exports})
        return result

    def close(self) -> None:
        """End the child (kill its process group) and reap it; idempotent."""
        if self._closed_with is None:
            self._closed_with = _failed("crash", "the sandbox session is closed")
        self._kill()

    def _exchange(self, payload: bytes, deadline: float) -> bytes | None:
        """Send ``payload``; return the next complete line of the result channel (no newline), or
        None when the child closed its output, the deadline passed or an output cap was hit."""
        process, selector = self._process, self._selector
        assert process is not None and selector is not None and process.stdin is not None
        pending = memoryview(payload)
        if pending:
            selector.register(process.stdin, selectors.EVENT_WRITE)
        tail_bytes = max(self.limits.stderr_tail_chars * 4, 1)
        try:
            while True:
                newline = self._buffer.find(b"\n")
                if newline >= 0:
                    line = bytes(self._buffer[:newline])
                    del self._buffer[: newline + 1]
                    return line
                if len(self._buffer) > self.limits.stdout_bytes:
                    self._overflow = f"the result is larger than {self.limits.stdout_bytes} bytes"
                    return None
                streams = [key.fileobj for key in selector.get_map().values()]
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (process.stdout not in streams and process.stderr not in streams):
                    return None
                for key, _ in selector.select(timeout=min(remaining, 0.5)):
                    stream = key.fileobj
                    if stream is process.stdin:
                        try:
                            pending = pending[os.write(process.stdin.fileno(), pending[: 1 << 16]) :]
                        except BlockingIOError:
                            continue
                        except OSError:  # the child closed its end: it is ending
                            pending = pending[:0]
                        if not pending:
                            selector.unregister(process.stdin)
                        continue
                    try:
                        chunk = os.read(stream.fileno(), 1 << 16)  # type: ignore[union-attr]
                    except BlockingIOError:
                        continue
                    if not chunk:
                        selector.unregister(stream)
                    elif stream is process.stdout:
                        self._buffer += chunk
                    else:
                        self._stderr_total += len(chunk)
                        self._stderr_tail = (self._stderr_tail + chunk)[-tail_bytes:]
                        if self._stderr_total > self.limits.max_stderr_bytes:
                            self._overflow = f"the module printed more than {self.limits.max_stderr_bytes} bytes"
                            return None
        finally:
            if pending and process.stdin in [key.fileobj for key in selector.get_map().values()]:
                selector.unregister(process.stdin)

    def _answer(self, line: bytes | None, n_calls: int, started: float, deadline: float, limits: SandboxLimits, request_id: int | None) -> SandboxResult:
        """Interpret one answer (or its absence) by the one-shot rules; close the session on failure."""
        if line is None:
            run = self._end(deadline, self._ready_line + bytes(self._buffer))
            return self._closed(_interpret(run, limits, n_calls, time.monotonic() - started))
        run = _ChildRun(self._launch)
        run.stdout = bytearray(self._ready_line + line + b"\n")
        run.stderr_tail = bytearray(self._stderr_tail)
        frame = _parse_frame(bytes(run.stdout))[1]
        # a bootstrap frame here is the agent's forgery: the set-up report came first (_interpret says so)
        stray = frame is not None and frame.get("status") == "ok" and frame.get("id") != request_id
        forged = "a frame that answers no request (its id is not the request's)" if stray else None
        result = _interpret(run, limits, n_calls, time.monotonic() - started, forged=forged)
        if result.isolation:
            self.isolation = list(result.isolation)
            self.level = result.level
        if not result.ok:
            self._kill()
            return self._closed(result)
        return result

    def _end(self, deadline: float, stdout: bytes) -> _ChildRun:
        """Kill and reap the child; what is known about how it ended, for :func:`_interpret`."""
        run = _ChildRun(self._launch)
        run.stdout = bytearray(stdout)
        run.stderr_tail = bytearray(self._stderr_tail)
        run.stderr_total = self._stderr_total
        run.overflow = self._overflow
        run.timed_out = self._overflow is None and time.monotonic() >= deadline
        run.status, run.cpu_seconds = self._kill(grace=0.0 if run.timed_out or run.overflow else 1.0)
        return run

    def _closed(self, result: SandboxResult) -> SandboxResult:
        self._closed_with = result
        return result

    def _kill(self, grace: float = 0.0) -> tuple[int | None, float]:
        """End the child (after ``grace`` seconds to end by itself) and reap it (once); its exit status and CPU seconds."""
        process = self._process
        if self._selector is not None:
            self._selector.close()
            self._selector = None
        if process is None or process.returncode is not None:
            return (process.returncode if process is not None else None), 0.0
        _end_sandbox(process.pid, grace=grace)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        cpu_seconds = 0.0
        try:
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            cpu_seconds = usage.ru_utime + usage.ru_stime
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): status unknown
            process.returncode = -signal.SIGKILL
        return process.returncode, cpu_seconds
