"""Child side of :mod:`metarl.sandbox.parent`: runs agent-written code under limits and reports one JSON frame.

Over 600 lines on purpose: the sandbox binds this one file into the child, which can import nothing else of the project.

Started by the parent as ``python -I -S -B sandbox_runner.py`` with cwd = the workspace, an almost
empty environment and the request (JSON) on stdin. It uses the standard library only and must not
import metarl (with ``-I -S`` neither the repository nor site-packages is on ``sys.path``).

Order of events (each step before the agent's code runs):

1. read the whole request from stdin, then point stdin at /dev/null;
2. load the task families' graders (``metarl/graders.py``, whose path the request names: under
   bubblewrap it is bound read-only at ``/sandbox/metarl_graders.py``) as the module
   ``metarl_graders``, and each plugin grader the request names (``plugin_graders``: name -> path,
   under bubblewrap ``/sandbox/metarl_grader_NAME.py``) as the module ``metarl_grader_NAME``, then
   import an allowlist of pure standard-library modules (these and the graders are the only modules
   the agent's code may import later: every other import is refused, so process, network and FFI
   extension modules can never be loaded, and behaviour does not depend on whether the stdlib is
   readable after the privilege drop; a plugin grader imports only allowlisted modules, checked at
   its registration by metarl/learning/grader_plugins.py);
3. isolate: a new network namespace (no interfaces but a down loopback) through ``unshare(2)``,
   run as ``nobody`` when started as root (so RLIMIT_NPROC and file permissions apply), set
   ``no_new_privs`` and clear the dumpable flag; each step that the kernel refuses is left out
   of the reported ``isolation`` list; without bubblewrap (level ``process``) then the kernel wall
   the request names (:func:`_kernel_wall`: Landlock, then the seccomp filter), which fails the
   set-up closed, and a root start always becomes ``nobody``;
4. resource limits: CPU seconds, address space, file size, open files, no core dumps, and
   RLIMIT_NPROC = 0 (no new processes or threads);
5. move the result channel to a private fd and send fd 1 to stderr, so prints cannot mix with it;
6. install an audit hook that denies every event not on an allowlist (fork, exec, spawn,
   subprocess, sockets, ctypes, signals to other processes, file changes, opening any file for
   writing, reading anything but plain files inside the workspace or the stdlib, listing
   directories outside the workspace). A denied event ends the process at once with a
   ``forbidden`` frame, so the agent's code cannot catch it and carry on. It is a tripwire, not
   a wall: the agent's code shares this interpreter and can reach it (issue 40 rewrote its closure
   cells from ``sys._getframe(1).f_locals["hook"]``; that name is cleared now, but nothing in one
   interpreter is out of reach), so the kernel layers must hold without it. Imports of modules outside the allowlist raise ImportError (or end with
   ``forbidden`` for process, network and FFI modules).

The result channel carries the set-up report ``{"status": "ready", "isolation": [...]}`` (the
layers in place) once set-up is done, or ``{"status": "error", "kind": "bootstrap", ...}`` when it
failed; both are written before the agent's code runs, and nothing the runner writes later speaks
for the sandbox. Then one frame, a line of JSON:
``{"status": "ok", "exports": {...}, "calls": [...]}`` or
``{"status": "error", "kind": ..., "message": ..., ...}``. The agent's code could forge it (it
shares the process), so the parent believes no claim about the sandbox from it: a ``bootstrap``
frame after the set-up report is a forged frame, the layers come from the set-up report only, and
every value is checked (:mod:`metarl.sandbox.parent`); a forged or malformed frame is the module's fault.

Persistent mode (``sandbox_runner.py --serve``, used by :class:`metarl.sandbox.parent.SandboxSession`):
the set-up request is the first *line* of stdin (no calls needed) and the process keeps a private
copy of stdin for later requests (fd 0 itself still points at /dev/null). Steps 2-6 are the same.
After ``ready`` it sends the import frame ``{"status": "ok", "exports": ..., "calls": []}`` and
then answers each request line ``{"id": N, "calls": [...]}`` with one frame
``{"status": "ok", "id": N, "calls": [...]}`` until stdin closes. Limits count over the whole
session (CPU seconds, address space), and the child asks the kernel to SIGKILL it when its
parent ends (``PR_SET_PDEATHSIG``), so a killed trainer leaves no reward process behind. The
agent's code can reach the request reader through interpreter introspection just as it can reach
the result channel: it could read or swallow its own later requests or forge answers, which again
only changes its own rewards; the parent checks every frame's shape and id and ends the session
on anything unexpected.
"""

