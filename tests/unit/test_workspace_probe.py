"""Workspace-level probe: the environment module in the sandbox, the dataset, contamination."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metarl.learning.families import generate_dataset
from metarl.learning.registry import get_family
from metarl.probe.workspace import (
    dataset_problems,
    probe_workspace,
    sample_items,
    wrong_answer,
)
from metarl.sandbox.parent import SandboxLimits
from metarl.workspace import Workspace
from schemas.base import MAX_TOML_DEPTH
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=8.0, memory_bytes=256 * 1024**2)
GOOD_ENV = """
import re


def reward(prompt, completion, answer):
    text = completion.strip()
    if text == answer:
        return 1.0
    return 0.2 if re.fullmatch(r"\\d+", text) else 0.0


def is_number(prompt, completion, answer):
    return float(completion.strip().isdigit())


COMPONENTS = {"correctness": reward, "format": is_number}
"""
JOB = """
[model]
name = "Qwen/Qwen3-0.6B"

[training]
max_steps = 10
batch_size = 16
group_size = 8

[reward.components]
correctness = 1.0
format = 0.1

[dataset]
size = 64
difficulty = 0.3
"""


def make_task() -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "id": "addition",
            "family": "addition",
            "public": {"title": "Add", "description": "Add two numbers."},
            "data": {"min_dataset_size": 32, "max_dataset_size": 200},
        }
    )


def dataset_text(n: int = 64, seed: int = 1) -> str:
    items = generate_dataset(get_family("addition"), n, seed, 0.3)
    return "".join(json.dumps({"prompt": item.prompt, "answer": item.answer}) + "\n" for item in items)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    ws = Workspace(tmp_path / "attempt", make_task())
    assert ws.write_file("job.toml", JOB).ok
    assert ws.write_file("environment.py", GOOD_ENV).ok
    assert ws.write_file("dataset.jsonl", dataset_text()).ok
    return ws


def probe(ws: Workspace):
    return probe_workspace(ws.files_dir, ws.task, limits=LIMITS)


def fields(verdict) -> list[str]:
    return [problem.field for problem in verdict.errors]


def test_good_workspace_passes(ws: Workspace) -> None:
    verdict = probe(ws)
    assert verdict.passed, verdict.errors
    assert verdict.job is not None and verdict.job.dataset.size == 64


def test_sample_items_are_training_items_and_wrong_answers_differ() -> None:
    family = get_family("addition")
    items = sample_items(family, 16, 0.5)
    assert not any(family.is_hidden_eval_item(item.prompt) for item in items)
    for index, item in enumerate(items):
        assert wrong_answer(item, items[index + 1 :] + items[:index]) != item.answer


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("def reward(prompt, completion, answer):\n    return 1.0\n", "does not score higher"),
        ("def reward(prompt, completion, answer):\n    return float(completion == '')\n", "does not score higher"),
        ("def score(prompt, completion, answer):\n    return 1.0\n", "defines no function reward"),
        ("def reward(prompt, completion, answer):\n    return float('nan')\n", "NaN"),
        ("def reward(prompt, completion, answer):\n    return 'yes'\n", "not a number"),
        ("def reward(prompt, completion, answer):\n    return True\n", "not a number"),
        ("def reward(prompt, completion, answer):\n    return 1 / len(completion)\n", "ZeroDivisionError"),
        ("def reward(prompt, completion)\n    return 1.0\n", "SyntaxError"),
        ("import numpy\n", "import of numpy is not allowed"),
        ("open('/etc/passwd').read()\ndef reward(p, c, a):\n    return 1.0\n", "forbidden"),
        ("import os\nos.system('id')\n", "os.system"),
        ("while True:\n    pass\n", "timeout"),
        ("x = bytearray(10**12)\n", "memory"),
    ],
)
def test_environment_problems(ws: Workspace, source: str, needle: str) -> None:
    assert ws.write_file("environment.py", source).ok
    verdict = probe(ws)
    assert not verdict.passed
    env = [problem for problem in verdict.errors if problem.field == "environment.module"]
    assert env, verdict.errors
    assert needle in env[0].message, env[0]
    assert env[0].fix


def test_missing_environment_module(ws: Workspace) -> None:
    (ws.files_dir / "environment.py").unlink()
    problem = next(problem for problem in probe(ws).errors if problem.field == "environment.module")
    assert "no file" in problem.message and "write_file" in problem.fix


def test_components_checked(ws: Workspace) -> None:
    assert ws.write_file("job.toml", JOB.replace("format = 0.1", 'format = 0.1\n"odd name" = 0.2')).ok
    verdict = probe(ws)
    assert fields(verdict) == ['reward.components."odd name"']
    broken = GOOD_ENV.replace("return float(completion.strip().isdigit())", 'raise KeyError("boom")')
    assert ws.write_file("environment.py", broken).ok
    assert ws.write_file("job.toml", JOB).ok
    problem = probe(ws).errors[0]
    assert problem.field == "reward.components.format" and "KeyError" in problem.message
    assert ws.write_file("environment.py", GOOD_ENV + "COMPONENTS = [reward]\n").ok
    assert "COMPONENTS must be a dict" in probe(ws).errors[0].message
    # without COMPONENTS, component names are the backend's business
    assert ws.write_file("environment.py", GOOD_ENV.replace("COMPONENTS =", "_UNUSED =")).ok
    assert probe(ws).passed


def test_dataset_missing_and_format(ws: Workspace) -> None:
    (ws.files_dir / "dataset.jsonl").unlink()
    problem = next(problem for problem in probe(ws).errors if problem.field == "dataset.path")
    assert "no file" in problem.message
    lines = dataset_text().splitlines()
    lines[2] = '{"prompt": "add 1+2="}'
    lines[4] = '{"prompt": "add 1+2=", "answer": "3", "extra": 1}'
    lines[6] = "not json"
    lines[8] = '{"prompt": "' + "x" * 300 + '", "answer": "3"}'
    lines[10] = '{"prompt": 5, "answer": "3"}'
    lines[12] = "[" * 10_000 + "]" * 10_000
    lines[14] = '"just a string"'
    assert ws.write_file("dataset.jsonl", "\n".join(lines) + "\n\n   \n").ok
    problems = [problem for problem in probe(ws).errors if problem.field == "dataset.path"]
    messages = [problem.message for problem in problems]
    assert messages[0].startswith("dataset.jsonl line 3: missing ['answer']")
    assert "line 5: unexpected keys ['extra']" in messages[1]
    assert "line 7: is not valid JSON" in messages[2]
    assert "line 9: prompt: String should have at most 200 characters" in messages[3]
    assert "line 11: prompt and answer must both be strings" in messages[4]
    assert messages[5] == "2 more malformed lines not shown"


def test_dataset_crlf_and_blank_lines_are_fine(ws: Workspace) -> None:
    assert ws.write_file("dataset.jsonl", "\n" + dataset_text().replace("\n", "\r\n") + "\n\n").ok
    assert probe(ws).passed


def test_dataset_size_mismatch_and_bounds(ws: Workspace) -> None:
    assert ws.write_file("dataset.jsonl", dataset_text(40)).ok
    problem = next(problem for problem in probe(ws).errors if problem.field == "dataset.size")
    assert problem.message == "job.toml says 64 items but dataset.jsonl has 40"
    assert "size = 40" in problem.fix
    assert ws.write_file("dataset.jsonl", dataset_text(10)).ok
    messages = [problem.message for problem in probe(ws).errors]
    assert "dataset.jsonl has 10 items, outside [32, 200]" in messages
    assert ws.write_file("job.toml", JOB.replace("size = 64", "size = 500")).ok
    assert ws.write_file("dataset.jsonl", dataset_text(500)).ok
    assert "dataset.size" in fields(probe(ws))  # the job-level bound check (probe_job_text)
    assert ws.write_file("dataset.jsonl", "\n\n").ok
    assert any("has no items" in problem.message for problem in probe(ws).errors)


def test_dataset_not_utf8_or_a_link(ws: Workspace, tmp_path: Path) -> None:
    (ws.files_dir / "dataset.jsonl").write_bytes(dataset_text().encode() + b"\xff\n")
    problem = next(problem for problem in probe(ws).errors if problem.field == "dataset.path")
    assert "not valid UTF-8" in problem.message
    (ws.files_dir / "dataset.jsonl").unlink()
    outside = tmp_path / "outside.jsonl"
    outside.write_text(dataset_text(), encoding="utf-8")
    (ws.files_dir / "dataset.jsonl").symlink_to(outside)
    problem = next(problem for problem in probe(ws).errors if problem.field == "dataset.path")
    assert "symbolic link" in problem.message


def test_the_longest_prompt_and_max_tokens_must_fit_the_compiled_sequence(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    lines = dataset_text(63).splitlines()

    def problems(prompt: str, max_tokens: int) -> list:
        (files / "dataset.jsonl").write_text("\n".join([*lines, json.dumps({"prompt": prompt, "answer": "1"})]) + "\n", encoding="utf-8")
        job = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "dataset": {"size": 64}, "rollout": {"max_tokens": max_tokens}})
        return [problem for problem in dataset_problems(files, job, make_task(), get_family("addition")) if "longest prompt" in problem.message]

    # a prompt at the item limit (200 characters) in ASCII: at most 232 tokens, within every compiled sequence
    assert problems("add " + "1" * 196, 16) == [] and problems("add " + "1" * 196, 300) == []
    # 190 characters of three UTF-8 bytes: up to 602 tokens, beyond seq_len 512 with max_tokens 16; no max_tokens fits it
    (wide,) = problems("加" * 190, 16)
    assert wide.field == "dataset.path" and "line 64" in wide.message and "570 UTF-8 bytes" in wide.message and "seq_len 512" in wide.message
    assert wide.fix == "shorten the prompts to at most 464 UTF-8 bytes (an ASCII character is one byte, others two to four)"
    # 270 bytes (302 tokens) + 256 completion tokens > 512: a smaller max_tokens fits it
    (narrow,) = problems("加" * 90, 256)
    assert "rollout.max_tokens = 256" in narrow.message and narrow.fix.endswith("or lower rollout.max_tokens to 210 or less")
    assert problems("加" * 90, 210) == []


def test_contamination_reports_a_count_only(ws: Workspace) -> None:
    family = get_family("addition")
    hidden = family.hidden_eval(5)
    lines = dataset_text(59).splitlines()
    # reworded copies are the same items (matched by content)
    reworded = [item.prompt.replace("add ", "What is ").replace("=", " = ?") for item in hidden[:2]]
    lines += [json.dumps({"prompt": item.prompt, "answer": item.answer}) for item in hidden[2:]]
    lines += [json.dumps({"prompt": prompt, "answer": item.answer}) for prompt, item in zip(reworded, hidden)]
    assert ws.write_file("dataset.jsonl", "\n".join(lines) + "\n").ok
    verdict = probe(ws)
    problems = [problem for problem in verdict.errors if "hidden evaluation" in problem.message]
    assert len(problems) == 1
    assert problems[0].message == "5 of 64 items belong to the hidden evaluation (which ones is not disclosed)"
    text = verdict.model_dump_json()
    for prompt in [item.prompt for item in hidden] + reworded:
        assert prompt not in text
    for number in range(60, 65):
        assert f"line {number}" not in text


def test_job_toml_problems(ws: Workspace) -> None:
    (ws.files_dir / "job.toml").unlink()
    verdict = probe(ws)
    assert fields(verdict) == ["job.toml"] and "write job.toml" in verdict.errors[0].fix
    deep = "x = " + "[" * (MAX_TOML_DEPTH + 5) + "]" * (MAX_TOML_DEPTH + 5) + "\n"
    assert ws.write_file("job.toml", deep).ok
    assert fields(probe(ws)) == ["(structure)"]
    assert ws.write_file("job.toml", "x = " + "[" * 100_000 + "]" * 100_000 + "\n").ok
    assert fields(probe(ws)) == ["(structure)"]
    (ws.files_dir / "job.toml").write_bytes(b'[model]\nname = "\xff"\n')
    assert fields(probe(ws)) == ["(file)"]
    assert ws.write_file("job.toml", JOB.replace('name = "Qwen/Qwen3-0.6B"', 'name = "gpt-5"')).ok
    verdict = probe(ws)
    assert "model.name" in fields(verdict) and verdict.job is not None  # job-level and workspace problems together


def test_unknown_family_fails_closed(ws: Workspace) -> None:
    task = make_task().model_copy(update={"family": "nonesuch"})
    verdict = probe_workspace(ws.files_dir, task, limits=LIMITS)
    assert fields(verdict) == ["(task)"]


PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=150, suppress_health_check=list(HealthCheck))


@PROPERTY
@given(
    data=st.one_of(
        st.binary(max_size=300),
        st.lists(st.one_of(st.text(max_size=40), st.just('{"prompt": "add 1+1=", "answer": "2"}')), max_size=8).map("\n".join).map(str.encode),
    )
)
def test_property_dataset_problems_never_raise(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    files = tmp_path_factory.mktemp("ds")
    (files / "dataset.jsonl").write_bytes(data)
    job = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "dataset": {"size": 2}})
    problems = dataset_problems(files, job, make_task(), get_family("addition"))
    for problem in problems:
        assert problem.field in ("dataset.path", "dataset.size") and problem.message and problem.fix


# -- the trainer's acceptance rule and the trainer's way of running the module (issue 31) ------------


@pytest.mark.parametrize(
    ("correct_reward", "trainer_accepts", "signal"),
    [(1e300, False, False), (2e6, False, False), (-1e7, False, False), (1e6, True, True), (1e5, True, True), (-1e6 + 1, True, False)],
)
def test_probe_applies_the_trainers_reward_rule(ws: Workspace, correct_reward: float, trainer_accepts: bool, signal: bool) -> None:
    """One rule for both: the probe passes a module exactly when the trainer would take its rewards
    and, clamped as the trainer clamps them, they still rank the answer first (issue 40)."""
    from metarl.learning.reward_checks import RewardBounds, RewardFunctionError, checked_rewards

    low = min(correct_reward, 0.0) - 1.0
    source = f"def reward(prompt, completion, answer):\n    return {correct_reward!r} if completion.strip() == answer else {low!r}\n"
    assert ws.write_file("environment.py", source).ok
    (ws.files_dir / "job.toml").write_text(JOB.replace("[reward.components]\ncorrectness = 1.0\nformat = 0.1\n", ""), encoding="utf-8")
    verdict = probe(ws)
    try:
        rewards = checked_rewards([correct_reward, low], [("p", "3", "3"), ("p", "4", "3")], RewardBounds())
        trainer, trained_signal = True, rewards[0] > rewards[1]
    except RewardFunctionError:
        trainer, trained_signal = False, False
    assert (trainer, trained_signal) == (trainer_accepts, signal)
    assert verdict.passed is (trainer_accepts and signal), verdict.errors
    message = " ".join(problem.message for problem in verdict.errors)
    if not trainer_accepts:
        assert "beyond the allowed magnitude 1e+06" in message and "the trainer fails a job on it" in message
    elif not signal:
        assert "does not score higher" in message and "before clamping to [-100, 100]" in message, message
        assert "keep rewards within [-100, 100]" in verdict.errors[0].fix


def test_probe_reports_the_isolation_level(ws: Workspace) -> None:
    verdict = probe(ws)
    assert verdict.passed
    assert verdict.isolation == "full"
    assert {"bubblewrap", "seccomp", "pid-namespace", "mount-namespace", "network-namespace", "rlimits", "audit-hook"} <= set(verdict.isolation_layers)


HOSTILE = Path(__file__).resolve().parent.parent / "fixtures" / "hostile"


def test_a_module_that_behaves_only_in_the_probes_folder_is_caught_by_the_probe(ws: Workspace, tmp_path: Path) -> None:
    """The probe runs it where training runs it (/workspace), so what it does in training, it does here."""
    tag = f"metarl-probe-{tmp_path.name[-12:]}"
    source = (HOSTILE / "mknod_in_training.py").read_text(encoding="utf-8").replace("{tag}", tag)
    assert ws.write_file("environment.py", source).ok
    verdict = probe(ws)
    assert not verdict.passed
    assert any("seccomp" in problem.message or "system call" in problem.message for problem in verdict.errors), verdict.errors
    assert not list(Path("/tmp").glob(f"{tag}*"))


# -- the channel, the reward rule and the deadline (issue 40) ----------------------------------------


def module_problems(ws: Workspace, case: str) -> list[str]:
    """The probe's environment.module messages for a hostile corpus module (never an exception)."""
    assert ws.write_file("environment.py", (HOSTILE / case).read_text(encoding="utf-8")).ok
    (ws.files_dir / "job.toml").write_text(JOB.replace("[reward.components]\ncorrectness = 1.0\nformat = 0.1\n", ""), encoding="utf-8")
    verdict = probe(ws)
    assert not verdict.passed
    return [problem.message for problem in verdict.errors if problem.field == "environment.module"]


