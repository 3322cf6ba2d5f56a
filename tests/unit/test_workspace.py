"""The agent workspace: confinement of the file tools, caps, TASK.md, dispatch and the transcript.

Hand-written hostile cases first (traversal, links planted in the folder or as a parent, special
files, huge and non-UTF-8 files, malformed tool calls), then hypothesis properties.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metarl.learning.registry import get_family
from metarl.workspace import (
    FILES_DIR,
    TASK_FILE,
    TRANSCRIPT_FILE,
    ToolResult,
    Workspace,
    WorkspaceLimits,
    render_task_md,
    tool_specs,
)
from schemas.base import FieldProblem
from schemas.task_spec import TaskSpec

SECRET = "metarl-test-secret-77e1b0"
HIDDEN_VALUES = {"n_items": 4321, "version": 987654, "max_tokens": 7777, "pass_k": 13, "solved_improvement": 0.123456}


def make_task(**public: Any) -> TaskSpec:
    return TaskSpec.model_validate(
        {
            "id": "addition",
            "family": "addition",
            "held_out": True,
            "public": {"title": "Add two numbers", "description": "Teach the model to add.", "example_prompt": "add 1+2=", "example_answer": "3", **public},
            "data": {"min_dataset_size": 16, "max_dataset_size": 500},
            "hidden_eval": HIDDEN_VALUES,
            "budget": {"max_train_seconds": 90.0, "max_rollout_tokens": 123456, "allowed_models": ["Qwen/Qwen3-0.6B"]},
        }
    )


@pytest.fixture
def task() -> TaskSpec:
    return make_task()


@pytest.fixture
def ws(tmp_path: Path, task: TaskSpec) -> Workspace:
    return Workspace(tmp_path / "attempt", task, baseline=lambda model: 0.25)


def error_kind(result: ToolResult) -> str:
    assert not result.ok and result.error is not None, result
    return result.error.kind


def outside_entries(tmp_path: Path) -> list[str]:
    """Everything under tmp_path but outside the agent folder (transcript excepted)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(tmp_path).as_posix()
            if rel in ("attempt", f"attempt/{FILES_DIR}", f"attempt/{TRANSCRIPT_FILE}") or rel.startswith(f"attempt/{FILES_DIR}/"):
                continue
            found.append(rel)
    return sorted(found)


# --------------------------------------------------------------------------------------------
# TASK.md


def test_task_md_has_public_part_and_never_hidden_eval(ws: Workspace, task: TaskSpec) -> None:
    text = ws.read_file(TASK_FILE).result["content"]
    assert text == render_task_md(task, limits=ws.limits)
    for needle in (
        "Add two numbers",
        "Teach the model to add.",
        "add 1+2=",
        "Qwen/Qwen3-0.6B",
        "123456",
        "def reward(prompt: str, completion: str, answer: str) -> float",
        "COMPONENTS",
        "[dataset]",
    ):
        assert needle in text
    for value in HIDDEN_VALUES.values():
        assert str(value) not in text
    for name in ("hidden_eval", "n_items", "pass_k", "solved_improvement", "held_out", "held out"):
        assert name not in text


def test_task_md_leaves_out_an_example_that_is_a_hidden_eval_item(tmp_path: Path) -> None:
    hidden = get_family("addition").hidden_eval(1)[0]
    task = make_task(example_prompt=hidden.prompt, example_answer=hidden.answer)
    text = render_task_md(task)
    assert hidden.prompt not in text


def test_task_md_lists_feedback(task: TaskSpec) -> None:
    text = render_task_md(task, [FieldProblem(field="dataset.size", message="too small\x1b[2J", fix="use more")])
    assert "dataset.size: too small\\x1b[2J. Fix: use more" in text


def test_task_md_is_read_only(ws: Workspace) -> None:
    for name in (TASK_FILE, "task.md", "Task.MD"):
        assert error_kind(ws.write_file(name, "pwned")) == "read_only"
    assert "pwned" not in (ws.files_dir / TASK_FILE).read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# file tools