import os
import sys

MAX_REQUEST_BYTES = 32 * 1024 * 1024
RESERVE_BYTES = 4 * 1024 * 1024
MAX_MESSAGE_CHARS = 1000
READY_STATUS = "ready"
"""The set-up report: ``{"status": "ready", "isolation": [...]}``, the last line the runner writes before the agent's code."""
GRADERS_MODULE = "metarl_graders"
"""The name the graders file is importable under (metarl.graders.GRADERS_MODULE; this runner imports no metarl)."""
PLUGIN_MODULE_PREFIX = "metarl_grader_"
"""A plugin grader NAME is loaded as the module ``metarl_grader_NAME`` (metarl.graders.PLUGIN_MODULE_PREFIX)."""

ALLOWED_MODULES = (
    "abc",
    "array",
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "contextlib",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "html",
    "itertools",
    "json",
    "keyword",
    "math",
    "numbers",
    "operator",
    "pprint",
    "random",
    "re",
    "reprlib",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "time",
    "types",
    "typing",
    "unicodedata",
    "warnings",
    "weakref",
    "zlib",
    "_strptime",
    "encodings.ascii",
    "encodings.latin_1",
    "encodings.utf_16",
    "encodings.utf_32",
    "encodings.unicode_escape",
    "encodings.raw_unicode_escape",
    GRADERS_MODULE,
)
"""Modules the environment module may import (pre-imported before the audit hook; the graders loaded from their file)."""

DANGEROUS_MODULES = frozenset(
    {
        "_ctypes",
        "ctypes",
        "_posixsubprocess",
        "subprocess",
        "multiprocessing",
        "_multiprocessing",
        "_socket",
        "socket",
        "ssl",
        "_ssl",
        "select",
        "selectors",
        "asyncio",
        "pty",
        "fcntl",
        "mmap",
        "resource",
        "signal",
        "shutil",
        "tempfile",
        "urllib",
        "http",
        "ftplib",
        "smtplib",
        "telnetlib",
        "poplib",
        "imaplib",
        "nntplib",
        "xmlrpc",
        "socketserver",
        "webbrowser",
        "sqlite3",
        "_sqlite3",
        "threading",
        "concurrent",
        "importlib",
        "runpy",
        "pathlib",
        "glob",
        "io",
        "_io",
        "posix",
        "os",
        "gc",
        "sys",
        "builtins",
        "inspect",
        "code",
        "pdb",
        "faulthandler",
        "tracemalloc",
    }
)
"""Imports that end the run as ``forbidden`` (process, network, FFI, introspection)."""

ALLOWED_EVENTS = frozenset(
    {
        "compile",
        "exec",
        "code.__new__",
        "function.__new__",
        "object.__getattr__",
        "object.__setattr__",
        "object.__delattr__",
        "sys._getframe",
        "time.sleep",
        "array.__new__",
        "marshal.dumps",
        "marshal.loads",
        "os.putenv",
        "os.unsetenv",
        "builtins.id",
        "sys.excepthook",
        "sys.unraisablehook",
        "cpython.PyInterpreterState_Clear",
        "cpython.PyInterpreterState_New",
        "cpython._PySys_ClearAuditHooks",
        "random.seed",
        "hashlib.new",
    }
)
"""Audit events the agent's code may raise; ``open``, ``import``, ``os.listdir`` and
``os.scandir`` are checked separately and every other event is denied."""

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
SIGKILL = 9


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _short(text):
    text = str(text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def _isolate(request, applied):
    """Network namespace, privilege drop, no_new_privs, not dumpable (ctypes unloaded afterwards).

    Under bubblewrap the namespaces, no_new_privs and the parent-death signal are already in place
    (and ctypes is not even mounted): only a root start still drops to nobody here.
    """
    if request.get("bubblewrap"):
        _drop_privileges({**request, "drop_privileges": True}, applied)  # bubblewrap kept CAP_SETUID for this alone
        with open("/proc/self/status") as handle:
            if "NoNewPrivs:\t1" in handle.read():
                applied.append("no-new-privs")
        return
    wall = request.get("wall")
    libc = None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:  # noqa: BLE001 - no ctypes: the wall below fails closed
        libc = None
    if wall is not None and libc is None:
        raise RuntimeError("the process level's kernel wall (Landlock, seccomp) needs ctypes, which this interpreter lacks")
    enforce_wall = _kernel_wall(wall, request) if wall is not None else None
    if request.get("isolate_network", True):
        unshare = getattr(os, "unshare", None)  # Python 3.12+; ctypes on 3.11

        def unshared(flags):
            if unshare is not None:
                try:
                    unshare(flags)
                    return True
                except OSError:
                    return False
            return libc is not None and libc.unshare(flags) == 0

        if unshared(CLONE_NEWNET):
            applied.append("network-namespace")
        elif os.geteuid() != 0 and unshared(CLONE_NEWUSER | CLONE_NEWNET):
            applied.append("network-namespace(user)")
    _drop_privileges({**request, "drop_privileges": True} if wall is not None else request, applied)
    if libc is not None:
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
            applied.append("no-new-privs")
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            applied.append("not-dumpable")
        if request.get("die_with_parent") and libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) == 0:
            # set after the uid change (which clears it); a parent that died before this is caught by the check
            if os.getppid() != int(request.get("parent_pid", -1)):
                raise RuntimeError("the parent ended during set-up")
            applied.append("die-with-parent")
    if enforce_wall is not None:
        enforce_wall(applied)
    libc = None  # drop the handle; ctypes is unloaded next
    for name in [name for name in sys.modules if name == "ctypes" or name.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]


