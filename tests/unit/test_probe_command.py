"""`metarl probe DIR --task ID [--json]` as a user runs it (a subprocess of the real CLI), the run
config's `[sandbox] min_isolation`, and `metarl run` refusing a host that cannot isolate agent code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.base import ConfigError, load_toml_model
from schemas.run_config import RunConfig
from tests.conftest import REPO, metarl_cli
from tests.unit.test_workspace_probe import GOOD_ENV, JOB, dataset_text

HOSTILE = REPO / "tests" / "fixtures" / "hostile"
NO_NAMESPACES = "bwrap failed (exit 1): No permissions to create a new namespace"
WITHOUT_BUBBLEWRAP = (
    "import sys\n"
    "from metarl.sandbox import isolation\n"
    f"isolation.host_isolation = lambda runner, modules: isolation.HostIsolation(None, None, {NO_NAMESPACES!r})\n"
    "from metarl_cli.main import main\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)
"""The CLI on a host where bubblewrap cannot create namespaces (the one thing patched)."""


def env() -> dict[str, str]:
    """The environment without metarl's settings, but with the hidden-eval secret the test datasets were drawn under."""
    return {key: value for key, value in os.environ.items() if not key.startswith("METARL_") or key == "METARL_EVAL_SECRET"}


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "attempt" / "files"
    folder.mkdir(parents=True)
    (folder / "job.toml").write_text(JOB, encoding="utf-8")
    (folder / "environment.py").write_text(GOOD_ENV, encoding="utf-8")
    (folder / "dataset.jsonl").write_text(dataset_text(), encoding="utf-8")
    return folder


