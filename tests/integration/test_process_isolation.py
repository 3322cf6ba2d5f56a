"""Issue 40 acceptance: at ``[sandbox] min_isolation = "process"`` the hook-rewrite module reads no file
outside its workspace, writes nothing outside it and signals nothing, for a root worker and a non-root one.

The level is the one for hosts that refuse user namespaces: no bubblewrap, so the test makes bubblewrap
unavailable the way such a host does (``isolation.host_isolation`` reports it) and runs the real runner
as a plain process, which walls itself in with Landlock, the seccomp filter, nobody (for a root worker)
and rlimits. The module first tries the issue's one-line escape (``sys._getframe(1).f_locals["hook"]``
and a rewritten closure cell); the runner no longer keeps the hook there, so with the hook on it is
caught by the hook. Then the same module runs with the hook off, which is what a successful rewrite
gives it: the kernel wall alone must hold. Next to the workspace lie a 0600 key file of the worker's
own uid (the issue's ``eval_partition.key``), a hidden-eval file and another workspace's file; a live
process of the sandbox's uid (and, for the non-root worker, the worker itself) must survive. Needs no
Redis or PostgreSQL: a driver script runs the sandbox as the worker would, as root and as nobody
(tests/unprivileged.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metarl.sandbox import landlock
from tests.conftest import REPO
from tests.unprivileged import nobody_python

HOOK_REWRITE = (REPO / "tests" / "fixtures" / "hostile" / "hook_rewrite.py").read_text(encoding="utf-8")
PRELUDE = HOOK_REWRITE[HOOK_REWRITE.index("import os\n") : HOOK_REWRITE.index("def reward(")]
"""The hostile corpus's hook rewrite (issue 40's reproducer), run here before the module's own attempts."""

MODULE = (
    PRELUDE
    + """def attempt(action):
    try:
        return action()
    except OSError as exc:
        return "refused: " + (os.strerror(exc.errno) if exc.errno else type(exc).__name__)


def reads(paths):
    def read(path):
        with open(path, "rb") as handle:
            return handle.read(300).decode("latin-1")
    return {"hook_off": HOOK_OFF, "workspace": attempt(lambda: read("dataset.jsonl")), **{path: attempt(lambda path=path: read(path)) for path in paths},
            "listing /": attempt(lambda: sorted(os.listdir("/"))[:5])}


def writes(folder, key):
    def create(path):
        with open(path, "w") as handle:
            handle.write("escaped")
        return "written"
    return {
        "tmp": attempt(lambda: create("/tmp/" + folder.replace("/", "_") + "-canary")),
        "beside the workspace": attempt(lambda: create(os.path.join(folder, "canary"))),
        "in the workspace": attempt(lambda: create("canary")),
        "mkdir": attempt(lambda: os.mkdir(os.path.join(folder, "made"))),
        "symlink": attempt(lambda: os.symlink(key, os.path.join(folder, "link"))),
        "hardlink": attempt(lambda: os.link(key, "key-link")),
        "rename key": attempt(lambda: os.rename(key, key + ".moved")),
        "unlink key": attempt(lambda: os.unlink(key)),
    }


def chmod(path):
    os.chmod(path, 0o644)
    return "changed"


def signal(pid):
    os.kill(pid, 9)
    return "sent"
"""
)

