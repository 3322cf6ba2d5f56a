"""Issue 40, items 5, 6, 7 and 9 as a user meets them: the real `metarl` command (and the versus-search bench)
in a subprocess. Each bad input is one line (or one block of field problems) naming the option or field and
the fix, exit 2, no traceback, nothing written first; a FIFO, a device or a backtracking pattern never hangs it."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, metarl_cli

pytestmark = pytest.mark.integration

CAPITALS = REPO / "tests" / "fixtures" / "families" / "capitals"
SECRET = "test-credential-not-a-key-0123456789"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without metarl's settings or API keys (the test secret kept), and a METARL_HOME that must stay absent."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("METARL_", "TINKER_", "RUNPOD_")) or key == "METARL_EVAL_SECRET"}
    return {**env, "METARL_HOME": str(tmp_path / "home"), **extra}


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    context = f"exit {result.returncode}\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-4000:]}"
    assert result.returncode == 2, context
    assert "Traceback" not in result.stderr, context
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), context
    for needle in needles:
        assert needle in lines[0], context


def limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def specs_folder(tmp_path: Path, *, pool: str | None = None, hidden: str | None = None, grader: str | None = None) -> Path:
    folder = tmp_path / "specs"
    shutil.copytree(CAPITALS, folder)
    spec = folder / "capitals.toml"
    text = spec.read_text()
    if pool is not None:
        text = text.replace('pool = "data/train.jsonl"', f'pool = "{pool}"')
    if hidden is not None:
        text = text.replace('path = "data/hidden.jsonl"', f'path = "{hidden}"')
    if grader is not None:
        text = text[: text.index("[grader]")] + grader
    spec.write_text(text)
    return folder


def sim_config(tmp_path: Path, specs: Path, task: str = "capitals") -> Path:
    text = (REPO / "examples" / "sim.toml").read_text()
    text = text.replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{specs}"')
    start = text.index("tasks = [")
    text = text[:start] + f'tasks = ["{task}"]' + text[text.index("]", start) + 1 :]
    config = tmp_path / "run.toml"
    config.write_text(text)
    return config


# ---- item 6: data files that are devices or FIFOs


def test_tasks_check_refuses_a_device_as_the_pool_without_reading_it(tmp_path: Path) -> None:
    folder = specs_folder(tmp_path, pool="/dev/zero")
    result = subprocess.run(
        [sys.executable, "-m", "metarl_cli.main", "tasks", "check", str(folder)],
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        preexec_fn=limit_memory,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "items.pool: /dev/zero is a device, not a regular file" in result.stderr and "Fix:" in result.stderr, result.stderr


def test_a_fifo_as_the_hidden_eval_does_not_hang_tasks_check_or_the_dry_run(tmp_path: Path) -> None:
    fifo = tmp_path / "hidden.fifo"
    os.mkfifo(fifo)
    folder = specs_folder(tmp_path, hidden=str(fifo))
    checked = metarl_cli(["tasks", "check", str(folder)], clean_env(tmp_path), timeout=30)
    assert checked.returncode == 2 and "hidden_eval.path" in checked.stderr and "is a FIFO" in checked.stderr, checked.stderr
    planned = metarl_cli(["run", str(sim_config(tmp_path, folder)), "--dry-run"], clean_env(tmp_path), timeout=30)
    assert planned.returncode == 2 and "Traceback" not in planned.stderr, planned.stderr
    assert "hidden_eval.path" in planned.stderr and "is a FIFO" in planned.stderr and "Fix:" in planned.stderr, planned.stderr
    assert not (tmp_path / "home").exists()


# ---- item 7: a backtracking pattern


def test_tasks_check_grades_a_29_character_answer_with_the_issue_pattern_at_once(tmp_path: Path) -> None:
    folder = specs_folder(tmp_path, grader='[grader]\nkind = "regex_extract"\npattern = "^(a+)+$"\ninner = { kind = "exact" }\n')
    pool = folder / "data" / "train.jsonl"
    pool.write_text(pool.read_text() + '{"prompt": "capital of atlantis?", "answer": "' + "a" * 28 + '!"}\n')
    started = time.monotonic()
    result = metarl_cli(["tasks", "check", str(folder)], clean_env(tmp_path), timeout=60)
    assert time.monotonic() - started < 20, "grading the reference answers took too long"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "is not a well-formed answer for the regex_extract grader" in result.stderr


def test_tasks_check_refuses_a_backreference_naming_the_field(tmp_path: Path) -> None:
    folder = specs_folder(tmp_path, grader='[grader]\nkind = "regex_extract"\npattern = "(\\\\w+) \\\\1"\ninner = { kind = "exact" }\n')
    result = metarl_cli(["tasks", "check", str(folder)], clean_env(tmp_path), timeout=60)
    assert result.returncode == 2 and "grader.pattern" in result.stderr and "RE2" in result.stderr, result.stderr


# ---- item 5: credentials in a URL of the config


def test_run_refuses_a_key_inside_the_tinker_url_before_anything_starts(tmp_path: Path) -> None:
    text = (REPO / "examples" / "tinker.toml").read_text().replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{REPO / "tasks_specs"}"')
    for table in ("[backends.agent]", "[backends.outer]"):
        text = text.replace(f'{table}\ntype = "tinker"', f'{table}\ntype = "tinker"\nbase_url = "https://user:{SECRET}@tinker.example/v1"', 1)
    config = tmp_path / "run.toml"
    config.write_text(text)
    result = metarl_cli(["run", str(config)], clean_env(tmp_path, TINKER_API_KEY="tk-env-key"), timeout=60)
    assert result.returncode == 2, result.stderr
    assert "backends.agent.base_url" in result.stderr and "TINKER_API_KEY" in result.stderr and SECRET not in result.stderr + result.stdout
    assert not (tmp_path / "home").exists()


# ---- item 9: tracebacks instead of one-line errors


@pytest.mark.parametrize("artifacts", ["/dev/null", "/proc/x", "s3://b/x"])
def test_probe_and_tasks_show_name_a_bad_artifacts_root(tmp_path: Path, artifacts: str) -> None:
    env = clean_env(tmp_path, PYTHONPATH=str(REPO))  # run from tmp_path (to see what is written there), this checkout's code
    env.pop("METARL_EVAL_SECRET", None)
    (tmp_path / "files").mkdir()
    probed = metarl_cli(["probe", str(tmp_path / "files"), "--task", "addition", "--artifacts", artifacts], env, timeout=120, cwd=tmp_path)
    assert_one_line_error(probed, "--artifacts", "METARL_EVAL_SECRET")
    shown = metarl_cli(["tasks", "show", "addition", "--artifacts", artifacts], env, timeout=120, cwd=tmp_path)
    assert_one_line_error(shown, "--artifacts", "METARL_EVAL_SECRET")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["files"], "something was written"


def test_run_without_the_tinker_key_stops_before_any_database_is_made(tmp_path: Path) -> None:
    config = tmp_path / "tinker.toml"
    config.write_text(
        (REPO / "examples" / "tinker.toml").read_text().replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{REPO / "tasks_specs"}"')
    )
    started = time.monotonic()
    result = metarl_cli(["run", str(config)], clean_env(tmp_path), timeout=120)
    assert_one_line_error(result, "TINKER_API_KEY", "Fix:", "backends.agent")
    assert not (tmp_path / "home").exists(), "the embedded database was created before the key was checked"
    assert time.monotonic() - started < 60


def test_probe_json_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    command = [sys.executable, "-m", "metarl_cli.main", "probe", str(tmp_path / "files"), "--task", "addition", "--json"]
    with subprocess.Popen(command, env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO) as child:
        assert child.stdout is not None and child.stderr is not None
        child.stdout.close()  # the reader is gone before the verdict is written, as with `| head -c0`
        errors = child.stderr.read().decode()
        code = child.wait(timeout=120)
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
    assert code == 1


BLOCK_OPTUNA = """
import sys
class NoOptuna:
    def find_spec(self, name, path=None, target=None):
        if name == "optuna" or name.startswith("optuna."):
            raise ModuleNotFoundError("No module named 'optuna'", name=name)
        return None
sys.meta_path.insert(0, NoOptuna())
from bench.versus_search import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_versus_search_without_optuna_says_so_before_building_models(tmp_path: Path) -> None:
    command = [sys.executable, "-c", BLOCK_OPTUNA, "--quick", "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "models")]
    result = subprocess.run(command, env=clean_env(tmp_path), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert_one_line_error(result, "optuna", "pip install")
    assert not (tmp_path / "models").exists() and not (tmp_path / "out").exists()
