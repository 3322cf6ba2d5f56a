"""The hidden-eval partition is keyed by the deployment's secret (metarl/learning/eval_secret.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from metarl.learning import eval_secret
from metarl.learning.families import in_eval_partition
from metarl.learning.registry import get_family
from metarl.store.baselines import eval_identity
from schemas.task_spec import TaskSpec

SECRET_A, SECRET_B = b"first-deployment-secret-0001", b"second-deployment-secret-002"


def test_the_partition_and_the_hidden_eval_differ_between_secrets() -> None:
    keys = [f"k{index}" for index in range(4000)]
    first = {key for key in keys if in_eval_partition("addition", key, SECRET_A)}
    second = {key for key in keys if in_eval_partition("addition", key, SECRET_B)}
    assert 0.10 < len(first) / len(keys) < 0.15 and first != second
    family = get_family("addition")
    assert family.hidden_eval(50, 1, SECRET_A) != family.hidden_eval(50, 1, SECRET_B)
    assert family.hidden_eval(50, 1, SECRET_A) == family.hidden_eval(50, 1, SECRET_A)


def test_without_a_secret_no_held_back_item_can_be_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eval_secret.EVAL_SECRET_ENV, raising=False)
    monkeypatch.delenv(eval_secret.EVAL_SECRET_FILE_ENV, raising=False)
    monkeypatch.setattr(eval_secret, "_installed", [])
    family = get_family("addition")
    with pytest.raises(eval_secret.EvalSecretMissing):
        in_eval_partition("addition", "3+4")
    with pytest.raises(eval_secret.EvalSecretMissing):
        family.hidden_eval(10)
    with pytest.raises(eval_secret.EvalSecretMissing):
        family.is_hidden_eval_item("add 3+4=")


def test_the_secret_file_is_created_once_with_owner_only_access(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eval_secret.EVAL_SECRET_ENV, raising=False)
    monkeypatch.delenv(eval_secret.EVAL_SECRET_FILE_ENV, raising=False)
    monkeypatch.setattr(eval_secret, "_installed", [])
    with pytest.raises(eval_secret.EvalSecretMissing, match=eval_secret.EVAL_SECRET_ENV):
        eval_secret.active_eval_secret()
    eval_secret.install_eval_secret(tmp_path / "artifacts")
    path = tmp_path / "artifacts" / eval_secret.SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = eval_secret.active_eval_secret()
    eval_secret.install_eval_secret(tmp_path / "artifacts")
    assert eval_secret.active_eval_secret() == secret and path.read_text().strip().encode() == secret
    monkeypatch.setattr(eval_secret, "_installed", [])
    assert eval_secret.active_eval_secret() == secret  # a child process: through the exported file path


def test_the_environment_variable_wins_and_short_secrets_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eval_secret, "_installed", [])
    monkeypatch.setenv(eval_secret.EVAL_SECRET_ENV, SECRET_A.decode())
    eval_secret.install_eval_secret(tmp_path)
    assert eval_secret.active_eval_secret() == SECRET_A and not (tmp_path / eval_secret.SECRET_FILE).exists()
    monkeypatch.setattr(eval_secret, "_installed", [])
    monkeypatch.setenv(eval_secret.EVAL_SECRET_ENV, "short")
    with pytest.raises(eval_secret.EvalSecretMissing, match="at least"):
        eval_secret.active_eval_secret()


def test_the_fingerprint_keys_the_base_score_without_revealing_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    fingerprint = eval_secret.secret_fingerprint(SECRET_A)
    assert fingerprint != eval_secret.secret_fingerprint(SECRET_B) and SECRET_A.hex()[:12] != fingerprint and SECRET_A.decode() not in fingerprint
    task = TaskSpec.model_validate({"id": "addition", "family": "addition", "public": {"title": "t", "description": "d"}, "data": {}})
    monkeypatch.setattr(eval_secret, "_installed", [SECRET_A])
    first = eval_identity(task)
    monkeypatch.setattr(eval_secret, "_installed", [SECRET_B])
    assert eval_identity(task) != first