def test_a_forged_setup_failure_is_the_workspaces_fault(ws: Workspace) -> None:
    """It made probe_workspace raise SandboxUnavailable: `metarl probe` exit 2, the stage retrying it as transient."""
    [message] = module_problems(ws, "forge_bootstrap.py")
    assert "forged or malformed result frame" in message and "set-up failure" in message and "host out of memory" not in message


def test_a_forged_huge_reward_is_refused_not_a_crash(ws: Workspace) -> None:
    """A forged answer frame with rewards of 10**400 made the probe die with OverflowError."""
    [message] = module_problems(ws, "forge_huge_reward.py")
    assert "forged or malformed result frame" in message and "integer beyond ±2**53" in message


def test_rewards_beyond_the_clamp_carry_no_signal(ws: Workspace) -> None:
    """200 when right, 150 when wrong passed the probe, and the trainer saw [100, 100]: the probe judges the clamped rewards."""
    [message] = module_problems(ws, "clamped_no_signal.py")
    assert "does not score higher than wrong ones on 8 of 8" in message
    assert "reward 100 (200 before clamping to [-100, 100]) for the answer" in message and "100 (150 before clamping" in message


def test_one_deadline_for_the_whole_probe_run(ws: Workspace) -> None:
    """The import and the calls each had the whole wall-clock limit, so a probe held its slot about twice as long as advertised."""
    slow = "import time\ntime.sleep(1.2)\n\n\ndef reward(prompt, completion, answer):\n    time.sleep(0.05)\n    return float(completion.strip() == answer)\n"
    assert ws.write_file("environment.py", slow).ok
    (ws.files_dir / "job.toml").write_text(JOB.replace("[reward.components]\ncorrectness = 1.0\nformat = 0.1\n", ""), encoding="utf-8")
    limits = LIMITS.model_copy(update={"wall_seconds": 2.0})
    started = time.monotonic()
    verdict = probe_workspace(ws.files_dir, ws.task, limits=limits)  # 1.2 s of import, 24 calls of 0.05 s: 2.4 s in all
    assert time.monotonic() - started < 2.0 + 1.5
    [message] = [problem.message for problem in verdict.errors if problem.field == "environment.module"]
    assert "(timeout)" in message and "wall-clock limit of 2 s" in message
    assert probe_workspace(ws.files_dir, ws.task, limits=limits.model_copy(update={"wall_seconds": 4.0})).passed