def _kernel_wall(wall, request):
    """Level ``process``: the wall this process puts up around itself, in two steps; see :func:`_isolate`.

    ``wall`` names the files of metarl/sandbox/landlock.py and metarl/sandbox/seccomp.py (standard library only),
    loaded here by path. The Landlock ruleset is made now, before the privilege drop (it opens the
    paths it grants): readable are only the workspace, the standard library without its
    site-packages, the interpreter, this runner and the graders files. The returned function
    enforces it, then loads the seccomp filter (the full level's, with the process level's additions
    for this pid), after the last ``prctl``. Irreversible, whatever the agent's code later does to
    this interpreter; any failure raises (the set-up fails closed).
    """
    landlock = _load_module(wall["landlock"], "metarl_landlock")
    seccomp = _load_module(wall["seccomp"], "metarl_seccomp")
    sys.modules.pop("metarl_landlock", None)
    sys.modules.pop("metarl_seccomp", None)
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    folders, files = landlock.folder_entries(stdlib)
    graders = [request["graders"], *(request.get("plugin_graders") or {}).values()] if request.get("graders") else []
    files += [os.path.realpath(sys.executable), os.path.abspath(__file__), *graders]
    ruleset = landlock.ruleset([os.path.realpath(os.getcwd()), *folders], files)
    program = seccomp.filter_program(os.uname().machine, own_pid=os.getpid())

    def enforce(applied):
        landlock.restrict_self(ruleset)
        applied.append("landlock")
        seccomp.install(program)
        applied.append("seccomp")

    return enforce


def _drop_privileges(request, applied):
    """When root: no supplementary groups, then the gid and uid of nobody (fails closed)."""
    if request.get("drop_privileges", True) and os.geteuid() == 0:
        uid, gid = int(request.get("uid", 65534)), int(request.get("gid", 65534))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise RuntimeError("could not drop root privileges")
        applied.append(f"uid-{uid}")


def _load_module(path, name):
    """Load the Python file at ``path`` as the module ``name`` (before the audit hook)."""
    import types

    with open(path, "rb") as handle:
        source = handle.read()
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _load_graders(path, plugin_graders):
    """Load the graders file at ``path`` as ``GRADERS_MODULE`` and each plugin grader (name -> path) as
    ``metarl_grader_NAME``; the graders then use those plugins only (they import no other)."""
    graders = _load_module(path, GRADERS_MODULE)
    for name, plugin_path in sorted(plugin_graders.items()):
        _load_module(plugin_path, PLUGIN_MODULE_PREFIX + name)
    graders.IMPORT_PLUGINS = False


