"""Exactly one Adam step per published version on Tinker, through the real outer task, its claims and PostgreSQL.

The outer task (`workers.outer.outer_update`) runs in this process against a real database; only the
Tinker network client is a fake (tests/unit/test_tinker_fakes.py), which records for every saved state
the state its client started from and the optim steps since. A request takes effect and then its
answer is lost, or our own code fails after the step; the step is then retried as the system retries
it: by the worker's own retry of transient errors, or by a takeover once the claim's lease has run
out, either in the same worker process (its cached Tinker connection and held training client kept)
or in a new one (module caches emptied, as in a freshly started worker).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from sqlalchemy import select

from metarl.backends.tinker import client as tinker_client
from metarl.backends.tinker import outer as tinker_outer
from metarl.backends.tinker.client import TinkerPolicyRef
from metarl.domain.retry import Backoff
from metarl.runconfig import load_run
from metarl.settings import DATABASE_ENV
from metarl.store.claims import utcnow
from metarl.store.db import session_scope
from metarl.store.records import Episode, EpisodeGroup, GroupStatus, OuterStatus, OuterStep, PolicyVersion, ProbeAttempt, Reward, Run, Stage
from orchestrator.loop import create_run
from schemas.run_config import RunConfig
from tests.conftest import REPO
from tests.unit.test_tinker_fakes import FakeService, server_failure

pytestmark = pytest.mark.integration

LEASE_S = 1.0
BLOCKED = "A previous request failed; this TrainingClient is poisoned and cannot accept further requests."


class TimeLimit(Exception):
    """Stands for Celery's SoftTimeLimitExceeded raised inside the update."""


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[FakeService]:
    """The Tinker service every ServiceClient of this process talks to; the worker reads the test database."""
    fake = FakeService()
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-not-a-key")
    monkeypatch.setenv(DATABASE_ENV, pg_url)
    monkeypatch.setattr(tinker, "ServiceClient", lambda api_key=None, base_url=None, **_: fake)
    monkeypatch.setattr(tinker_client, "_SERVICES", {})
    monkeypatch.setattr(tinker_client, "_GATEWAYS", {})
    yield fake


def tinker_run(pg_url: str, tmp_path: Path, max_recoveries: int = 2) -> tuple[str, RunConfig]:
    """A run of the Tinker example (short lease, 3 outer steps) with version 0 saved on the fake service."""
    config, specs = load_run(REPO / "examples" / "tinker.toml")
    data = config.model_dump(mode="json", exclude_none=True)
    data["run"]["max_outer_steps"] = 3
    data["retries"].update(lease_s=LEASE_S, max_stage_attempts=5)
    data["backends"]["outer"]["max_recoveries"] = max_recoveries
    data["artifacts"]["root"] = str(tmp_path / "artifacts")
    config = RunConfig.model_validate(data)
    return create_run(pg_url, config, specs), config


def batched_step(pg_url: str, run_id: str, step: int) -> int:
    """Outer step `step` (from version step - 1) with one batched group of two rewarded, sampled episodes."""
    before = step - 1
    with session_scope(pg_url) as session:
        outer = OuterStep(
            run_id=run_id, step=step, status=OuterStatus.pending, policy_version_before=before, n_groups=1, n_episodes=2, dispatched_at=utcnow(), metrics={}
        )
        session.add(outer)
        session.flush()
        group = EpisodeGroup(run_id=run_id, task_id="addition", policy_version=before, size=2, status=GroupStatus.batched, outer_step_id=outer.id)
        session.add(group)
        session.flush()
        for index, reward in enumerate((1.0, 0.0)):
            episode = Episode(run_id=run_id, group_id=group.id, index_in_group=index, task_id="addition", policy_version=before, stage=Stage.done)
            session.add(episode)
            session.flush()
            session.add(
                ProbeAttempt(
                    episode_id=episode.id,
                    run_id=run_id,
                    attempt=1,
                    job_toml="",
                    agent_backend="tinker",
                    passed=True,
                    policy_tokens=[11, 12, 13, 20 + index, 30 + index],
                    behaviour_logprobs=[-0.5, -0.7],
                    prompt_length=3,
                )
            )
            session.add(Reward(episode_id=episode.id, run_id=run_id, total=reward, job=reward, validation=1.0, efficiency=0.0, speed=0.0, weights={}))
        return outer.id


