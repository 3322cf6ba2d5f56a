"""The sandbox: a hostile corpus of agent code, limits, isolation layers and the result protocol.

Every case runs in a child process; the test process must survive all of them, get a structured
error of the expected kind, and never see the fake secret of its own environment or a hidden-eval
prompt in what comes back.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metarl.learning.registry import get_family
from metarl.sandbox import isolation, results
from metarl.sandbox import parent as sandbox
from metarl.sandbox.parent import (
    IsolationUnavailable,
    SandboxCall,
    SandboxLimits,
    SandboxResult,
    SandboxSession,
    SandboxUnavailable,
    run_calls_in_sandbox,
    run_in_sandbox,
)
from metarl.sandbox_runner import ALLOWED_MODULES

HOSTILE = Path(__file__).resolve().parent.parent / "fixtures" / "hostile"
SECRET = "metarl-test-secret-4f9c2a71"
CASES = sorted(path.name for path in HOSTILE.glob("*.py"))
BASE_LIMITS = {"cpu_seconds": 1, "wall_seconds": 8.0, "memory_bytes": 256 * 1024**2, "max_stderr_bytes": 4 * 1024**2}
HOST = isolation.host_isolation(str(sandbox.RUNNER), ALLOWED_MODULES)
FULL = HOST.problem is None
ALLOW_PROCESS = os.environ.get("METARL_ALLOW_PROCESS_ISOLATION") == "1"
"""Only a developer host that cannot run bubblewrap sets this (then the kernel-layer tests skip)."""
KERNEL_CASES = [case for case in CASES if re.search(r"^# without-hook: ", (HOSTILE / case).read_text(encoding="utf-8"), re.MULTILINE)]
SANDBOX_UID = 65534 if os.geteuid() == 0 else os.geteuid()
"""The host uid of sandboxed code: nobody for a root worker, the worker's own uid otherwise."""
LEVELS = ["full", "process"] if FULL else ["process"]
"""The isolation levels this host offers; the corpus runs at each (issue 40: a level is a wall, never the hook alone)."""
LEVEL_LAYERS = {
    "full": {"bubblewrap", "pid-namespace", "mount-namespace", "network-namespace", "seccomp"},
    "process": {"landlock", "seccomp", "no-new-privs", "rlimits"},
}


def header(source: str, key: str) -> str | None:
    match = re.search(rf"^# {key}: (.+)$", source, re.MULTILINE)
    return match.group(1).strip() if match else None


def outcomes(source: str, key: str, level: str) -> set[str]:
    """The accepted outcomes of a case at ``level``: ``# KEY-LEVEL:`` where the levels differ, else ``# KEY:``."""
    return set((header(source, f"{key}-{level}") or header(source, key) or "").split("|")) - {""}


def unexercised(result: SandboxResult) -> bool:
    """True when a case never reached the wall: at level process a root worker's sandbox runs as nobody, which
    cannot read a standard library under a 0700 folder (pyenv under /root), so a module that imports one not
    loaded before the agent's code (ctypes, socket) fails at import. The unprivileged run reads it."""
    error = result.error
    return result.level == "process" and error is not None and error.exception_type == "ModuleNotFoundError" and error.line is not None