def test_write_read_list_roundtrip(ws: Workspace) -> None:
    written = ws.write_file("job.toml", '[model]\nname = "Qwen/Qwen3-0.6B"\n')
    assert written.ok and written.result["created"] is True
    assert ws.write_file("data/train.jsonl", '{"prompt": "a", "answer": "b"}\n').ok
    again = ws.write_file("job.toml", "# replaced ✓\n")
    assert again.ok and again.result["created"] is False
    assert ws.read_file("job.toml").result["content"] == "# replaced ✓\n"
    listing = ws.list_files().result
    assert [item["path"] for item in listing["files"]] == [TASK_FILE, "data/train.jsonl", "job.toml"]
    assert listing["total_bytes"] == sum(item["bytes"] for item in listing["files"] if item["path"] != TASK_FILE)
    assert not [name for name in os.listdir(ws.files_dir) if name.startswith(".tmp-")]


def test_read_window_for_long_files(tmp_path: Path, task: TaskSpec) -> None:
    ws = Workspace(tmp_path / "a", task, limits=WorkspaceLimits(max_read_chars=256))
    text = "".join(chr(0x61 + i % 26) for i in range(1000))
    assert ws.write_file("long.txt", text).ok
    first = ws.read_file("long.txt").result
    assert first["content"] == text[:256] and first["truncated"] and first["next_offset"] == 256
    last = ws.read_file("long.txt", offset=768).result
    assert last["content"] == text[768:] and "truncated" not in last


BAD_PATHS = [
    "../escape.txt",
    "a/../../escape.txt",
    "..",
    ".",
    "/etc/passwd",
    "/tmp/escape.txt",
    "~/escape.txt",
    "C:/escape.txt",
    "a\\..\\escape.txt",
    "",
    "./job.toml",
    "a//b",
    "a/",
    ".hidden",
    ".tmp-0123456789abcdef",
    "a\x00b",
    "x" * 300,
    "a/b/c/d.txt",
    "é.txt",
    "a b.txt",
    "-/x" * 3,
    "job.toml\n",
    "\u202ejob.toml",
]


@pytest.mark.parametrize("path", BAD_PATHS)
def test_bad_paths_refused(ws: Workspace, tmp_path: Path, path: str) -> None:
    assert error_kind(ws.write_file(path, "x")) == "bad_path"
    assert error_kind(ws.read_file(path)) == "bad_path"
    assert outside_entries(tmp_path) == []


def test_transcript_not_reachable_by_tools(ws: Workspace) -> None:
    ws.list_files()
    assert (ws.root / TRANSCRIPT_FILE).exists()
    for path in ("../transcript.jsonl", TRANSCRIPT_FILE):
        result = ws.read_file(path)
        assert not result.ok and error_kind(result) in ("bad_path", "not_found")


def test_planted_symlink_file_is_refused(ws: Workspace, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET, encoding="utf-8")
    (ws.files_dir / "link.txt").symlink_to(secret)
    assert error_kind(ws.read_file("link.txt")) == "link_refused"
    assert error_kind(ws.write_file("link.txt", "overwrite")) == "link_refused"
    assert secret.read_text(encoding="utf-8") == SECRET
    listing = ws.list_files().result
    assert {"path": "link.txt", "reason": "symbolic link (never followed)"} in listing["refused"]
    assert "link.txt" not in [item["path"] for item in listing["files"]]


def test_dangling_and_relative_symlinks_are_refused(ws: Workspace, tmp_path: Path) -> None:
    (ws.files_dir / "dangling.py").symlink_to(tmp_path / "created-through-link.py")
    (ws.files_dir / "rel.txt").symlink_to("../../secret.txt")
    assert error_kind(ws.write_file("dangling.py", "x")) == "link_refused"
    assert not (tmp_path / "created-through-link.py").exists()
    assert error_kind(ws.read_file("rel.txt")) == "link_refused"