def run_outer(step_id: int) -> str:
    """One delivery of the outer task, executed in this process as a worker executes it."""
    from workers.outer import outer_update

    return outer_update(step_id)


def published(pg_url: str, run_id: str) -> list[TinkerPolicyRef]:
    with session_scope(pg_url) as session:
        rows = session.execute(select(PolicyVersion.state_uri).where(PolicyVersion.run_id == run_id).order_by(PolicyVersion.version)).scalars().all()
    return [TinkerPolicyRef.parse(uri) for uri in rows]


def assert_one_step_per_version(service: FakeService, refs: list[TinkerPolicyRef]) -> None:
    """Each published version is one Adam step on the previous published version's saved state."""
    assert [ref.version for ref in refs] == list(range(len(refs)))
    assert [service.origin[ref.state_path] for ref in refs[1:]] == [(earlier.state_path, 1) for earlier in refs[:-1]], (
        "a version carries another number of steps"
    )
    assert [service.saved[ref.sampler_path] for ref in refs] == list(range(len(refs)))


@pytest.mark.parametrize("retry_in", ["same process", "new process"])
@pytest.mark.parametrize(
    ("after", "failure"),
    [
        ("forward_backward", RuntimeError(BLOCKED)),
        ("optim_step", RuntimeError(BLOCKED)),
        ("optim_step", TimeLimit("the update ran out of time")),
        ("save_state", RuntimeError(BLOCKED)),
        ("save_weights_for_sampler", TimeLimit("the update ran out of time")),
    ],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__,
)
def test_a_step_retried_after_a_failure_past_the_optim_step_is_published_with_one_step(
    service: FakeService, pg_url: str, tmp_path: Path, after: str, failure: Exception, retry_in: str
) -> None:
    run_id, _ = tinker_run(pg_url, tmp_path)
    first = batched_step(pg_url, run_id, 1)
    service.fail_after = {after: [failure]}
    with pytest.raises(type(failure)):
        run_outer(first)
    with session_scope(pg_url) as session:
        assert session.get(OuterStep, first).status == OuterStatus.running and session.get(Run, run_id).policy_version == 0
    if retry_in == "new process":
        tinker_client._SERVICES.clear()
        tinker_client._GATEWAYS.clear()
    time.sleep(LEASE_S * 1.5)  # the failed attempt's heartbeat has stopped: its lease runs out
    assert run_outer(first) == "updated"
    assert run_outer(batched_step(pg_url, run_id, 2)) == "updated"
    with session_scope(pg_url) as session:
        steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
        assert [(s.step, s.status, s.takeovers, s.policy_version_after) for s in steps] == [(1, OuterStatus.done, 1, 1), (2, OuterStatus.done, 0, 2)]
        assert session.get(Run, run_id).policy_version == 2
    assert_one_step_per_version(service, published(pg_url, run_id))


def test_transient_errors_past_the_recoveries_are_retried_by_the_worker_from_the_saved_state(
    service: FakeService, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, _ = tinker_run(pg_url, tmp_path, max_recoveries=0)
    monkeypatch.setattr("workers.outer.WORKER_BACKOFF", Backoff(first_s=0.01, max_s=0.01))
    service.fail_after = {"optim_step": [server_failure("optim_step")], "save_state": [server_failure("save_state")]}
    assert run_outer(batched_step(pg_url, run_id, 1)) == "updated"  # two transient failures, each retried by update_with_retries
    assert run_outer(batched_step(pg_url, run_id, 2)) == "updated"
    assert_one_step_per_version(service, published(pg_url, run_id))


def test_an_error_in_the_metrics_after_the_step_is_retried_with_one_step(
    service: FakeService, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, _ = tinker_run(pg_url, tmp_path)
    first = batched_step(pg_url, run_id, 1)
    real, calls = tinker_outer.ratio_metrics, []

    def broken_once(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("Tinker returned logprobs of another length than the datums")
        return real(*args, **kwargs)

    monkeypatch.setattr(tinker_outer, "ratio_metrics", broken_once)
    with pytest.raises(ValueError):
        run_outer(first)
    time.sleep(LEASE_S * 1.5)
    assert run_outer(first) == "updated"
    assert run_outer(batched_step(pg_url, run_id, 2)) == "updated"
    assert_one_step_per_version(service, published(pg_url, run_id))
