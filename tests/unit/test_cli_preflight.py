"""Issue 40, item 9: what the commands check before any work, as pure functions: each configured backend's API
key (metarl.runconfig.missing_backend_keys), the bench's optional modules, and a usable hidden-eval secret root."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.versus_search import missing_optional_modules
from metarl.learning import eval_secret
from metarl.learning.eval_secret import EvalSecretMissing, install_tool_eval_secret
from metarl.runconfig import load_run, missing_backend_keys

REPO = Path(__file__).resolve().parents[2]


def test_the_tinker_example_needs_its_key_and_names_both_backends() -> None:
    config, _ = load_run(REPO / "examples" / "tinker.toml")
    [line] = missing_backend_keys(config, {})
    assert line.startswith('backends.agent (type = "tinker") and backends.outer (type = "tinker") need TINKER_API_KEY, which is not set')
    assert "Fix: export TINKER_API_KEY" in line
    assert missing_backend_keys(config, {"TINKER_API_KEY": "tk-1"}) == []
    assert len(missing_backend_keys(config, {"TINKER_API_KEY": "  "})) == 1  # blank is unset, as the client reads it


def test_the_runpod_example_needs_the_runpod_key_and_the_simulator_none() -> None:
    runpod, _ = load_run(REPO / "examples" / "runpod.toml")
    [line] = missing_backend_keys(runpod, {})
    assert line.startswith('backends.train (type = "runpod") needs RUNPOD_API_KEY') and "Fix: export RUNPOD_API_KEY" in line
    sim, _ = load_run(REPO / "examples" / "sim.toml")
    assert missing_backend_keys(sim, {}) == []


def test_a_missing_optional_module_is_one_line_with_the_fix() -> None:
    [line] = missing_optional_modules({"metarl_no_such_module_40": "the test"})
    assert line.startswith("metarl_no_such_module_40 cannot be imported") and "Fix: pip install -e '.[dev]'" in line
    assert missing_optional_modules({"json": "nothing"}) == []


@pytest.mark.parametrize("root", ["/dev/null", "/proc/metarl-no-such-folder", "s3://bucket/prefix"])
def test_a_root_that_cannot_hold_the_secret_is_refused_with_the_fix(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (eval_secret.EVAL_SECRET_ENV, eval_secret.EVAL_SECRET_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(eval_secret, "_DEPLOYMENT_SECRET_FILE", None)
    monkeypatch.setattr(eval_secret, "_installed", [])
    with pytest.raises(EvalSecretMissing) as info:
        install_tool_eval_secret(root)
    assert repr(root) in str(info.value) and eval_secret.EVAL_SECRET_ENV in str(info.value)


def test_a_local_root_gets_its_secret_and_the_environment_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eval_secret.EVAL_SECRET_ENV, raising=False)
    monkeypatch.delenv(eval_secret.EVAL_SECRET_FILE_ENV, raising=False)
    monkeypatch.setattr(eval_secret, "_DEPLOYMENT_SECRET_FILE", None)
    monkeypatch.setattr(eval_secret, "_installed", [])
    install_tool_eval_secret(tmp_path / "artifacts")
    assert (tmp_path / "artifacts" / eval_secret.SECRET_FILE).is_file()
    monkeypatch.setenv(eval_secret.EVAL_SECRET_ENV, "a-deployment-secret-0001")
    install_tool_eval_secret("s3://bucket/prefix")
    assert eval_secret.active_eval_secret() == b"a-deployment-secret-0001"


def _without_bubblewrap(monkeypatch: pytest.MonkeyPatch, wall_problem: str | None) -> None:
    """This host as one that refuses user namespaces, with or without Landlock."""
    from metarl.sandbox import isolation

    refused = isolation.HostIsolation(bwrap=None, root=None, problem="user namespaces are disabled")
    monkeypatch.setattr(isolation, "host_isolation", lambda *_: refused)
    monkeypatch.setattr(isolation, "process_wall_problem", lambda: wall_problem)


def _run_config(min_isolation: str) -> object:
    config, _ = load_run(REPO / "examples" / "local.toml")
    return config.model_copy(update={"sandbox": config.sandbox.model_copy(update={"min_isolation": min_isolation})})


@pytest.mark.parametrize(
    ("min_isolation", "wall_problem", "refused_with"),
    [
        ("full", None, "[sandbox] min_isolation = 'full'"),
        ("process", "Landlock is not enabled", "needs Landlock (Landlock is not enabled)"),
        ("process", None, None),
    ],
)
def test_run_preflight_refuses_a_host_that_cannot_give_the_level(
    monkeypatch: pytest.MonkeyPatch, min_isolation: str, wall_problem: str | None, refused_with: str | None
) -> None:
    from metarl_cli.probe_command import preflight_isolation

    _without_bubblewrap(monkeypatch, wall_problem)
    refusal = preflight_isolation(_run_config(min_isolation))
    if refused_with is None:
        assert refusal is None
    else:
        assert refusal is not None and refused_with in refusal and "Fix:" in refusal, refusal
