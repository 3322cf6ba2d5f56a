"""The local inner job trains on the agent's own environment module, scored in the sandbox.

- the rewards GRPO uses are the module's outputs (not the built-in grader's), and training
  follows them: a module that pays for long completions lengthens them, one that pays for short
  ones shortens them;
- the local agent's rendered module gives bit-identical training to the built-in graders;
- hostile modules (raise, NaN, non-numbers, hang, busy loop, crash mid-training, memory, reading
  the environment for secrets) end the job quickly with a clear recorded error and leak nothing;
- the real wiring: LocalTrain.launch copies the workspace and the detached trainer process uses it;
- the persistent sandbox session holds the probe's hostile corpus exactly like a one-shot run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest

from metarl.artifact_store import ArtifactStore
from metarl.backends.local import job as local_job
from metarl.backends.local.agent import environment_source
from metarl.backends.local.config import LocalTrainBackend
from metarl.backends.local.train import LocalTrain, compile_local_job, copy_workspace, dataset_text
from metarl.interfaces import EpisodeContext
from metarl.learning.families import generate_dataset
from metarl.learning.grpo import LocalTrainConfig, RewardComponentWeights, read_metrics, rollout_reward, train
from metarl.learning.models import ensure_base_model
from metarl.learning.registry import get_family
from metarl.learning.reward_checks import RewardFunctionError, Rollout
from metarl.learning.runtime import threads_per_job
from metarl.probe.reward_source import EnvironmentRewardSpec, SandboxRewardSource
from metarl.sandbox.parent import SandboxCall, SandboxLimits, SandboxSession
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec
from tests.conftest import REPO
from tests.unit.test_sandbox import abstract_listener, fill, victim  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

TINY_SCALE = 0.01
SECRET = "metarl-reward-secret-7d1e55"
HOSTILE = REPO / "tests" / "fixtures" / "hostile"
TASK = TaskSpec.model_validate(tomllib.loads((REPO / "tasks_specs" / "addition.toml").read_text()))
JOB = JobSpec.model_validate(
    {
        "model": {"name": "local-s"},
        "training": {"max_steps": 4, "batch_size": 16, "group_size": 4, "learning_rate": 1e-3},
        "rollout": {"max_tokens": 6},
        "dataset": {"size": 32},
    }
)
ROLLOUTS_PER_STEP = 16

INVERTED = '''
def reward(prompt, completion, answer):
    """Pays for being wrong: 1 minus the built-in partial credit."""
    text = completion.strip()
    if text == answer:
        return 0.0
    longest = max(len(answer), len(text))
    same = sum(1 for left, right in zip(answer[::-1], text[::-1]) if left == right)
    return 1.0 - 0.5 * same / longest
'''
LONG = "def reward(prompt, completion, answer):\n    return len(completion) / 6\n"
SHORT = "def reward(prompt, completion, answer):\n    return -len(completion) / 6\n"


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache holding a weakly pretrained local-s (scale 0.01)."""
    root = tmp_path_factory.getbasetemp() / "metarl-models"
    ensure_base_model("local-s", root, scale=TINY_SCALE)
    return root


def workspace(tmp_path: Path, module_source: str, name: str = "ws") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "environment.py").write_text(module_source, encoding="utf-8")
    return folder


class Recorder:
    """Wraps a reward function and keeps every batch and the values it returned."""

    def __init__(self, inner: SandboxRewardSource) -> None:
        self.inner = inner
        self.batches: list[list[Rollout]] = []
        self.values: list[list[float]] = []

    def __call__(self, batch: list[Rollout]) -> list[float]:
        values = self.inner(batch)
        self.batches.append(list(batch))
        self.values.append(list(values))
        return values


def config(**overrides: object) -> LocalTrainConfig:
    settings: dict[str, object] = {"max_steps": 4, "batch_size": 4, "group_size": 4, "max_tokens": 6, "learning_rate": 1e-3, "warmup_steps": 0}
    settings.update(overrides)
    return LocalTrainConfig(**settings)


def f32(value: float) -> float:
    import torch

    return torch.tensor(value, dtype=torch.float32).item()