@pytest.fixture(params=LEVELS)
def level(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The isolation level a test runs at; ``process`` as on a host that refuses user namespaces (no bubblewrap)."""
    if request.param == "process":
        unavailable = isolation.HostIsolation(bwrap=None, root=None, problem="bwrap failed (exit 1): No permissions to create a new namespace")
        monkeypatch.setattr(isolation, "host_isolation", lambda runner, modules: unavailable)
    return str(request.param)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("METARL_TEST_SECRET", SECRET)
    return SECRET


@pytest.fixture
def hidden_file(tmp_path: Path) -> tuple[Path, list[str]]:
    """A hidden-eval file outside the workspace (two levels above it)."""
    items = get_family("addition").hidden_eval(12)
    path = tmp_path / "hidden_eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": item.prompt, "answer": item.answer}) + "\n" for item in items), encoding="utf-8")
    return path, [item.prompt for item in items]


def workspace_with(tmp_path: Path, name: str, source: str) -> Path:
    files = tmp_path / "attempt" / "files"
    files.mkdir(parents=True, exist_ok=True)
    (files / name).write_text(source, encoding="utf-8")
    return files


def assert_clean(result: SandboxResult, hidden_prompts: list[str], must_not_see: tuple[str, ...] = ()) -> None:
    text = result.model_dump_json()
    assert SECRET not in text
    assert "root:x:0:0" not in text  # /etc/passwd
    for prompt in hidden_prompts:
        assert prompt not in text
    for needle in must_not_see:
        assert needle not in text, f"{needle!r} leaked into the result"


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of the sandbox's host uid (another reward session, say) that must survive."""
    extra = {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []} if os.geteuid() == 0 else {}
    process = subprocess.Popen(["sleep", "120"], stdin=subprocess.DEVNULL, start_new_session=True, **extra)  # type: ignore[call-overload]
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def abstract_listener() -> Iterator[tuple[str, socket.socket]]:
    """A tag for host paths, and an abstract unix socket of that name listening in this process."""
    tag = f"metarl-hostile-{uuid.uuid4().hex[:12]}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + tag)
    listener.listen(4)
    listener.setblocking(False)
    yield tag, listener
    listener.close()
    for path in glob.glob(f"/tmp/{tag}*"):
        os.unlink(path)


def fill(text: str, tmp_path: Path, hidden: Path, victim: subprocess.Popen[bytes], tag: str) -> str:
    """A case's source or ``# args:`` with its placeholders filled in (see tests/fixtures/hostile/README.md)."""
    other = tmp_path / "other-attempt" / "files" / "dataset.jsonl"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text("other-workspace-marker\n", encoding="utf-8")
    for name, value in {"hidden": hidden, "victim": victim.pid, "other": other, "tag": tag}.items():
        text = text.replace("{" + name + "}", str(value))
    return text


def case_setup(case: str, tmp_path: Path, hidden: Path, victim: subprocess.Popen[bytes], tag: str) -> tuple[str, list[object], SandboxLimits]:
    """A hostile module's source and call arguments (placeholders filled in) and its limits."""
    source = (HOSTILE / case).read_text(encoding="utf-8")
    limits = SandboxLimits(**{**BASE_LIMITS, **json.loads(header(source, "limits") or "{}")})
    args = json.loads(fill(header(source, "args") or '["add 1+2=", "3", "3"]', tmp_path, hidden, victim, tag))
    return fill(source, tmp_path, hidden, victim, tag), args, limits


def assert_contained(
    case: str, result: SandboxResult, expected: set[str], files: Path, victim: subprocess.Popen[bytes], listener: socket.socket, tag: str
) -> None:
    """The outcome is one of ``expected`` and nothing outside the sandbox changed."""
    outcome = "ok" if result.ok else result.error.kind
    assert outcome in expected, f"{case}: got {outcome}: {result.error} / stderr: {result.stderr_tail[-500:]}"
    if not result.ok:
        assert result.error.message and result.error.fix
    assert victim.poll() is None, f"{case} killed another process of the sandbox's uid"
    with pytest.raises(BlockingIOError):
        listener.accept()
    assert glob.glob(f"/tmp/{tag}*") == [], f"{case} created files in the host's /tmp"
    assert sorted(p.name for p in files.iterdir()) == [case]  # nothing written or linked in the workspace
    assert not Path("/tmp/metarl-sandbox-escape.txt").exists()


@pytest.mark.parametrize("case", CASES)
def test_hostile_corpus(
    case: str,
    tmp_path: Path,
    secret_env: str,
    hidden_file: tuple[Path, list[str]],
    victim: subprocess.Popen[bytes],
    abstract_listener: tuple[str, socket.socket],
    level: str,
) -> None:
    tag, listener = abstract_listener
    source, args, limits = case_setup(case, tmp_path, hidden_file[0], victim, tag)
    expected = outcomes(source, "expect", level)
    assert expected, f"{case} has no '# expect:' header"
    files = workspace_with(tmp_path, case, source)

    result = run_in_sandbox(files, case, "reward", args, limits.model_copy(update={"min_isolation": level}))

    assert_contained(case, result, expected, files, victim, listener, tag)
    assert_clean(result, hidden_file[1], tuple((header(source, "must-not-see") or "").split("|")) if header(source, "must-not-see") else ())
    assert result.level == level and LEVEL_LAYERS[level] <= set(result.isolation), result.isolation
    if result.ok or (result.error.kind == "forbidden" and result.error.event != "seccomp"):
        assert "audit-hook" in result.isolation and "rlimits" in result.isolation


@pytest.mark.parametrize("case", KERNEL_CASES)
def test_kernel_layers_hold_without_the_audit_hook(
    case: str,
    tmp_path: Path,
    secret_env: str,
    hidden_file: tuple[Path, list[str]],
    victim: subprocess.Popen[bytes],
    abstract_listener: tuple[str, socket.socket],
    level: str,
) -> None:
    """The audit hook switched off (as agent code can switch it off, issue 40), at every level: full's namespaces, read-only
    root, seccomp and rlimits, or process's Landlock, seccomp, nobody and rlimits, alone contain each case."""
    tag, listener = abstract_listener
    source, args, limits = case_setup(case, tmp_path, hidden_file[0], victim, tag)
    expected = outcomes(source, "without-hook", level)
    files = workspace_with(tmp_path, case, source)

    result = run_in_sandbox(files, case, "reward", args, limits.model_copy(update={"audit_hook": False, "min_isolation": level}))

    if unexercised(result):
        assert_contained(case, result, {"crash"}, files, victim, listener, tag)
        pytest.skip(f"{case} could not import what it needs: {result.error.message} (tests/unprivileged.py's run covers it)")
    assert_contained(case, result, expected, files, victim, listener, tag)
    assert_clean(result, hidden_file[1], tuple((header(source, "must-not-see") or "").split("|")) if header(source, "must-not-see") else ())
    assert result.level == level and LEVEL_LAYERS[level] <= set(result.isolation) and "audit-hook" not in result.isolation
    if not result.ok and result.error.kind == "forbidden":
        assert result.error.event == "seccomp" or "larger than allowed" in result.error.message, result.error


def test_full_isolation_is_available() -> None:
    """The default ([sandbox] min_isolation = "full") must work here, as root and as any other user."""
    if not ALLOW_PROCESS:
        assert FULL, HOST.problem


@pytest.fixture
def without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where bubblewrap cannot run (user namespaces refused, say)."""
    unavailable = isolation.HostIsolation(bwrap=None, root=None, problem="bwrap failed (exit 1): No permissions to create a new namespace")
    monkeypatch.setattr(isolation, "host_isolation", lambda runner, modules: unavailable)


def test_weaker_isolation_is_refused_unless_the_deployment_accepts_it(tmp_path: Path, without_bubblewrap: None) -> None:
    files = workspace_with(tmp_path, "env.py", "def reward(p, c, a):\n    return 1.0\n")
    with pytest.raises(IsolationUnavailable) as refused:
        run_in_sandbox(files, "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    message = str(refused.value)
    assert "[sandbox] min_isolation" in message and "No permissions to create a new namespace" in message
    assert 'min_isolation = "process"' in message and "user namespaces" in message  # the fixes
    with pytest.raises(IsolationUnavailable):
        sandbox.SandboxSession(files, "env.py", SandboxLimits(**BASE_LIMITS)).start()
    accepted = run_in_sandbox(files, "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS, min_isolation="process"))
    assert accepted.ok and accepted.value == 1.0
    assert accepted.level == "process" and "bubblewrap" not in accepted.isolation and "rlimits" in accepted.isolation


GRADERS_PROBE = (
    "import metarl_graders\n"
    "def reward(p, c, a):\n"
    "    return [metarl_graders.__file__, metarl_graders.grade('addition', a, c), metarl_graders.is_well_formed('date_format', c),\n"
    "            sorted(metarl_graders.reward_components('addition', 8))]\n"
)


def test_the_environment_module_imports_metarl_graders(tmp_path: Path) -> None:
    """The task families' graders (metarl/graders.py, the one file) are importable as metarl_graders, bound read-only."""
    files = workspace_with(tmp_path, "env.py", GRADERS_PROBE)
    result = run_in_sandbox(files, "env.py", "reward", ["add 20+22=", "32", "42"], SandboxLimits(**BASE_LIMITS))
    assert result.ok, result.error
    where = isolation.SANDBOX_GRADERS if result.level == "full" else str(sandbox.GRADERS)
    assert result.value == [where, 0.25, False, ["correctness", "exact", "format", "length_penalty"]]
    refused = run_in_sandbox(workspace_with(tmp_path, "env2.py", "import metarl\n"), "env2.py", "reward", [], SandboxLimits(**BASE_LIMITS))
    assert refused.error.kind == "crash" and "metarl_graders" in refused.error.message  # only the graders: named among the allowed modules


def test_metarl_graders_without_bubblewrap(tmp_path: Path, without_bubblewrap: None) -> None:
    files = workspace_with(tmp_path, "env.py", GRADERS_PROBE)
    result = run_in_sandbox(files, "env.py", "reward", ["add 20+22=", "32", "42"], SandboxLimits(**BASE_LIMITS, min_isolation="process"))
    assert result.ok and result.level == "process", result.error
    assert result.value == [str(sandbox.GRADERS), 0.25, False, ["correctness", "exact", "format", "length_penalty"]]


def test_environment_is_empty_but_for_path(tmp_path: Path, secret_env: str) -> None:
    source = (HOSTILE / "env_vars.py").read_text(encoding="utf-8")
    result = run_in_sandbox(workspace_with(tmp_path, "env_vars.py", source), "env_vars.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.ok, result.error
    # under bubblewrap: the loader's library path and the working directory bwrap sets; nothing of ours
    allowed = {"PATH", "LC_ALL"} | ({"LD_LIBRARY_PATH", "PWD"} if result.level == "full" else set())
    assert set(result.value["os"]) <= allowed
    assert set(result.value["posix"]) <= allowed


def test_forbidden_reports_the_event(tmp_path: Path) -> None:
    source = (HOSTILE / "fork_caught.py").read_text(encoding="utf-8")
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert not result.ok and result.error.kind == "forbidden"
    assert result.error.event == "os.fork"
    assert "os.fork" in result.error.message


def test_crash_names_type_and_line(tmp_path: Path) -> None:
    source = "def reward(prompt, completion, answer):\n    x = 1\n    return 1 / 0\n"
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.error.kind == "crash"
    assert result.error.exception_type == "ZeroDivisionError"
    assert result.error.line == 3
    syntax = run_in_sandbox(workspace_with(tmp_path, "bad.py", "x = (\n"), "bad.py", "reward", [], SandboxLimits(**BASE_LIMITS))
    assert syntax.error.kind == "crash" and syntax.error.exception_type == "SyntaxError" and syntax.error.line == 1


def test_batch_calls_and_exports(tmp_path: Path) -> None:
    source = (
        "def reward(prompt, completion, answer):\n"
        "    return float(completion.strip() == answer)\n"
        "def fmt(prompt, completion, answer):\n"
        "    return float(completion.strip().isdigit())\n"
        "def broken(prompt, completion, answer):\n"
        "    raise ValueError('nope')\n"
        "COMPONENTS = {'correctness': reward, 'format': fmt, 'broken': broken}\n"
    )
    files = workspace_with(tmp_path, "environment.py", source)
    calls = [
        SandboxCall(function="reward", args=["add 1+2=", "3", "3"]),
        SandboxCall(function="reward", args=["add 1+2=", "4", "3"]),
        SandboxCall(function="COMPONENTS", key="format", kwargs={"prompt": "x", "completion": "12", "answer": "3"}),
        SandboxCall(function="COMPONENTS", key="broken", args=["x", "y", "z"]),
        SandboxCall(function="COMPONENTS", key="missing", args=["x", "y", "z"]),
        SandboxCall(function="reward", args=["too few"]),
    ]
    result = run_calls_in_sandbox(files, "environment.py", calls, SandboxLimits(**BASE_LIMITS))
    assert result.ok
    assert [outcome.ok for outcome in result.calls] == [True, True, True, False, False, False]
    assert [outcome.value for outcome in result.calls[:3]] == [1.0, 0.0, 1.0]
    assert result.calls[3].error.exception_type == "ValueError" and result.calls[3].error.line == 6
    assert "no function" in result.calls[4].error.message
    assert result.calls[5].error.exception_type == "TypeError"
    assert result.exports.components == ["broken", "correctness", "format"]
    assert {"reward", "fmt", "broken"} <= set(result.exports.functions)


@pytest.mark.skipif(not FULL, reason=f"no full isolation on this host: {HOST.problem}")
def test_isolation_layers_reported(tmp_path: Path) -> None:
    source = "import os\ndef reward(p, c, a):\n    return [os.getcwd(), os.getuid(), os.getpid(), sorted(os.listdir('/workspace'))]\n"
    files = workspace_with(tmp_path, "env.py", source)
    result = run_in_sandbox(files, "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.ok, result.error
    assert result.level == "full"
    assert {"bubblewrap", "pid-namespace", "mount-namespace", "network-namespace", "ipc-namespace", "uts-namespace", "seccomp"} <= set(result.isolation)
    assert {"rlimits", "audit-hook", "no-new-privs"} <= set(result.isolation)
    if os.geteuid() == 0:
        assert "uid-65534" in result.isolation  # root must never run agent code as root
    else:
        assert "user-namespace" in result.isolation
    # the probe's and the trainer's layout: the workspace at /workspace, the working directory; PID 1 of its own namespace; nobody
    assert result.value == ["/workspace", 65534, 2, ["env.py"]]  # PID 1 of its namespace is bubblewrap's init
    # under bubblewrap a root start always drops to nobody, whatever the (process-level) knob says
    kept = run_in_sandbox(files, "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS, drop_privileges=False))
    assert kept.ok and kept.value[1] == 65534


def test_planted_symlink_in_workspace_is_not_followed(tmp_path: Path, hidden_file: tuple[Path, list[str]]) -> None:
    source = "def reward(prompt, completion, answer):\n    return open(prompt).read()\n"
    files = workspace_with(tmp_path, "env.py", source)
    (files / "data.jsonl").symlink_to(hidden_file[0])
    os.mkdir(files / "sub")
    (files / "sub" / "up").symlink_to(tmp_path)
    for target in ("data.jsonl", "sub/up/hidden_eval.jsonl"):
        result = run_in_sandbox(files, "env.py", "reward", [target, "c", "a"], SandboxLimits(**BASE_LIMITS))
        assert not result.ok and result.error.kind == "forbidden", target
        assert "symbolic link" in result.error.message
        assert_clean(result, hidden_file[1])
    # the module file itself as a link is refused before anything runs
    (files / "linked.py").symlink_to(files / "env.py")
    result = run_in_sandbox(files, "linked.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.error.kind == "bad_input" and "link" in result.error.message


@pytest.mark.parametrize(
    ("module_file", "args", "needle"),
    [
        ("../env.py", "[]", "up a level"),
        ("/etc/passwd", "[]", "absolute"),
        ("missing.py", "[]", "no file"),
        ("env.py", "{not json", "not JSON"),
        ("env.py", "3", "array"),
        ("env.py", '{"": 1}', ""),
    ],
)
def test_bad_input(tmp_path: Path, module_file: str, args: str, needle: str) -> None:
    files = workspace_with(tmp_path, "env.py", "def reward(p, c, a):\n    return 1.0\n")
    result = run_in_sandbox(files, module_file, "reward", args, SandboxLimits(**BASE_LIMITS))
    assert not result.ok
    assert result.error.kind in ("bad_input", "crash")
    assert needle in result.error.message


def test_missing_workspace_and_invalid_source(tmp_path: Path) -> None:
    assert run_in_sandbox(tmp_path / "nope", "env.py", "reward").error.kind == "bad_input"
    files = tmp_path / "files"
    files.mkdir()
    (files / "env.py").write_bytes(b"def reward(p, c, a):\n    return '\xff'\n")
    result = run_in_sandbox(files, "env.py", "reward", [])
    assert result.error.kind == "bad_input" and "UTF-8" in result.error.message
    shutil.rmtree(files)


def test_sandbox_failures_are_raised_not_blamed_on_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = workspace_with(tmp_path, "env.py", "def reward(p, c, a):\n    return 1.0\n")
    with monkeypatch.context() as patch:
        missing = isolation.HostIsolation(bwrap=str(tmp_path / "no-bwrap"), root=HOST.root, problem=None)
        patch.setattr(isolation, "host_isolation", lambda runner, modules: missing)
        with pytest.raises(SandboxUnavailable, match="cannot start"):
            run_in_sandbox(files, "env.py", "reward", [])
    with monkeypatch.context() as patch:
        unavailable = isolation.HostIsolation(bwrap=None, root=None, problem="test")
        patch.setattr(isolation, "host_isolation", lambda runner, modules: unavailable)
        patch.setattr(sandbox.sys, "executable", str(tmp_path / "no-python"))
        with pytest.raises(SandboxUnavailable, match="cannot start"):
            run_in_sandbox(files, "env.py", "reward", [], SandboxLimits(min_isolation="process"))
    if os.geteuid() == 0:
        with monkeypatch.context() as patch:
            patch.setattr(sandbox, "NOBODY", 2**40)  # the privilege drop fails during set-up
            with pytest.raises(SandboxUnavailable, match="set-up failed|bootstrap failed"):
                run_in_sandbox(files, "env.py", "reward", [])


def test_agent_cannot_forge_a_setup_failure(tmp_path: Path) -> None:
    source = 'import os\nos.write(3, b\'{"status": "error", "kind": "bootstrap", "message": "x"}\\n\')\nos._exit(0)\n'
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", [], SandboxLimits(**BASE_LIMITS))
    assert not result.ok and result.error.kind == "bad_output"


FORGED_SETUP_FAILURE = 'os.write(3, b\'{"status":"error","kind":"bootstrap","message":"host out of memory"}\\n\')\nos._exit(0)\n'


@pytest.mark.parametrize("when", ["import", "call"])
def test_a_forged_setup_failure_in_a_session_is_the_modules_fault(tmp_path: Path, when: str) -> None:
    """Issue 40: a set-up failure report written by the module's code (at import or in a call) made the session raise
    SandboxUnavailable ("not the workspace's fault", retried). The set-up report comes before any agent code, so it is forged."""
    body = FORGED_SETUP_FAILURE if when == "import" else "def reward(p, c, a):\n" + "".join("    " + line + "\n" for line in FORGED_SETUP_FAILURE.splitlines())
    files = workspace_with(tmp_path, "env.py", "import os\n" + body)
    with SandboxSession(files, "env.py", SandboxLimits(**BASE_LIMITS)) as session:
        result = session.start()
        if when == "call":
            assert result.ok, result.error
            result = session.call([SandboxCall(function="reward", args=["p", "c", "a"])])
    assert not result.ok and result.error.kind == "bad_output", result.error
    assert "forged or malformed result frame" in result.error.message and "set-up failure" in result.error.message
    assert "host out of memory" not in result.model_dump_json() and "fd 3" in result.error.fix
    assert result.level == ("full" if FULL else "process") and "rlimits" in result.isolation


def child_run(*lines: object) -> results.ChildRun:
    """A finished child run whose result channel carried the runner's set-up report and then ``lines`` (JSON text as given)."""
    run = results.ChildRun(None)
    run.stdout = bytearray(b'{"status": "ready", "isolation": ["rlimits"]}\n' + b"".join(str(line).encode() + b"\n" for line in lines))
    run.status = 0
    return run


def ok_frame(*values: str) -> str:
    return '{"status": "ok", "calls": [' + ", ".join('{"ok": true, "value": ' + value + "}" for value in values) + "]}"


@pytest.mark.parametrize(
    ("lines", "n_calls", "needle"),
    [
        ([ok_frame("1" + "0" * 400)], 1, "an integer beyond ±2**53"),
        ([ok_frame("1.0", "-" + "9" * 17)], 2, "value of call 1 holds an integer beyond"),
        ([ok_frame("1e400")], 1, "NaN or infinity"),
        ([ok_frame("NaN")], 1, "NaN or infinity"),
        ([ok_frame("[" * 30 + "]" * 30)], 1, "nested deeper than 17"),
        ([ok_frame('{"a": -Infinity}')], 1, "NaN or infinity"),
        ([ok_frame("1.0")], 2, "1 answers for 2 calls"),
        (['{"status": "ok", "calls": 5}'], 1, "no answers for 1 calls"),
        (['{"status": "ok", "calls": [7]}'], 1, "the answer to call 0 is not a JSON object"),
        (['{"status": "ok", "calls": [{"ok": false, "kind": "timeout", "message": "x"}]}'], 1, "neither a value nor a failure"),
        (['{"status": "ok", "calls": [], "exports": {"functions": 5}}'], 0, "exports are not of the runner's shape"),
        (['{"status": "error", "kind": "bootstrap", "message": "host out of memory"}'], 0, "set-up failure reported after the set-up had finished"),
        (['{"status": "error", "kind": "timeout", "message": "the platform is slow"}'], 0, "an error of a kind the runner never reports"),
        (['{"status": "ready", "isolation": ["seccomp"]}'], 0, "neither a result nor an error"),
        (["[1, 2]"], 0, "the result frame is not a JSON object"),
        (["not json"], 0, "a line that is not JSON"),
        (["1" * 5000], 0, "a line that is not JSON"),
        ([ok_frame("1.0"), ok_frame("2.0")], 1, "more than one frame"),
    ],
)
def test_frames_and_numbers_from_the_child_are_parsed_defensively(lines: list[str], n_calls: int, needle: str) -> None:
    """Issue 40: a forged frame whose reward was 10**400 came back as a value the probe could not convert (OverflowError).
    Every frame after the set-up report is checked against what the runner writes; a forged one is the module's fault."""
    result = results.interpret_run(child_run(*lines), SandboxLimits(), n_calls, 0.1)
    assert not result.ok and result.error.kind == "bad_output", result
    assert result.error.message.startswith("forged or malformed result frame: ") and needle in result.error.message, result.error.message
    assert result.isolation == ["rlimits"]


def test_failures_in_a_frame_keep_only_what_can_be_shown() -> None:
    """Messages, types and lines of a frame are taken only when they are what the runner writes (a string, a plausible line)."""
    line = str(10**400)
    error_frame = '{"status": "error", "kind": "crash", "message": [[1]], "type": 5, "line": ' + line + "}"
    result = results.interpret_run(child_run(error_frame), SandboxLimits(), 0, 0.1)
    assert result.error.kind == "crash" and result.error.message == "" and result.error.exception_type is None and result.error.line is None
    call_failure = '{"status": "ok", "calls": [{"ok": false, "kind": "crash", "message": "boom", "type": "KeyError", "line": 3}]}'
    outcome = results.interpret_run(child_run(call_failure), SandboxLimits(), 1, 0.1).calls[0]
    assert not outcome.ok and outcome.error.message == "boom" and outcome.error.exception_type == "KeyError" and outcome.error.line == 3
    good = results.interpret_run(child_run(ok_frame("1.5", '{"a": [1, "x", null, true]}')), SandboxLimits(), 2, 0.1)
    assert good.ok and [call.value for call in good.calls] == [1.5, {"a": [1, "x", None, True]}]


def test_the_setup_report_alone_names_the_isolation_layers(tmp_path: Path) -> None:
    """Layers claimed in a frame the module's code wrote (after the set-up report) are not believed."""
    source = (
        "import os\n\ndef reward(p, c, a):\n"
        '    os.write(3, b\'{"status": "ok", "isolation": ["made-up-layer"], "calls": [{"ok": true, "value": 1.0}]}\\n\')\n'
        "    os._exit(0)\n"
    )
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.ok and result.value == 1.0  # a result it could have returned anyway
    assert "made-up-layer" not in result.isolation and "rlimits" in result.isolation


def test_one_deadline_for_the_import_and_the_calls(tmp_path: Path) -> None:
    """SandboxSession.call(deadline=...) ends the batch at a shared instant (the probe: one deadline for import and calls)."""
    import time

    source = "import time\ntime.sleep(1.0)\n\ndef reward(p, c, a):\n    time.sleep(1.0)\n    return 1.0\n"
    files = workspace_with(tmp_path, "env.py", source)
    limits = SandboxLimits(**{**BASE_LIMITS, "wall_seconds": 1.6})
    with SandboxSession(files, "env.py", limits) as session:
        deadline = time.monotonic() + limits.wall_seconds
        assert session.start().ok
        result = session.call([SandboxCall(function="reward", args=["p", "c", "a"])], deadline=deadline)
    assert result.error is not None and result.error.kind == "timeout" and "1.6 s" in result.error.message
    with SandboxSession(files, "env.py", limits) as session:
        assert session.start().ok
        assert session.call([SandboxCall(function="reward", args=["p", "c", "a"])]).ok  # without it, each part has the whole limit


@pytest.mark.parametrize("case", ["fork_bomb.py", "read_passwd.py", "socket_import.py", "proc_environ.py", "write_file.py"])
def test_audit_hook_still_refuses_first(case: str, tmp_path: Path, secret_env: str, without_bubblewrap: None) -> None:
    """Without bubblewrap or a network namespace the hook still refuses first, naming its event: a tripwire that reports
    what the module tried (the process level's kernel wall stands behind it; drop_privileges=False changes nothing)."""
    source = (HOSTILE / case).read_text(encoding="utf-8")
    limits = SandboxLimits(**BASE_LIMITS, drop_privileges=False, isolate_network=False, min_isolation="process")
    result = run_in_sandbox(workspace_with(tmp_path, case, source), case, "reward", ["p", "c", "a"], limits)
    assert not result.ok and result.error.kind == "forbidden" and result.error.event not in (None, "seccomp"), result.error
    assert not any(layer.startswith("network-namespace") for layer in result.isolation)
    assert {"landlock", "seccomp"} <= set(result.isolation) and (os.geteuid() != 0 or "uid-65534" in result.isolation)
    assert_clean(result, [])


def test_site_packages_are_not_readable(tmp_path: Path) -> None:
    source = "import os\ndef reward(p, c, a):\n    return open(os.path.dirname(os.__file__) + '/site-packages/x.py').read()\n"
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", [1, 2, 3], SandboxLimits(**BASE_LIMITS))
    assert result.error.kind == "forbidden" and "site-packages" in result.error.message


@pytest.mark.slow
def test_the_corpus_is_contained_for_an_unprivileged_worker() -> None:
    """This file's corpus and kernel-layer tests again, run by pytest as nobody (a non-root worker):
    bubblewrap then runs unprivileged, with a user namespace, and must hold the same way."""
    from tests.unprivileged import NOBODY, nobody_python, shared_folder

    found = nobody_python()
    if isinstance(found, str):
        pytest.skip(f"cannot run as an unprivileged user here: {found}")
    prefix, env = found
    basetemp = shared_folder("metarl-nobody-pytest-")
    os.chown(basetemp, NOBODY, NOBODY)
    selection = "hostile_corpus or kernel_layers or isolation_layers or full_isolation_is_available"
    command = [*prefix, "-m", "pytest", str(Path(__file__)), "-q", "-p", "no:cacheprovider", "--basetemp", str(basetemp), "-k", selection]
    try:
        result = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=900, cwd=str(HOSTILE.parents[2]))
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], result.stdout[-1000:]


def orphaned_runners(since: float) -> list[int]:
    """Sandbox runner processes started after ``since`` whose parent is gone (re-parented to PID 1)."""
    found = []
    for status_file in glob.glob("/proc/[0-9]*/status"):
        pid = int(status_file.split("/")[2])
        try:
            status = Path(status_file).read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            started = os.stat(f"/proc/{pid}").st_mtime
        except OSError:
            continue
        parent = re.search(r"^PPid:\s+(\d+)", status, re.M)
        if b"runner.py" in cmdline and parent and parent.group(1) == "1" and started >= since:
            found.append(pid)
    return found


def test_no_agent_code_outlives_a_killed_worker(tmp_path: Path) -> None:
    """A worker killed with SIGKILL while the agent's code loops: the sandbox dies with it (a root worker's
    runner changes uid, which clears its own parent-death signal; the namespace's init must take it down)."""
    import sys
    import time

    (tmp_path / "environment.py").write_text("def reward(prompt, completion, answer):\n    while True:\n        pass\n")
    worker_code = (
        "import sys\nfrom metarl.sandbox.parent import SandboxCall, SandboxLimits, SandboxSession\n"
        f"session = SandboxSession({str(tmp_path)!r}, 'environment.py', SandboxLimits(cpu_seconds=600, wall_seconds=600))\n"
        "print(session.start().ok, flush=True)\n"
        "session.call([SandboxCall(function='reward', args=['a', 'b', 'c'])], wall_seconds=600)\n"
    )
    since = time.time() - 1
    worker = subprocess.Popen([sys.executable, "-c", worker_code], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "True"
        time.sleep(1.0)  # the module is looping now
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 5
    while orphaned_runners(since) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = orphaned_runners(since)
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"sandboxed agent code outlived its worker: {left}"


def test_a_hard_link_planted_in_the_workspace_is_refused_before_the_module_runs(tmp_path: Path, level: str) -> None:
    """An outside red-team pass found it: a hard link is the outside file under a workspace path, which Landlock and the
    bind mount both allow. The agent cannot make one in the sandbox; a workspace that holds one is refused, at any depth."""
    outside = tmp_path / "outside_secret.txt"
    outside.write_text(SECRET, encoding="utf-8")
    outside.chmod(0o644)
    files = workspace_with(tmp_path, "env.py", "def reward(p, c, a):\n    return open('a/b/c/leak.txt').read()\n")
    (files / "a" / "b" / "c").mkdir(parents=True)
    os.link(outside, files / "a" / "b" / "c" / "leak.txt")
    result = run_calls_in_sandbox(files, "env.py", [SandboxCall(function="reward", args=["p", "c", "a"])], SandboxLimits(**BASE_LIMITS, min_isolation=level))
    assert result.error is not None and result.error.kind == "bad_input", result
    assert "hard-linked" in result.error.message and "a/b/c/leak.txt" in result.error.message
    assert_clean(result, [])
    os.unlink(files / "a" / "b" / "c" / "leak.txt")
    (files / "a" / "b" / "c" / "leak.txt").write_text("a copy is fine", encoding="utf-8")
    copied = run_calls_in_sandbox(files, "env.py", [SandboxCall(function="reward", args=["p", "c", "a"])], SandboxLimits(**BASE_LIMITS, min_isolation=level))
    assert copied.error is None and copied.calls[0].value == "a copy is fine", copied
