"""Pure rules for platform faults: one failure cause over a window, disagreeing hidden-eval secrets (issue 39)."""

from __future__ import annotations

from metarl.domain.batching import common_failure_cause, window_failure_cause
from metarl.errors import ArtifactStoreNotShared, ArtifactStoreUnavailable, HiddenEvalSecretFault, PlatformFault
from metarl.learning.eval_secret import EvalSecretMissing
from metarl.store.run_hosts import secret_disagreement


def test_one_cause_ignores_numbers_only() -> None:
    assert common_failure_cause(["episode 3: store down", "episode 17: store down"]) == "episode 3: store down"
    assert common_failure_cause(["store down", "sandbox down"]) is None
    assert common_failure_cause(["store down", None]) is None
    assert common_failure_cause([]) is None


def test_a_window_fails_only_when_every_episode_of_it_failed_for_one_cause() -> None:
    failed = [(False, "gave up after 4 transient errors: store down")] * 4
    assert window_failure_cause(failed, 4) == failed[0][1]
    assert window_failure_cause(failed[:3], 4) is None  # fewer ended than a window
    assert window_failure_cause([(True, None), *failed[:3]], 4) is None  # one was rewarded
    assert window_failure_cause([(False, "a"), (False, "b"), (False, "a"), (False, "a")], 4) is None
    assert window_failure_cause([*failed, (True, None)], 4) is not None  # only the newest window counts


def test_secret_disagreement_names_every_host() -> None:
    assert secret_disagreement({"a": "f1", "b": "f1", "c": None}) is None
    message = secret_disagreement({"hostA": "f1", "hostB": "f2"})
    assert message is not None and "hostA holds f1" in message and "hostB holds f2" in message


def test_which_faults_are_retried() -> None:
    assert ArtifactStoreUnavailable.retryable and issubclass(ArtifactStoreUnavailable, PlatformFault)
    assert not ArtifactStoreNotShared.retryable and not HiddenEvalSecretFault.retryable
    assert issubclass(EvalSecretMissing, HiddenEvalSecretFault)


def test_a_worker_never_creates_a_secret(tmp_path, monkeypatch) -> None:
    import pytest

    from metarl.learning import eval_secret

    monkeypatch.delenv("METARL_EVAL_SECRET", raising=False)
    monkeypatch.delenv("METARL_EVAL_SECRET_FILE", raising=False)
    monkeypatch.setattr(eval_secret, "_DEPLOYMENT_SECRET_FILE", None)
    monkeypatch.setattr(eval_secret, "_installed", [])
    root = tmp_path / "artifacts"
    with pytest.raises(EvalSecretMissing, match="METARL_EVAL_SECRET.*same on every host"):
        eval_secret.install_eval_secret(root, create=False)
    assert not (root / eval_secret.SECRET_FILE).exists()
    with pytest.raises(EvalSecretMissing, match="not a local folder"):
        eval_secret.install_eval_secret("s3://bucket/prefix", create=False)
    eval_secret.install_eval_secret(root, create=True)  # the run's own host
    made = eval_secret.installed_fingerprint()
    eval_secret._installed.clear()
    eval_secret.install_eval_secret(root, create=False)
    assert eval_secret.installed_fingerprint() == made
    named = tmp_path / "deployment.key"
    named.write_text("the-deployment-secret-0123456789\n")
    monkeypatch.setattr(eval_secret, "_DEPLOYMENT_SECRET_FILE", str(named))
    eval_secret.install_eval_secret(root, create=False)  # the file the deployment names wins over the root's
    assert eval_secret.installed_fingerprint() == eval_secret.secret_fingerprint(b"the-deployment-secret-0123456789")
