"""The sandbox: a hostile corpus of agent code, limits, isolation layers and the result protocol.

Every case runs in a child process; the test process must survive all of them, get a structured
error of the expected kind, and never see the fake secret of its own environment or a hidden-eval
prompt in what comes back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from metarl import sandbox
from metarl.learning.families import get_family
from metarl.sandbox import (
    SandboxCall,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    run_calls_in_sandbox,
    run_in_sandbox,
)

HOSTILE = Path(__file__).resolve().parent.parent / "fixtures" / "hostile"
SECRET = "metarl-test-secret-4f9c2a71"
CASES = sorted(path.name for path in HOSTILE.glob("*.py"))
BASE_LIMITS = {"cpu_seconds": 1, "wall_seconds": 8.0, "memory_bytes": 256 * 1024**2, "max_stderr_bytes": 4 * 1024**2}


def header(source: str, key: str) -> str | None:
    match = re.search(rf"^# {key}: (.+)$", source, re.MULTILINE)
    return match.group(1).strip() if match else None


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


def assert_clean(result: SandboxResult, hidden_prompts: list[str]) -> None:
    text = result.model_dump_json()
    assert SECRET not in text
    assert "root:x:0:0" not in text  # /etc/passwd
    for prompt in hidden_prompts:
        assert prompt not in text


@pytest.mark.parametrize("case", CASES)
def test_hostile_corpus(case: str, tmp_path: Path, secret_env: str, hidden_file: tuple[Path, list[str]]) -> None:
    source = (HOSTILE / case).read_text(encoding="utf-8")
    expected = set((header(source, "expect") or "").split("|"))
    assert expected, f"{case} has no '# expect:' header"
    args = json.loads((header(source, "args") or '["add 1+2=", "3", "3"]').replace("{hidden}", str(hidden_file[0])))
    limits = SandboxLimits(**{**BASE_LIMITS, **json.loads(header(source, "limits") or "{}")})
    files = workspace_with(tmp_path, case, source)

    result = run_in_sandbox(files, case, "reward", args, limits)

    outcome = "ok" if result.ok else result.error.kind
    assert outcome in expected, f"{case}: got {outcome}: {result.error} / stderr: {result.stderr_tail[-500:]}"
    if not result.ok:
        assert result.error.message and result.error.fix
    assert_clean(result, hidden_file[1])
    if outcome in ("ok", "forbidden"):
        assert "audit-hook" in result.isolation and "rlimits" in result.isolation
    # nothing was written or linked in the workspace or next to it
    assert sorted(p.name for p in files.iterdir()) == [case]
    assert not Path("/tmp/metarl-sandbox-escape.txt").exists()


def test_environment_is_empty_but_for_path(tmp_path: Path, secret_env: str) -> None:
    source = (HOSTILE / "env_vars.py").read_text(encoding="utf-8")
    result = run_in_sandbox(workspace_with(tmp_path, "env_vars.py", source), "env_vars.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.ok, result.error
    assert set(result.value["os"]) <= {"PATH", "LC_ALL"}
    assert set(result.value["posix"]) <= {"PATH", "LC_ALL"}


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


def test_isolation_layers_reported(tmp_path: Path) -> None:
    files = workspace_with(tmp_path, "env.py", "def reward(p, c, a):\n    return 1.0\n")
    result = run_in_sandbox(files, "env.py", "reward", ["p", "c", "a"], SandboxLimits(**BASE_LIMITS))
    assert result.ok
    assert {"rlimits", "audit-hook"} <= set(result.isolation)
    if os.geteuid() == 0:
        assert "uid-65534" in result.isolation  # root must never run agent code as root
        assert "network-namespace" in result.isolation


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
        patch.setattr(sandbox.sys, "executable", str(tmp_path / "no-python"))
        with pytest.raises(SandboxUnavailable, match="cannot start"):
            run_in_sandbox(files, "env.py", "reward", [])
    if os.geteuid() == 0:
        with monkeypatch.context() as patch:
            patch.setattr(sandbox, "NOBODY", 2**40)  # the privilege drop fails during set-up
            with pytest.raises(SandboxUnavailable, match="set-up failed|bootstrap failed"):
                run_in_sandbox(files, "env.py", "reward", [])


def test_agent_cannot_forge_a_setup_failure(tmp_path: Path) -> None:
    source = (
        "import os\n"
        "os.write(3, b'{\"status\": \"error\", \"kind\": \"bootstrap\", \"message\": \"x\"}\\n')\n"
        "os._exit(0)\n"
    )
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", [], SandboxLimits(**BASE_LIMITS))
    assert not result.ok and result.error.kind == "bad_output"


@pytest.mark.parametrize("case", ["fork_bomb.py", "read_passwd.py", "socket_import.py", "proc_environ.py", "write_file.py"])
def test_audit_hook_alone_still_refuses(case: str, tmp_path: Path, secret_env: str) -> None:
    """With the kernel layers switched off (no privilege drop, no network namespace) the hook still holds."""
    source = (HOSTILE / case).read_text(encoding="utf-8")
    limits = SandboxLimits(**BASE_LIMITS, drop_privileges=False, isolate_network=False)
    result = run_in_sandbox(workspace_with(tmp_path, case, source), case, "reward", ["p", "c", "a"], limits)
    assert not result.ok and result.error.kind == "forbidden"
    assert not any(layer.startswith(("uid-", "network-namespace")) for layer in result.isolation)
    assert_clean(result, [])


def test_site_packages_are_not_readable(tmp_path: Path) -> None:
    source = "import os\ndef reward(p, c, a):\n    return open(os.path.dirname(os.__file__) + '/site-packages/x.py').read()\n"
    result = run_in_sandbox(workspace_with(tmp_path, "env.py", source), "env.py", "reward", [1, 2, 3], SandboxLimits(**BASE_LIMITS))
    assert result.error.kind == "forbidden" and "site-packages" in result.error.message