def test_valid_workspace_exits_0(files: Path) -> None:
    result = metarl_cli(["probe", str(files), "--task", "addition"], env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("VALID (task addition, isolation full")
    as_json = json.loads(metarl_cli(["probe", str(files), "--task", "addition", "--json"], env(), timeout=120).stdout)
    assert as_json["verdict"] == "valid" and as_json["passed"] is True and as_json["problems"] == []
    assert as_json["isolation"] == "full" and {"bubblewrap", "seccomp", "audit-hook"} <= set(as_json["isolation_layers"])


@pytest.mark.parametrize(
    ("module", "needle"),
    [("huge_reward.py", "beyond the allowed magnitude 1e+06"), ("mknod_tmp.py", "system call the sandbox forbids"), ("read_passwd.py", "refused open")],
)
def test_refused_workspace_exits_1_with_every_problem(files: Path, module: str, needle: str) -> None:
    (files / "environment.py").write_text((HOSTILE / module).read_text(encoding="utf-8"), encoding="utf-8")
    (files / "dataset.jsonl").write_text("not json\n", encoding="utf-8")
    result = metarl_cli(["probe", str(files), "--task", "addition", "--json"], env(), timeout=120)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "refused" and report["passed"] is False and report["isolation"] == "full"
    messages = [problem["message"] for problem in report["problems"]]
    assert any(needle in message for message in messages), messages
    assert any("line 1: is not valid JSON" in message for message in messages)  # every problem, not just the first
    assert all(problem["fix"] for problem in report["problems"])
    text = metarl_cli(["probe", str(files), "--task", "addition"], env(), timeout=120)
    assert text.returncode == 1 and text.stdout.startswith("REFUSED: ") and "  fix: " in text.stdout


@pytest.mark.parametrize(
    ("module", "needle"),
    [
        ("forge_bootstrap.py", "forged or malformed result frame: a sandbox set-up failure reported after"),
        ("forge_huge_reward.py", "forged or malformed result frame: the value of call 0 holds an integer beyond"),
        ("clamped_no_signal.py", "(200 before clamping to [-100, 100])"),
    ],
)
def test_the_modules_own_doing_is_refused_as_its_fault(files: Path, module: str, needle: str) -> None:
    """Issue 40: a forged set-up failure made the probe exit 2 ("the sandbox could not run"), a forged reward of 10**400
    crashed it with an OverflowError traceback (exit 1), and rewards beyond the clamp passed it."""
    (files / "environment.py").write_text((HOSTILE / module).read_text(encoding="utf-8"), encoding="utf-8")
    (files / "job.toml").write_text(JOB.replace("[reward.components]\ncorrectness = 1.0\nformat = 0.1\n", ""), encoding="utf-8")
    result = metarl_cli(["probe", str(files), "--task", "addition", "--json"], env(), timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, (result.stdout, result.stderr)
    report = json.loads(result.stdout)
    assert report["verdict"] == "refused" and report["isolation"] == "full"
    assert any(needle in problem["message"] for problem in report["problems"]), report["problems"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["probe", "{missing}", "--task", "addition"], "is not a folder"),
        (["probe", "{files}", "--task", "no_such_task"], "no task spec"),
        (["probe", "{files}"], "--task"),
        (["probe", "{files}", "--task", "addition", "--seed", "-1"], "--seed"),
        (["probe", "{files}", "--task", "addition", "--config", "{missing}"], "missing"),
    ],
)
def test_bad_usage_exits_2(files: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    filled = [arg.replace("{files}", str(files)).replace("{missing}", str(tmp_path / "missing")) for arg in args]
    result = metarl_cli(filled, env(), timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_a_task_spec_path_and_a_run_configs_checks(files: Path, tmp_path: Path) -> None:
    result = metarl_cli(["probe", str(files), "--task", str(REPO / "tasks_specs" / "addition.toml"), "--json"], env(), timeout=120)
    assert result.returncode == 0 and json.loads(result.stdout)["backend_checks"] == "none"
    config = tmp_path / "run.toml"
    config.write_text((REPO / "examples" / "local.toml").read_text().replace('"../tasks_specs"', f'"{REPO / "tasks_specs"}"'), encoding="utf-8")
    (files / "job.toml").write_text(JOB.replace("[reward.components]\ncorrectness = 1.0\nformat = 0.1\n", "[reward.components]\nsparkle = 1.0\n"))
    result = metarl_cli(["probe", str(files), "--task", "addition", "--config", str(config), "--json"], env(), timeout=300)
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["backend_checks"] == "local"
    assert any("sparkle" in problem["message"] for problem in report["problems"])  # the local trainer's compile check ran


def cli_without_bubblewrap(args: list[str], tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environment = {**env(), "METARL_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-c", WITHOUT_BUBBLEWRAP, *args], env=environment, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_probe_refuses_a_host_without_full_isolation(files: Path, tmp_path: Path) -> None:
    result = cli_without_bubblewrap(["probe", str(files), "--task", "addition", "--json"], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "[sandbox] min_isolation = 'full'" in result.stderr and NO_NAMESPACES in result.stderr
    assert 'min_isolation = "process"' in result.stderr and "Traceback" not in result.stderr
    config = tmp_path / "accepting.toml"
    accepting = (REPO / "examples" / "sim.toml").read_text().replace('"../tasks_specs"', f'"{REPO / "tasks_specs"}"')
    config.write_text(accepting + '\n[sandbox]\nmin_isolation = "process"\n', encoding="utf-8")
    accepted = cli_without_bubblewrap(["probe", str(files), "--task", "addition", "--config", str(config), "--json"], tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    report = json.loads(accepted.stdout)
    assert report["isolation"] == "process" and "bubblewrap" not in report["isolation_layers"]


def test_run_refuses_to_start_workers_on_a_host_without_full_isolation(tmp_path: Path) -> None:
    config = tmp_path / "local.toml"
    config.write_text((REPO / "examples" / "local.toml").read_text().replace('"../tasks_specs"', f'"{REPO / "tasks_specs"}"'), encoding="utf-8")
    result = cli_without_bubblewrap(["run", str(config), "--quiet"], tmp_path, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr[-2000:])
    assert "[sandbox] min_isolation = 'full'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "home").exists()  # refused before any service started


def test_min_isolation_setting() -> None:
    assert RunConfig.model_fields["sandbox"].default_factory().min_isolation == "full"  # type: ignore[misc]
    for example in sorted((REPO / "examples").glob("*.toml")):
        assert load_toml_model(RunConfig, example).sandbox.min_isolation == "full"


def test_unknown_isolation_level_names_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text((REPO / "examples" / "sim.toml").read_text() + '\n[sandbox]\nmin_isolation = "none"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as bad:
        load_toml_model(RunConfig, config)
    assert "sandbox.min_isolation" in str(bad.value) and "'full'" in str(bad.value)


def test_without_a_secret_in_the_environment_the_probe_keys_its_checks_by_the_artifacts_roots_secret(files: Path, tmp_path: Path) -> None:
    bare = {key: value for key, value in env().items() if key != "METARL_EVAL_SECRET"}
    result = metarl_cli(["probe", str(files), "--task", "addition", "--json", "--artifacts", str(tmp_path / "artifacts")], bare, timeout=120)
    assert result.returncode in (0, 1), result.stderr  # a verdict (the dataset was drawn under another secret), not a usage error
    secret_file = tmp_path / "artifacts" / "secrets" / "eval_partition.key"
    assert secret_file.is_file() and secret_file.stat().st_mode & 0o777 == 0o600
    assert secret_file.read_text(encoding="utf-8").strip() not in result.stdout + result.stderr