def test_metrics_follow_the_module_rewards_not_the_builtin_grader(model_root: Path, tmp_path: Path) -> None:
    family = get_family("addition")
    dataset = generate_dataset(family, 32, seed=0, difficulty=0.5)
    base = ensure_base_model("local-s", model_root, scale=TINY_SCALE)
    with SandboxRewardSource(workspace(tmp_path, INVERTED), EnvironmentRewardSpec()) as source:
        recorder = Recorder(source)
        outcome = train(config(), dataset, family, base, tmp_path / "out", reward_fn=recorder)
    rows = read_metrics(outcome.metrics_path)
    assert len(rows) == len(recorder.values) == 4 and source.stats.steps == 4 and source.stats.rollouts == 4 * ROLLOUTS_PER_STEP
    builtin = LocalTrainConfig(max_tokens=6)
    differs = 0
    for row, batch, values in zip(rows, recorder.batches, recorder.values):
        module_mean = sum(f32(v) for v in values) / len(values)
        assert row.reward_mean == pytest.approx(module_mean, abs=1e-6)
        examples = {example.prompt: example for example in dataset}
        graded = [rollout_reward(family, examples[prompt], completion, len(completion) + 1, builtin) for prompt, completion, _ in batch]
        assert row.exact_rate == pytest.approx(sum(exact for _, exact in graded) / len(graded))
        # the module is the inverse of the grader's partial credit: every rollout's reward shows it
        for (grade, _), value in zip(graded, values):
            assert value == pytest.approx(1.0 - grade, abs=1e-9)
        differs += abs(row.reward_mean - sum(grade for grade, _ in graded) / len(graded)) > 1e-3
    assert differs == len(rows)


def mean_tokens(rows: list) -> float:  # type: ignore[type-arg]
    return sum(row.completion_tokens for row in rows) / len(rows)


@pytest.mark.slow
def test_training_moves_in_the_direction_the_module_pays_for(model_root: Path, tmp_path: Path) -> None:
    family = get_family("sorting")
    dataset = generate_dataset(family, 64, seed=1, difficulty=0.5)
    base = ensure_base_model("local-s", model_root, scale=TINY_SCALE)
    fast = config(max_steps=10, learning_rate=1e-2, batch_size=8, group_size=4, temperature=1.2)
    tokens = {}
    for name, source_text in (("long", LONG), ("short", SHORT)):
        with SandboxRewardSource(workspace(tmp_path, source_text, name), EnvironmentRewardSpec()) as source:
            outcome = train(fast, dataset, family, base, tmp_path / f"out-{name}", reward_fn=source)
        rows = read_metrics(outcome.metrics_path)
        tokens[name] = (rows[0].completion_tokens, mean_tokens(rows[-3:]))
    (long_start, long_end), (short_start, short_end) = tokens["long"], tokens["short"]
    assert long_start == short_start  # same seed and model: the same first rollouts
    # measured (seeds 0, 1, 2): long 5.2-5.3 -> 6.0 (the cap), short 4.2-4.9 -> 1.0-1.05 tokens
    assert long_end > long_start + 0.3 and short_end < short_start - 1.5, tokens
    assert long_end - short_end > 2.0, tokens


def test_local_agent_module_trains_exactly_like_the_builtin_graders(model_root: Path, tmp_path: Path) -> None:
    family = get_family("caesar")
    dataset = generate_dataset(family, 32, seed=2, difficulty=0.3)
    base = ensure_base_model("local-s", model_root, scale=TINY_SCALE)
    # no length penalty here: the module sees the decoded text, which drops a sampled <unk> token
    # that the built-in penalty counts (rare in a pretrained model, frequent in this tiny one)
    weights = {"correctness": 1.0, "exact": 0.5, "format": -1.0}
    builtin = config(rewards=RewardComponentWeights(correctness=1.0, exact=0.5, format=0.0))
    reference = train(builtin, dataset, family, base, tmp_path / "builtin")
    module = workspace(tmp_path, environment_source(weights, family.name, builtin.max_tokens))
    with SandboxRewardSource(module, EnvironmentRewardSpec()) as source:
        agent = train(builtin, dataset, family, base, tmp_path / "agent", reward_fn=source)
    strip = lambda rows: [row.model_dump(exclude={"wall_s"}) for row in rows]  # noqa: E731
    assert strip(read_metrics(agent.metrics_path)) == strip(read_metrics(reference.metrics_path))


