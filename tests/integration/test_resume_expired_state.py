"""`metarl resume` of a run whose saved policy state cannot be continued says so before anything starts.

A Tinker run is stored as `metarl run examples/tinker.toml` would store it (its version 0 saved 8 days ago, past the
7-day `checkpoint_ttl_s`); the command refuses with the dates and the fix, starts no worker, and leaves the run as it was.
A local run whose saved policy has another job-language vocabulary (saved by other code) is refused the same way.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from sqlalchemy import update

from metarl.runconfig import load_run
from metarl.store import create_run
from metarl.store.db import session_scope
from metarl.store.records import PolicyVersion, Run, RunStatus
from tests.conftest import REPO, metarl_cli

pytestmark = pytest.mark.integration


def stored_tinker_run(pg_url: str, saved_days_ago: float) -> str:
    config, specs = load_run(REPO / "examples" / "tinker.toml")
    run_id = create_run(pg_url, config, specs, lambda run_id: f"tinker://{run_id}/weights/v0")
    with session_scope(pg_url) as session:
        saved = dt.datetime.now(dt.UTC) - dt.timedelta(days=saved_days_ago)
        session.execute(update(PolicyVersion).where(PolicyVersion.run_id == run_id).values(created_at=saved))
        session.execute(update(Run).where(Run.id == run_id).values(status=RunStatus.interrupted, status_message="Ctrl-C"))
    return run_id


def test_resuming_a_tinker_run_past_its_checkpoint_ttl_is_refused_before_anything_starts(service_env, pg_url) -> None:
    run_id = stored_tinker_run(pg_url, saved_days_ago=8)
    result = metarl_cli(["resume", run_id], {**service_env, "TINKER_API_KEY": "tk-test"}, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"run {run_id} cannot be resumed: policy version 0's saved state on Tinker expired at" in result.stderr
    assert "checkpoint_ttl_s = 604800 s" in result.stderr and "Start a new run" in result.stderr
    assert "worker" not in result.stdout.lower()
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == RunStatus.interrupted  # untouched: not taken up


def test_a_tinker_run_within_its_ttl_is_not_refused_by_that_check(pg_url) -> None:
    from metarl.store import runs_transaction
    from metarl_cli.run_commands import resume_refusal

    run_id = stored_tinker_run(pg_url, saved_days_ago=6)
    with runs_transaction(pg_url) as runs:
        run = runs.summary(run_id)
        assert run is not None and resume_refusal(runs, run) is None


def stored_local_run(pg_url: str, tmp_path: Path, vocabulary_edit) -> str:
    import torch

    from metarl.policy.local_policy import LocalPolicy

    config, specs = load_run(REPO / "examples" / "local.toml")
    state = LocalPolicy().state_dict()
    state["vocab"] = vocabulary_edit(state["vocab"])
    path = tmp_path / "v00000.pt"
    torch.save(state, path)
    run_id = create_run(pg_url, config, specs, lambda _run_id: str(path))
    with session_scope(pg_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(status=RunStatus.interrupted, status_message="Ctrl-C"))
    return run_id


def test_resuming_a_local_run_saved_with_another_job_language_is_refused_before_anything_starts(service_env, pg_url, tmp_path: Path) -> None:
    run_id = stored_local_run(pg_url, tmp_path, lambda vocab: [*vocab, "<a-token-of-other-code>"])
    result = metarl_cli(["resume", run_id], service_env, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"run {run_id} cannot be resumed: policy version 0: its saved local policy state does not load in this code (saved with a different job-language vocabulary"
        in result.stderr
    )
    assert "1 removed" in result.stderr and "metarl run CONFIG --new" in result.stderr
    assert "worker" not in result.stdout.lower()
    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == RunStatus.interrupted


def test_a_local_run_of_this_code_is_not_refused_by_that_check(pg_url, tmp_path: Path) -> None:
    from metarl.store import runs_transaction
    from metarl_cli.run_commands import resume_refusal

    run_id = stored_local_run(pg_url, tmp_path, lambda vocab: vocab)
    with runs_transaction(pg_url) as runs:
        run = runs.summary(run_id)
        assert run is not None and resume_refusal(runs, run) is None
