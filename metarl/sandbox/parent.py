"""Run agent-written Python (the environment/reward module) in a limited child process.

Over 600 lines on purpose: the one-shot calls and SandboxSession share the launch, watch and teardown of one child; the value types and the frame reader are in sandbox/results.py.

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
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from metarl import graders
from metarl.learning.grader_plugins import registered_graders
from metarl.sandbox import isolation, landlock, seccomp
from metarl.sandbox.isolation import IsolationLevel
from metarl.sandbox.results import (
    ChildRun,
    IsolationUnavailable,
    Launch,
    ModuleExports,
    SandboxCall,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    failed_run,
    interpret_run,
    parse_frame,
)
from metarl.sandbox_runner import ALLOWED_MODULES
from metarl.workspace import WorkspaceError, WorkspaceLimits, read_workspace_text, scan_files

RUNNER = Path(__file__).resolve().parent.parent / "sandbox_runner.py"
GRADERS = Path(graders.__file__).resolve()
LANDLOCK = Path(landlock.__file__).resolve()
SECCOMP = Path(seccomp.__file__).resolve()
"""The task families' graders (metarl/graders.py), importable by the agent's module as ``metarl_graders``."""
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
NOBODY = 65534


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
            return failed_run("bad_input", f"the arguments are not JSON: {exc}")
    else:
        parsed = args_json
    try:
        if isinstance(parsed, list):
            call = SandboxCall(function=function, args=parsed)
        elif isinstance(parsed, dict):
            call = SandboxCall(function=function, kwargs=parsed)
        else:
            return failed_run("bad_input", "the arguments must be a JSON array (positional) or object (keyword)")
    except ValidationError as exc:
        return failed_run("bad_input", f"bad call: {exc.errors(include_url=False)[0]['msg']}")
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
    return interpret_run(run, limits, len(calls), time.monotonic() - started)


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
        return failed_run("bad_input", "the workspace folder does not exist")
    if not os.path.isdir(workspace) or os.path.islink(workspace):
        return failed_run("bad_input", "the workspace is not a folder (or is a link)")
    try:
        source = read_workspace_text(workspace, module_file, WorkspaceLimits(), max_bytes=limits.max_source_bytes)
    except WorkspaceError as err:
        return failed_run("bad_input", f"cannot read the module: {err.message} ({err.fix})")
    del info
    linked = hard_linked_files(workspace)
    if linked:
        return failed_run(
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
        return failed_run("bad_input", f"the request has {len(payload)} bytes; keep the source and arguments under {limits.max_request_bytes}")
    return workspace, payload


def _host_for(limits: SandboxLimits) -> isolation.HostIsolation | None:
    """The bubblewrap set-up to use (None: a plain process, which ``limits.min_isolation`` accepts);
    :class:`IsolationUnavailable` when the host cannot give the required level."""
    host = isolation.host_isolation(str(RUNNER), ALLOWED_MODULES)
    problem = isolation.refusal(host, limits.min_isolation)
    if problem is not None:
        raise IsolationUnavailable(problem)
    return host if host.problem is None else None


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


def _start_child(host: isolation.HostIsolation | None, workspace: Path, limits: SandboxLimits, *runner_args: str) -> Launch:
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
        return Launch(process, "full", isolation.layers(as_root))
    process = _popen([sys.executable, "-I", "-S", "-B", str(RUNNER), *runner_args], cwd=str(workspace), env=dict(CHILD_ENV), pass_fds=())
    return Launch(process, "process", [])  # the runner walls itself in (Landlock, seccomp, nobody) and reports its layers


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


def _run_child(host: isolation.HostIsolation | None, workspace: Path, payload: bytes, limits: SandboxLimits) -> ChildRun:
    launch = _start_child(host, workspace, limits)
    run = ChildRun(launch)
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
        self._launch: Launch | None = None
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
            if first is None or parse_frame(first + b"\n")[0] is None:
                # set-up failed, was killed or timed out: the sandbox's problem (interpret_run raises)
                so_far = (b"" if first is None else first + b"\n") + bytes(self._buffer)
                return self._closed(interpret_run(self._end(deadline, so_far), self.limits, 0, time.monotonic() - started))
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
            return failed_run("bad_input", f"the request has {len(payload)} bytes; send batches under {limits.max_request_bytes}")
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
            self._closed_with = failed_run("crash", "the sandbox session is closed")
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
            return self._closed(interpret_run(run, limits, n_calls, time.monotonic() - started))
        run = ChildRun(self._launch)
        run.stdout = bytearray(self._ready_line + line + b"\n")
        run.stderr_tail = bytearray(self._stderr_tail)
        frame = parse_frame(bytes(run.stdout))[1]
        # a bootstrap frame here is the agent's forgery: the set-up report came first (interpret_run says so)
        stray = frame is not None and frame.get("status") == "ok" and frame.get("id") != request_id
        forged = "a frame that answers no request (its id is not the request's)" if stray else None
        result = interpret_run(run, limits, n_calls, time.monotonic() - started, forged=forged)
        if result.isolation:
            self.isolation = list(result.isolation)
            self.level = result.level
        if not result.ok:
            self._kill()
            return self._closed(result)
        return result

    def _end(self, deadline: float, stdout: bytes) -> ChildRun:
        """Kill and reap the child; what is known about how it ended, for :func:`interpret_run`."""
        run = ChildRun(self._launch)
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