def job_dir_for(tmp_path: Path, module_source: str, model_root: Path, **spec: object) -> Path:
    """A local job folder as LocalTrain.launch writes it, trained on ``module_source``."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    compiled = compile_local_job(JOB, TASK, TINY_SCALE, environment_reward=True)
    compiled["reward"] = {**compiled["reward"], **spec}
    compiled["model_cache_dir"] = str(model_root)
    (job_dir / "job.json").write_text(json.dumps(compiled), encoding="utf-8")
    (job_dir / "dataset.jsonl").write_text(dataset_text("addition", 32, 0.5, seed=0), encoding="utf-8")
    copy_workspace(workspace(tmp_path, module_source), job_dir / "workspace")
    return job_dir


HOSTILE_MODULES = {
    "raises": ("def reward(prompt, completion, answer):\n    raise KeyError(answer)\n", "KeyError"),
    "nan": ("def reward(prompt, completion, answer):\n    return float('nan')\n", "NaN"),
    "infinity": ("def reward(prompt, completion, answer):\n    return 1e308 * 10\n", "NaN or infinity"),
    "not_a_number": ("def reward(prompt, completion, answer):\n    return 'high'\n", "returned str"),
    "bool": ("def reward(prompt, completion, answer):\n    return completion == answer\n", "returned bool"),
    "huge": ("def reward(prompt, completion, answer):\n    return 1e9\n", "beyond the allowed magnitude"),
    "hangs": ("import time\n\ndef reward(prompt, completion, answer):\n    time.sleep(3600)\n", "(timeout)"),
    "busy_loop": ("def reward(prompt, completion, answer):\n    while True:\n        pass\n", "(timeout)"),
    "memory": ("def reward(prompt, completion, answer):\n    return len(' ' * 10**10)\n", "(memory)"),
    "forbidden": ("import socket\n\ndef reward(prompt, completion, answer):\n    return 1.0\n", "(forbidden)"),
    "import_error": ("x = 1 / 0\n\ndef reward(prompt, completion, answer):\n    return 1.0\n", "while importing it (crash)"),
    "no_reward": ("def score(prompt, completion, answer):\n    return 1.0\n", "defines no function reward"),
    "crash_mid_training": (
        "import os\nCALLS = [0]\n\ndef reward(prompt, completion, answer):\n"
        f"    CALLS[0] += 1\n    if CALLS[0] > 2 * {ROLLOUTS_PER_STEP}:\n        os._exit(3)\n    return float(len(completion) % 3)\n",
        "exited with status 3",
    ),
    "reads_environment": (
        "import os\n\ndef reward(prompt, completion, answer):\n    found = dict(os.environ)\n    print('ENV', found)\n"
        "    raise RuntimeError('environment: ' + repr(found))\n",
        "RuntimeError: environment: {",
    ),
    # issue 40: a forged set-up failure raised SandboxUnavailable (status "sandbox_unavailable", not the module's fault), and a forged
    # answer of 10**400 made checked_rewards raise OverflowError, so main() died without a status
    "forged_setup_failure": ((HOSTILE / "forge_bootstrap.py").read_text(encoding="utf-8"), "forged or malformed result frame: a sandbox set-up failure"),
    "forged_huge_reward": ((HOSTILE / "forge_huge_reward.py").read_text(encoding="utf-8"), "forged or malformed result frame: the value of call 0"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MODULES))
def test_hostile_module_ends_the_job_with_a_clear_error(
    case: str, model_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("METARL_FAKE_API_KEY", SECRET)
    monkeypatch.setenv("METARL_DB_PASSWORD", SECRET)
    source, needle = HOSTILE_MODULES[case]
    job_dir = job_dir_for(tmp_path, source, model_root, step_wall_seconds=2.0, memory_bytes=256 * 1024**2)
    started = time.monotonic()
    assert local_job.main(job_dir) == 1
    elapsed = time.monotonic() - started
    status = json.loads((job_dir / "status.json").read_text())
    assert status["status"] == "failed" and status["error_kind"] == "reward_function", status
    assert status["error"].startswith("reward module: ") and needle in status["error"], status["error"]
    assert elapsed < 45, elapsed
    if case == "crash_mid_training":
        assert status["steps"] == 2 and "step 2:" in status["error"]
        assert [row.step for row in read_metrics(job_dir / "metrics.jsonl")] == [0, 1]
    elif case not in ("import_error", "no_reward", "forbidden"):
        assert status["steps"] == 0 and "step 0:" in status["error"]
    if case in ("hangs", "busy_loop"):
        assert status["reward"]["max_step_seconds"] < 10
    if case == "reads_environment":
        assert "PATH" in status["error"] and "METARL_FAKE_API_KEY" not in status["error"]
    assert not (job_dir / "checkpoint").exists()
    captured = capsys.readouterr()
    for path in job_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".txt"):
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in captured.out + captured.err


@pytest.mark.slow
def test_launched_job_trains_on_the_workspace_module(model_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real wiring: launch copies the workspace, the detached trainer scores with the module."""
    monkeypatch.setenv("METARL_UNFILTERED_SECRET", SECRET)  # not caught by the *_KEY filter: the sandbox must still hide it
    files = workspace(tmp_path, LONG)
    (files / "dataset.jsonl").write_text(dataset_text("addition", 32, 0.5, seed=0), encoding="utf-8")
    hostile = workspace(tmp_path, HOSTILE_MODULES["reads_environment"][0], "hostile-ws")
    shutil.copy(files / "dataset.jsonl", hostile / "dataset.jsonl")
    backend = LocalTrain(
        LocalTrainBackend(type="local", max_concurrent_jobs=2, poll_interval_s=0.2, model_scale=TINY_SCALE, model_cache_dir=str(model_root)),
        ArtifactStore(str(tmp_path)),
    )
    results = {}
    for name, folder in (("good", files), ("hostile", hostile)):
        ctx = EpisodeContext(
            run_id="reward-itest", episode_id=1, task=TASK, policy_version=0, probe_attempt=1, seed=3, artifacts_root=str(tmp_path), workspace_uri=str(folder)
        )
        launched = backend.launch(ctx, JOB, f"job-{name}")
        deadline = time.monotonic() + 240
        finished = False
        try:
            while True:
                polled = backend.poll(ctx, JOB, launched.external_id, launched.state)
                finished = polled.status != "running"
                if finished or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            if not finished:  # never leave a trainer running
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(launched.state["pid"], signal.SIGKILL)
        results[name] = (polled, Path(launched.state["job_dir"]))
    good, good_dir = results["good"]
    assert good.status == "succeeded", good.error
    assert (good_dir / "workspace" / "environment.py").read_text() == LONG
    status = json.loads((good_dir / "status.json").read_text())
    assert status["reward"]["mode"] == "persistent" and status["reward"]["steps"] == status["steps"] == 4
    assert status["torch_threads"] == threads_per_job(2)  # two trainers at once split the cores
    rows = read_metrics(good.metrics_uri)
    assert all(row.reward_mean == pytest.approx(row.completion_tokens / 6 - 1 / 6, abs=0.35) for row in rows)  # len(text) ~ tokens - EOS
    bad, bad_dir = results["hostile"]
    assert bad.status == "failed" and bad.error.startswith("reward module: step 0:") and "RuntimeError: environment: {" in bad.error
    for path in bad_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log"):
            assert SECRET not in path.read_text(errors="replace"), path