def test_symlink_as_parent_component_is_refused(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hidden_eval.jsonl").write_text('{"prompt": "add 1+1=", "answer": "2"}\n', encoding="utf-8")
    (ws.files_dir / "data").symlink_to(outside)
    assert error_kind(ws.read_file("data/hidden_eval.jsonl")) == "link_refused"
    assert error_kind(ws.write_file("data/new.txt", "x")) == "link_refused"
    assert sorted(os.listdir(outside)) == ["hidden_eval.jsonl"]
    # deeper: a real folder whose child is a link
    (ws.files_dir / "real").mkdir()
    (ws.files_dir / "real" / "up").symlink_to(tmp_path)
    assert error_kind(ws.read_file("real/up/outside")) == "link_refused"


def test_workspace_folder_replaced_by_link(ws: Workspace, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(ws.files_dir, tmp_path / "moved")
    ws.files_dir.symlink_to(elsewhere)
    assert error_kind(ws.write_file("job.toml", "x")) == "io_error"
    assert error_kind(ws.list_files()) == "io_error"
    assert os.listdir(elsewhere) == []


def test_hard_link_fifo_and_folder_are_refused(ws: Workspace, tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_text(SECRET, encoding="utf-8")
    os.link(target, ws.files_dir / "hard.txt")
    assert error_kind(ws.read_file("hard.txt")) == "link_refused"
    os.mkfifo(ws.files_dir / "pipe.txt")
    assert error_kind(ws.read_file("pipe.txt")) == "not_a_file"  # and it does not hang
    assert error_kind(ws.write_file("pipe.txt", "x")) == "not_a_file"
    (ws.files_dir / "folder").mkdir()
    assert error_kind(ws.read_file("folder")) == "not_a_file"
    assert error_kind(ws.write_file("folder", "x")) == "not_a_file"
    assert ws.write_file("job.toml", "x").ok
    assert error_kind(ws.write_file("job.toml/inner.txt", "x")) == "not_a_file"
    refused = {item["path"]: item["reason"] for item in ws.list_files().result["refused"]}
    assert refused == {"hard.txt": "hard link", "pipe.txt": "not a regular file"}


def test_size_and_count_caps(tmp_path: Path, task: TaskSpec) -> None:
    limits = WorkspaceLimits(max_file_bytes=2048, max_files=3, max_total_bytes=5000)
    ws = Workspace(tmp_path / "a", task, limits=limits)  # TASK.md (read-only) does not count
    assert error_kind(ws.write_file("big.txt", "x" * 2049)) == "too_large"
    assert error_kind(ws.write_file("big.txt", "é" * 1025)) == "too_large"  # bytes, not characters
    assert ws.write_file("a.txt", "x" * 2000).ok
    assert ws.write_file("b.txt", "x" * 2000).ok
    assert ws.write_file("c.txt", "x" * 10).ok
    assert error_kind(ws.write_file("d.txt", "x")) == "too_many_files"
    assert ws.write_file("c.txt", "y").ok  # overwriting does not add a file
    assert error_kind(ws.write_file("c.txt", "x" * 2048)) == "workspace_full"
    assert ws.list_files().result["total_bytes"] == 4001
    assert sorted(os.listdir(ws.files_dir)) == sorted([TASK_FILE, "a.txt", "b.txt", "c.txt"])
    # a huge file planted behind the tools' back is refused on read
    (ws.files_dir / "a.txt").write_bytes(b"x" * 100_000)
    assert error_kind(ws.read_file("a.txt")) == "too_large"


def test_text_only(ws: Workspace) -> None:
    (ws.files_dir / "binary.bin").write_bytes(b"ok\xff\xfe\x00")
    result = ws.read_file("binary.bin")
    assert error_kind(result) == "not_text" and "byte 2" in result.error.message
    (ws.files_dir / "nul.txt").write_bytes(b"a\x00b")
    assert error_kind(ws.read_file("nul.txt")) == "not_text"
    assert error_kind(ws.write_file("s.txt", "bad \ud800 surrogate")) == "not_text"
    assert error_kind(ws.write_file("s.txt", "nul \x00")) == "not_text"
    assert not (ws.files_dir / "s.txt").exists()
    assert ws.write_file("ok.txt", "unicode ✓ \U0001f600").ok


# --------------------------------------------------------------------------------------------
# baseline and submit


def test_baseline_score(tmp_path: Path, task: TaskSpec) -> None:
    ws = Workspace(tmp_path / "a", task, baseline=lambda model: 0.25)
    assert ws.baseline_score("Qwen/Qwen3-0.6B").result == {"model": "Qwen/Qwen3-0.6B", "score": 0.25}
    assert error_kind(ws.baseline_score("Qwen/Qwen3-1.7B")) == "bad_call"  # not allowed for this task
    assert error_kind(Workspace(tmp_path / "b", task).baseline_score("Qwen/Qwen3-0.6B")) == "baseline_unavailable"

    def leaky(model: str) -> float:
        raise RuntimeError(f"connection to postgres://user:{SECRET}@db failed")

    leaking = Workspace(tmp_path / "c", task, baseline=leaky)
    result = leaking.baseline_score("Qwen/Qwen3-0.6B")
    assert error_kind(result) == "baseline_unavailable" and "RuntimeError" in result.error.message
    assert SECRET not in result.to_json()
    assert SECRET not in (leaking.root / TRANSCRIPT_FILE).read_text(encoding="utf-8")
    assert error_kind(Workspace(tmp_path / "d", task, baseline=lambda m: float("nan")).baseline_score("Qwen/Qwen3-0.6B")) == "baseline_unavailable"


def test_submit(ws: Workspace) -> None:
    assert error_kind(ws.submit()) == "incomplete"
    assert not ws.submitted
    assert ws.write_file("job.toml", "x").ok
    result = ws.submit()
    assert result.ok and result.result["files"] == [TASK_FILE, "job.toml"] and ws.submitted
    for late in (ws.write_file("job.toml", "y"), ws.read_file("job.toml"), ws.list_files(), ws.submit()):
        assert error_kind(late) == "already_submitted"
    assert (ws.files_dir / "job.toml").read_text(encoding="utf-8") == "x"


# --------------------------------------------------------------------------------------------
# dispatch


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ("42", "JSON object"),
        ('{"name": "rm_rf", "arguments": {}}', "unknown tool"),
        ('{"name": null}', "unknown tool"),
        ('{"arguments": {}}', "unknown tool"),
        ('{"name": "read_file"}', "path"),
        ('{"name": "read_file", "arguments": {"path": 7}}', "path"),
        ('{"name": "read_file", "arguments": {"path": "a", "mode": "w"}}', "mode"),
        ('{"name": "read_file", "arguments": "{broken"}', "not valid JSON"),
        ('{"name": "read_file", "arguments": [1]}', "object"),
        ('{"name": "read_file", "arguments": {"path": "job.toml", "offset": -1}}', "offset"),
        ('{"name": "list_files", "arguments": {}, "extra": 1}', "unknown key"),
        ('{"name": "list_files", "id": 5}', "id"),
        ('{"type": "function", "function": "list_files"}', "function"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"name": "write_file", "arguments": {"path": "a.txt", "content": 1e999}}', "content"),
    ],
)
def test_dispatch_rejects_bad_calls(ws: Workspace, call: str, needle: str) -> None:
    answer = json.loads(ws.dispatch(call))
    assert answer["ok"] is False and answer["error"]["kind"] == "bad_call", answer
    assert needle in answer["error"]["message"]
    assert answer["error"]["fix"]


def test_dispatch_shapes(ws: Workspace) -> None:
    plain = json.loads(ws.dispatch('{"name": "write_file", "arguments": {"path": "job.toml", "content": "x"}}'))
    assert plain["ok"] and plain["tool"] == "write_file"
    as_string = json.loads(ws.dispatch(json.dumps({"name": "read_file", "arguments": json.dumps({"path": "job.toml"})})))
    assert as_string["result"]["content"] == "x"
    openai = json.loads(ws.dispatch({"id": "call_1", "type": "function", "function": {"name": "list_files", "arguments": ""}}))
    assert openai["ok"] and openai["call_id"] == "call_1"
    assert json.loads(ws.dispatch(b'{"name": "list_files"}'))["ok"]
    assert json.loads(ws.dispatch(b"\xff\xfe"))["error"]["kind"] == "bad_call"


def test_tool_specs_cover_every_tool() -> None:
    specs = {spec["name"]: spec for spec in tool_specs()}
    assert set(specs) == {"list_files", "read_file", "write_file", "baseline_score", "submit"}
    assert specs["write_file"]["parameters"]["required"] == ["path", "content"]
    assert specs["read_file"]["parameters"]["additionalProperties"] is False


def test_call_cap(tmp_path: Path, task: TaskSpec) -> None:
    ws = Workspace(tmp_path / "a", task, limits=WorkspaceLimits(max_calls=3))
    for _ in range(3):
        assert ws.list_files().ok
    assert error_kind(ws.list_files()) == "too_many_calls"
    assert error_kind(ws.submit()) == "incomplete"  # submit stays possible


# --------------------------------------------------------------------------------------------
# transcript


def test_transcript_records_every_call(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METARL_TEST_SECRET", SECRET)
    ws.dispatch("garbage")
    ws.write_file("job.toml", "x")
    ws.write_file("../up", "x")
    ws.read_file("job.toml")
    ws.write_file("s.txt", "lone \udc80")
    ws.baseline_score("Qwen/Qwen3-0.6B")
    lines = (ws.root / TRANSCRIPT_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(ws.transcript) == 6
    records = [json.loads(line) for line in lines]
    assert [record["tool"] for record in records] == ["(invalid)", "write_file", "write_file", "read_file", "write_file", "baseline_score"]
    assert [record["ok"] for record in records] == [False, True, False, True, False, True]
    assert [record["seq"] for record in records] == list(range(6))
    assert records[0]["raw"] == "garbage"
    assert records[3]["result"]["content"] == "x"
    assert SECRET not in "\n".join(lines)
    assert ws.transcript_write_errors == 0


# --------------------------------------------------------------------------------------------
# hypothesis properties

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=150, suppress_health_check=list(HealthCheck))

path_alphabet = st.sampled_from(list("ab._-/\\~:\x00 é") + ["..", "TASK.md", "job.toml", "\u202e"])
paths = st.one_of(st.lists(path_alphabet, max_size=12).map("".join), st.text(max_size=30))


@PROPERTY
@given(path=paths, content=st.text(max_size=50))
def test_property_paths_never_escape(tmp_path_factory: pytest.TempPathFactory, path: str, content: str) -> None:
    base = tmp_path_factory.mktemp("prop")
    ws = Workspace(base / "attempt", make_task())
    written = ws.write_file(path, content)
    read = ws.read_file(path)
    for result in (written, read):
        assert isinstance(result, ToolResult) and (result.ok or result.error is not None)
    if written.ok:
        assert (ws.files_dir / path).resolve().is_relative_to(ws.files_dir.resolve())
        assert read.ok and read.result["content"] == content
    assert outside_entries(base) == []


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
json_values = st.recursive(
    json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12
)
tool_calls = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda name, args: json.dumps({"name": name, "arguments": args}),
        st.sampled_from(["list_files", "read_file", "write_file", "baseline_score", "submit", "x"]),
        json_values,
    ),
    st.builds(lambda data: json.dumps(data), json_values),
)