def _limits(limits, applied):
    import resource

    def cap(which, soft, hard=None):
        hard = soft if hard is None else hard
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))

    cpu = int(limits["cpu_seconds"])
    cap(resource.RLIMIT_CPU, cpu, cpu + 1)
    cap(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    cap(resource.RLIMIT_FSIZE, int(limits["file_size_bytes"]))
    cap(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, 0)
    applied.append("rlimits")


def _make_hook(out_fd, read_roots, list_roots, isolation_json):
    """The audit hook. It uses only values captured here (C functions, exact types, constants),
    never module or builtins globals, so monkeypatching from the agent's code cannot change it."""
    import _json
    import _stat

    encode = _json.encode_basestring_ascii
    write = os.write
    exit_now = os._exit
    lstat = os.lstat
    is_link, is_reg, is_dir = _stat.S_ISLNK, _stat.S_ISREG, _stat.S_ISDIR
    allowed = ALLOWED_EVENTS
    dangerous = DANGEROUS_MODULES
    write_flags = WRITE_FLAGS
    workspace = list_roots[0]
    read_roots, list_roots = tuple(read_roots), tuple(list_roots)
    type_of, repr_of, memview = type, repr, memoryview
    str_type, bytes_type, int_type = str, bytes, int
    os_error, import_error = OSError, ImportError
    allowed_modules = ", ".join(sorted(name for name in ALLOWED_MODULES if not name.startswith(("_", "encodings."))))

    def deny(event, detail):
        frame = (
            '{"status":"error","kind":"forbidden","event":'
            + encode(event)
            + ',"message":'
            + encode("the sandbox refused " + event + ": " + detail)
            + ',"isolation":'
            + isolation_json
            + "}\n"
        )
        try:
            view = memview(frame.encode("ascii"))
            while view:
                view = view[write(out_fd, view) :]
        finally:
            exit_now(0)

    def check_path(path, event, want_dir, roots):
        """Deny unless the path is (lexically) inside one of roots with no link on the way."""
        if type_of(path) is bytes_type:
            try:
                path = path.decode("utf-8", "strict")
            except Exception:  # noqa: BLE001
                deny(event, "the path is not UTF-8")
        if type_of(path) is not str_type:
            deny(event, "only plain str paths are allowed")
        if "\x00" in path:
            deny(event, "the path contains NUL")
        shown = repr_of(path)[:200]
        full = path if path.startswith("/") else workspace + "/" + path
        parts = []
        for part in full.split("/"):
            if part == "" or part == ".":
                continue
            if part == "..":
                deny(event, shown + " goes up a level; only files inside the workspace can be read")
            parts.append(part)
        normal = "/" + "/".join(parts)
        root = None
        for candidate in roots:
            if normal == candidate or normal.startswith(candidate + "/"):
                root = candidate
                break
        if root is None:
            deny(event, shown + " is outside the workspace; only files inside it can be read")
            raise SystemExit(1)  # deny never returns; should it ever, the operation is still refused
        # Check each component with lstat. Inside the workspace the check uses paths relative to
        # the cwd (the workspace; chdir is denied), so it resolves exactly as a relative open does
        # even when the absolute path is not traversable (after the privilege drop). When lstat
        # fails the operation itself fails the same way, so it is let through to fail.
        relative = root == workspace
        rest = [part for part in normal[len(root) :].split("/") if part != ""]
        if not relative and ("site-packages" in rest or "dist-packages" in rest):
            deny(event, shown + " is in site-packages; only the standard library can be read")
        walked = "" if relative else root
        for part in rest:
            walked = (walked + "/" + part) if walked else part
            try:
                mode = lstat(walked).st_mode
            except os_error:
                return
            if is_link(mode):
                deny(event, shown + " goes through a symbolic link")
        if not rest:
            mode = lstat(".").st_mode if relative else lstat(root).st_mode
        if want_dir and not is_dir(mode):
            deny(event, shown + " is not a directory")
        if not want_dir and not is_reg(mode):
            deny(event, shown + " is not a regular file")

    def hook(event, args):
        if event in allowed:
            return
        if event == "open":
            path, mode, flags = args
            if type_of(path) is int_type:
                deny(event, "opening file descriptors is not allowed")
            if type_of(mode) is str_type:
                for ch in "wax+":
                    if ch in mode:
                        deny(event, "writing files is not allowed; compute the reward from the arguments")
            if type_of(flags) is int_type and flags & write_flags:
                deny(event, "writing files is not allowed; compute the reward from the arguments")
            check_path(path, event, False, read_roots)
            return
        if event == "os.listdir" or event == "os.scandir":
            path = args[0] if args else None
            check_path(workspace if path is None else path, event, True, list_roots)
            return
        if event == "import":
            name = args[0]
            if type_of(name) is not str_type:
                deny(event, "odd import")
            if name.split(".")[0] in dangerous:
                deny(event, "module " + name + " (processes, network, FFI or interpreter internals) is not allowed")
            raise import_error("import of " + name + " is not allowed in the sandbox; allowed modules: " + allowed_modules)
        deny(event, "not allowed in the sandbox (no processes, network, signals, file changes or interpreter introspection)")

    return hook


def _plain(value, depth, budget):
    """A copy of a returned value made only of exact JSON types; ValueError otherwise."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("the return value is too large")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if not -(2**53) <= value <= 2**53:
            raise ValueError("an integer in the return value is too large")
        return value
    if kind is float:
        if not float("-inf") < value < float("inf"):  # NaN compares false too
            raise ValueError("the return value contains NaN or infinity")
        return value
    if depth > 16:
        raise ValueError("the return value is nested too deeply")
    if kind is list or kind is tuple:
        return [_plain(item, depth + 1, budget) for item in value]
    if kind is dict:
        out = {}
        for key in list(dict.keys(value)):
            if type(key) is not str:
                raise ValueError("dictionary keys in the return value must be str")
            out[key] = _plain(dict.__getitem__(value, key), depth + 1, budget)
        return out
    raise ValueError("the function returned a " + kind.__name__ + "; return a number (or other plain JSON value)")


def _user_line(exc, filename):
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _describe(exc):
    if isinstance(exc, SystemExit):
        return "SystemExit", "the code called exit(); return a value instead"
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = "(unprintable)"
    return type(exc).__name__, _short(text)


def _exports(namespace):
    functions = sorted(name for name, value in namespace.items() if type(name) is str and not name.startswith("_") and callable(value))[:100]
    components = None
    problem = None
    if "COMPONENTS" in namespace:
        value = namespace["COMPONENTS"]
        if type(value) is not dict:
            problem = "COMPONENTS must be a dict mapping names to functions, not " + type(value).__name__
        else:
            bad = [key for key, fn in dict.items(value) if type(key) is not str or not callable(fn)]
            if bad:
                problem = "COMPONENTS must map str names to functions; bad entries: " + _short(repr(bad[:5]))
            else:
                components = sorted(dict.keys(value))[:64]
    return {"functions": functions, "components": components, "components_problem": problem}


def _run_calls(namespace, calls, filename, budget):
    """Make each call against the module's namespace; one outcome dict per call (MemoryError propagates)."""
    outcomes = []
    for call in calls:
        function, key = call.get("function"), call.get("key")
        target = namespace.get(function)
        if key is not None:
            target = dict.get(target, key) if type(target) is dict else None
        label = function if key is None else f"{function}[{key!r}]"
        if target is None or not callable(target):
            outcomes.append({"ok": False, "kind": "crash", "type": "LookupError", "message": f"the module defines no function {label}"})
            continue
        try:
            value = target(*call.get("args", []), **call.get("kwargs", {}))
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001 - SystemExit and friends are the function's failure too
            kind, message = _describe(exc)
            outcomes.append({"ok": False, "kind": "crash", "type": kind, "message": message, "line": _user_line(exc, filename)})
            continue
        try:
            outcomes.append({"ok": True, "value": _plain(value, 0, budget)})
        except ValueError as exc:
            outcomes.append({"ok": False, "kind": "bad_output", "type": "ValueError", "message": _short(exc)})
    return outcomes


def main():
    """Batch mode (default): one request on stdin up to EOF, one result frame. ``--serve``: see :func:`_serve`."""
    import json

    serve = "--serve" in sys.argv[1:]
    dumps = json.dumps
    loads = json.loads
    out_fd = os.dup(1)
    applied: list[str] = []
    reader = None

    def flush_stdio():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - the agent's code may have broken its stdio
            pass

    def send(frame):
        flush_stdio()
        frame.setdefault("isolation", applied)
        _write_all(out_fd, (dumps(frame) + "\n").encode("utf-8"))

    def finish(frame):
        send(frame)
        os._exit(0)

    try:
        if serve:
            # requests are lines on a private copy of stdin; fd 0 itself is pointed at /dev/null below
            reader = open(os.dup(0), "rb", buffering=1 << 16)
            raw = reader.readline(MAX_REQUEST_BYTES + 1)
            if len(raw) > MAX_REQUEST_BYTES or not raw.endswith(b"\n"):
                raise ValueError("set-up request too large or not ended by a newline")
        else:
            raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
            if len(raw) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
        request = json.loads(raw)
        source = request["source"]
        filename = request["filename"]
        calls = request.get("calls", []) if serve else request["calls"]
        limits = request["limits"]
        max_value_items = int(request.get("max_value_items", 100_000))
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        workspace = os.path.realpath(os.getcwd())
        graders = request.get("graders")
        plugin_graders = request.get("plugin_graders") or {}
        if graders is not None:
            _load_graders(graders, plugin_graders)
        missing = []
        for name in ALLOWED_MODULES:
            try:
                __import__(name)
            except ImportError:
                missing.append(name)
        import _json  # noqa: F401 - the hook's encoder
        import linecache  # noqa: F401 - used by tracebacks the agent's code may format
        import resource  # noqa: F401 - needed after the privilege drop, when the stdlib may be unreadable
        import traceback  # noqa: F401

        _isolate(request, applied)
        _limits(limits, applied)
        os.dup2(2, 1)
        hook = None
        if request.get("audit_hook", True):
            applied.append("audit-hook")
            stdlib = os.path.realpath(os.path.dirname(os.__file__))
            graders_files = [graders, *plugin_graders.values()] if graders is not None else []
            hook = _make_hook(out_fd, [workspace, stdlib, *graders_files], [workspace], dumps(applied))
        ready_line = (dumps({"status": READY_STATUS, "isolation": applied}) + "\n").encode("utf-8")  # the layers, reported before any agent code
        reserve = bytearray(RESERVE_BYTES)
    except BaseException as exc:  # noqa: BLE001 - bootstrap failure: fail closed
        kind, message = _describe(exc)
        finish({"status": "error", "kind": "bootstrap", "type": kind, "message": "sandbox bootstrap failed: " + message})
        return

    if hook is not None:
        sys.addaudithook(hook)
    hook = None  # not in this frame's locals, where the agent's code can look (sys._getframe(1).f_locals)
    _write_all(out_fd, ready_line)  # set-up done: anything after this is the agent's responsibility, never the sandbox's report
    namespace = {"__name__": "environment", "__builtins__": __builtins__}
    try:
        try:
            code = compile(source, filename, "exec")
        except SyntaxError as exc:
            finish({"status": "error", "kind": "crash", "type": "SyntaxError", "message": _short(exc.msg), "line": exc.lineno})
        except (ValueError, RecursionError) as exc:
            kind, message = _describe(exc)
            finish({"status": "error", "kind": "crash", "type": kind, "message": message})
        try:
            exec(code, namespace)
        except MemoryError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure at import is the module's fault
            kind, message = _describe(exc)
            finish({"status": "error", "kind": "crash", "type": kind, "message": "importing the module failed: " + message, "line": _user_line(exc, filename)})
        exports = _exports(namespace)
        if serve:
            send({"status": "ok", "exports": exports, "calls": [], "missing_modules": missing})
            _serve(namespace, filename, reader, loads, send, finish, max_value_items)
        outcomes = _run_calls(namespace, calls, filename, [max_value_items])
        finish({"status": "ok", "exports": exports, "calls": outcomes, "missing_modules": missing})
    except MemoryError:
        del reserve
        finish({"status": "error", "kind": "memory", "type": "MemoryError", "message": "the module ran out of memory"})


def _serve(namespace, filename, reader, loads, send, finish, max_value_items):
    """Persistent mode: answer batch requests until stdin closes.

    Each request is one line ``{"id": N, "calls": [...]}`` and gets one frame
    ``{"status": "ok", "id": N, "calls": [...]}``; the id lets the parent notice a frame that the
    agent's code forged on the channel. End of input ends the process. The module stays imported
    between requests, so the CPU-seconds and memory limits count over the whole session. The parent
    only sends well-formed requests, so one the runner cannot parse means the agent's code read from
    the request channel: it ends the process with a ``bad_output`` frame.
    """
    while True:
        line = reader.readline(MAX_REQUEST_BYTES + 1)
        if not line:
            os._exit(0)
        try:
            if len(line) > MAX_REQUEST_BYTES or not line.endswith(b"\n"):
                raise ValueError("request too large or not ended by a newline")
            request = loads(line)
            request_id, calls = request["id"], request["calls"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            kind, message = _describe(exc)
            finish({"status": "error", "kind": "bad_output", "type": kind, "message": "the module's code read the request channel: " + message})
            return
        outcomes = _run_calls(namespace, calls, filename, [max_value_items])
        send({"status": "ok", "id": request_id, "calls": outcomes})


if __name__ == "__main__":
    main()