HOSTILE_CASES = sorted(path.name for path in HOSTILE.glob("*.py"))
BASE_LIMITS = {"cpu_seconds": 1, "wall_seconds": 8.0, "memory_bytes": 256 * 1024**2, "max_stderr_bytes": 4 * 1024**2}


def header(source: str, key: str) -> str | None:
    match = re.search(rf"^# {key}: (.+)$", source, re.MULTILINE)
    return match.group(1).strip() if match else None


@pytest.mark.parametrize("case", HOSTILE_CASES)
def test_persistent_session_holds_the_hostile_corpus(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, victim: subprocess.Popen[bytes], abstract_listener: tuple[str, object]
) -> None:
    """Every hostile module of the probe's corpus ends the same way in a persistent session."""
    monkeypatch.setenv("METARL_TEST_SECRET", SECRET)
    tag = abstract_listener[0]
    source = fill((HOSTILE / case).read_text(encoding="utf-8"), tmp_path, tmp_path / "hidden.jsonl", victim, tag)
    expected = set((header(source, "expect") or "").split("|"))
    args = json.loads(header(source, "args") or '["add 1+2=", "3", "3"]')
    limits = SandboxLimits(**{**BASE_LIMITS, **json.loads(header(source, "limits") or "{}")})
    files = tmp_path / "files"
    files.mkdir()
    (files / case).write_text(source, encoding="utf-8")
    with SandboxSession(files, case, limits) as session:
        result = session.start()
        if result.ok:
            result = session.call([SandboxCall(function="reward", args=args)])
        if result.ok and result.calls and not result.calls[0].ok:
            outcome = result.calls[0].error.kind
        else:
            outcome = "ok" if result.ok else result.error.kind
        assert outcome in expected, f"{case}: {outcome}: {result.error} {result.stderr_tail[-300:]}"
        assert SECRET not in result.model_dump_json()
        if not result.ok:
            assert not session.alive and session.call([SandboxCall(function="reward", args=args)]) == result
    assert sorted(path.name for path in files.iterdir()) == [case]
    assert victim.poll() is None and not list(Path("/tmp").glob(f"{tag}*"))