DRIVER = r"""
import json, os, shutil, subprocess, sys, tempfile
from metarl.sandbox import isolation
from metarl.sandbox.parent import SandboxCall, SandboxLimits, run_calls_in_sandbox

# a host that refuses user namespaces: no bubblewrap, so the process level is all it can give
isolation.host_isolation = lambda runner, modules: isolation.HostIsolation(None, None, "bwrap failed (exit 1): No permissions to create a new namespace")
module = sys.stdin.read()
base = tempfile.mkdtemp(prefix="metarl-process-wall-")
os.chmod(base, 0o755)
key = os.path.join(base, "eval_partition.key")
with open(key, "w") as handle:
    handle.write("metarl-eval-partition-key-0600\n")
os.chmod(key, 0o600)
hidden = os.path.join(base, "hidden_eval.jsonl")
with open(hidden, "w") as handle:
    handle.write('{"prompt": "hidden-eval-prompt-7781", "answer": "1"}\n')
other = os.path.join(base, "other", "files", "dataset.jsonl")
os.makedirs(os.path.dirname(other))
with open(other, "w") as handle:
    handle.write("other-workspace-marker\n")
files = os.path.join(base, "attempt", "files")
os.makedirs(files)
os.chmod(os.path.join(base, "attempt"), 0o755)
with open(os.path.join(files, "environment.py"), "w") as handle:
    handle.write(module)
with open(os.path.join(files, "dataset.jsonl"), "w") as handle:
    handle.write("workspace-data\n")
os.chmod(files, 0o755)
same_uid = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
victim = subprocess.Popen(["sleep", "120"], start_new_session=True, **same_uid)
secret_paths = ["/etc/passwd", key, hidden, other, "/proc/1/environ", "/proc/%d/environ" % os.getpid()]


def run(calls, hook):
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=20, min_isolation="process", audit_hook=hook)
    result = run_calls_in_sandbox(files, "environment.py", [SandboxCall(function=name, args=args) for name, args in calls], limits)
    return {"level": result.level, "isolation": result.isolation, "error": result.error and [result.error.kind, result.error.event, result.error.message],
            "values": [call.value if call.ok else ["error", call.error.message] for call in result.calls], "text": result.model_dump_json()}


report = {
    "uid": os.getuid(),
    "hook on": run([("reads", [secret_paths])], True),
    "reads": run([("reads", [secret_paths])], False),
    "writes": run([("writes", [base, key])], False),
    "chmod": run([("chmod", [key])], False),
    "signal victim": run([("signal", [victim.pid])], False),
    "signal worker": run([("signal", [os.getpid()])], False),
    "signal all": run([("signal", [-1])], False),
}
report["victim alive"] = victim.poll() is None
report["key mode"] = oct(os.stat(key).st_mode & 0o777)
report["key text"] = open(key).read()
report["left beside the workspace"] = sorted(set(os.listdir(base)) - {"eval_partition.key", "hidden_eval.jsonl", "other", "attempt"})
report["left in the workspace"] = sorted(os.listdir(files))
report["tmp canary"] = os.path.exists("/tmp/" + base.replace("/", "_") + "-canary")
victim.kill()
shutil.rmtree(base)
print(json.dumps(report))
"""

SECRETS = ("metarl-eval-partition-key-0600", "hidden-eval-prompt-7781", "other-workspace-marker", "root:x:0:0", "METARL_")


def drive(user: str) -> dict:
    """Run the driver as ``user`` (root: this process's own uid; nobody: an unprivileged worker) and return its report."""
    env = {**os.environ, "METARL_TEST_SECRET": "metarl-test-secret-4f9c2a71"}
    command = [sys.executable, "-c", DRIVER]
    if user == "nobody":
        found = nobody_python()
        if isinstance(found, str):
            pytest.skip(f"no unprivileged worker here: {found}")
        prefix, extra = found
        command, env = [*prefix, "-c", DRIVER], {**env, **extra}
    process = subprocess.run(command, input=MODULE, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    return json.loads(process.stdout.strip().splitlines()[-1])


USERS = ["root", "nobody"] if os.geteuid() == 0 else ["self"]


@pytest.mark.skipif(landlock.availability()[1] is not None, reason=f"no Landlock on this kernel: {landlock.availability()[1]}")
@pytest.mark.parametrize("user", USERS)
def test_the_hook_rewrite_module_is_walled_in_at_the_process_level(user: str) -> None:
    report = drive(user)
    assert report["uid"] == (0 if user == "root" else report["uid"])
    for name in ("hook on", "reads", "writes", "chmod", "signal victim", "signal worker", "signal all"):
        run = report[name]
        for secret in SECRETS:
            assert secret not in run["text"], f"{name}: {secret} leaked"
        assert run["level"] == "process" and {"landlock", "seccomp", "no-new-privs", "rlimits"} <= set(run["isolation"]), (name, run["isolation"])
        if report["uid"] == 0:
            assert "uid-65534" in run["isolation"], name  # a root worker's sandbox is nobody

    # with the hook on: the rewrite finds no hook in the runner's frame, and the hook refuses the first read
    hook_on = report["hook on"]
    assert hook_on["error"][:2] == ["forbidden", "open"], hook_on

    # with the hook off (what a successful rewrite gives): the workspace reads, nothing else does
    reads = report["reads"]
    assert reads["error"] is None, reads
    seen = reads["values"][0]
    assert seen.pop("hook_off") is False and seen.pop("workspace") == "workspace-data\n"
    assert all(isinstance(value, str) and value.startswith("refused: Permission denied") for value in seen.values()), seen

    # nothing written outside the workspace, nor in it; the key file unchanged
    writes = report["writes"]
    assert writes["error"] is None, writes
    outcomes = writes["values"][0]
    assert all(value.startswith("refused: ") for value in outcomes.values()), outcomes
    assert report["chmod"]["error"][:2] == ["forbidden", "seccomp"], report["chmod"]
    assert report["key mode"] == "0o600" and report["key text"] == "metarl-eval-partition-key-0600\n"
    assert report["left beside the workspace"] == [] and report["left in the workspace"] == ["dataset.jsonl", "environment.py"]
    assert report["tmp canary"] is False

    # no signal to a process of the sandbox's uid, to the worker, or to every process it may signal
    for name in ("signal victim", "signal worker", "signal all"):
        assert report[name]["error"][:2] == ["forbidden", "seccomp"], (name, report[name])
    assert report["victim alive"]