@PROPERTY
@given(calls=st.lists(tool_calls, min_size=1, max_size=5))
def test_property_dispatch_always_answers(tmp_path_factory: pytest.TempPathFactory, calls: list[str]) -> None:
    base = tmp_path_factory.mktemp("dispatch")
    ws = Workspace(base / "attempt", make_task(), baseline=lambda model: 0.5)
    for call in calls:
        answer = json.loads(ws.dispatch(call))
        assert isinstance(answer["ok"], bool)
        if not answer["ok"]:
            assert answer["error"]["kind"] and answer["error"]["message"] and answer["error"]["fix"]
    assert len(ws.transcript) == len(calls)
    assert len((ws.root / TRANSCRIPT_FILE).read_text(encoding="utf-8").splitlines()) == len(calls)
    assert outside_entries(base) == []


@pytest.mark.parametrize("spec", ["tasks_specs/addition.toml", "tasks_specs/date_format.toml", "tests/fixtures/families/capitals/capitals.toml"])
def test_task_md_gives_the_tasks_own_grader_as_a_python_literal_that_grades_the_family(spec: str) -> None:
    import ast
    import random

    from metarl import graders
    from metarl.learning.data_families import family_for
    from metarl.runconfig import load_task_spec
    from metarl.workspace import render_task_md

    task = load_task_spec(Path(__file__).resolve().parents[2] / spec)
    text = render_task_md(task)
    literal = text.split("    GRADER = ", 1)[1].split("\n", 1)[0]
    grader = ast.literal_eval(literal)
    family = family_for(task)
    assert grader == dict(family.grader)
    example = family.generate(random.Random(3), 0.5)
    assert graders.grade(grader, example.answer, example.answer) == 1.0
    assert graders.grade(grader, example.answer, example.answer + "x") == family.grade(example, example.answer + "x")