def test_training_contains_a_module_that_behaves_only_in_the_probes_folder(tmp_path: Path, abstract_listener: tuple[str, object]) -> None:
    """Issue 31: mknod_in_training.py behaved in the probe's files/ folder and filled /tmp from a
    training job's workspace copy. The trainer's reward session now refuses it, and /tmp stays clean."""
    tag = abstract_listener[0]
    job_workspace = tmp_path / "jobs" / "job-1" / "workspace"  # LocalTrain's layout: JOB_DIR/workspace/
    job_workspace.mkdir(parents=True)
    (job_workspace / "environment.py").write_text((HOSTILE / "mknod_in_training.py").read_text(encoding="utf-8").replace("{tag}", tag))
    spec = EnvironmentRewardSpec(step_wall_seconds=5.0, startup_wall_seconds=8.0, cpu_seconds=5)
    with pytest.raises(RewardFunctionError) as failed, SandboxRewardSource(job_workspace, spec) as reward_fn:
        reward_fn([("add 1+2=", "3", "3")])
    assert "(forbidden)" in failed.value.message and "system call" in failed.value.message
    assert not list(Path("/tmp").glob(f"{tag}*"))


def test_persistent_session_answers_many_batches_and_keeps_state(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "env.py").write_text("CALLS = [0]\n\ndef reward(prompt, completion, answer):\n    CALLS[0] += 1\n    return CALLS[0]\n")
    with SandboxSession(files, "env.py", SandboxLimits(wall_seconds=5.0)) as session:
        assert session.start().ok and "reward" in session.exports.functions
        seen = []
        for _ in range(5):
            result = session.call([SandboxCall(function="reward", args=["p", "c", "a"])] * 3, wall_seconds=2.0)
            assert result.ok and "audit-hook" in result.isolation
            seen += [outcome.value for outcome in result.calls]
        assert seen == list(range(1, 16))
        big = session.call([SandboxCall(function="reward", args=["p" * 100, "c", "a"])] * 2000)
        assert big.ok and big.calls[-1].value == 2015
    assert not session.alive
    assert math.isfinite(big.wall_seconds)


PARENT_SCRIPT = """
import sys
from metarl.sandbox.parent import SandboxCall, SandboxLimits, SandboxSession
session = SandboxSession(sys.argv[1], "env.py", SandboxLimits(cpu_seconds=600, wall_seconds=60.0))
assert session.start().ok
print(session.pid, flush=True)
session.call([SandboxCall(function="reward", args=["p", "c", "a"])], wall_seconds=600.0)
"""


def test_reward_process_dies_with_a_killed_trainer(tmp_path: Path) -> None:
    """A trainer killed with SIGKILL mid-step leaves no busy reward process behind."""
    files = tmp_path / "files"
    files.mkdir()
    (files / "env.py").write_text("def reward(prompt, completion, answer):\n    while True:\n        pass\n")
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT, str(files)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    child_pid = None
    try:
        child_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(child_pid)
        time.sleep(0.5)  # the child is now busy in the call
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the reward process outlived its trainer")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child_pid is not None and psutil.pid_exists(child_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
