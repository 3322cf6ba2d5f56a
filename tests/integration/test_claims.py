"""Claims: one holder at a time, takeover after the lease, continuation by token, done is final."""

from __future__ import annotations

import uuid

import pytest

from metarl.claims import ClaimRefused, claim_stage, finish_claim, heartbeat
from metarl.db import session_scope
from schemas.records import ClaimStatus, Episode, EpisodeGroup, Run, Stage

pytestmark = pytest.mark.integration


def make_episode(url: str) -> tuple[str, int]:
    run_id = str(uuid.uuid4())
    with session_scope(url) as session:
        session.add(Run(id=run_id, name="claims", config={}, task_specs={}))
        session.flush()
        group = EpisodeGroup(run_id=run_id, task_id="addition", policy_version=0, size=1)
        session.add(group)
        session.flush()
        episode = Episode(run_id=run_id, group_id=group.id, index_in_group=0, task_id="addition", policy_version=0)
        session.add(episode)
        session.flush()
        return run_id, episode.id


def claim(url: str, run_id: str, episode_id: int, worker: str, lease_s: float, token: str | None = None):
    with session_scope(url) as session:
        return claim_stage(session, run_id=run_id, episode_id=episode_id, stage=Stage.agent, probe_attempt=1, worker=worker, lease_s=lease_s, token=token)


def test_claim_lifecycle(pg_url):
    run_id, episode_id = make_episode(pg_url)
    first = claim(pg_url, run_id, episode_id, "a", lease_s=60)
    with pytest.raises(ClaimRefused, match="held by a"):
        claim(pg_url, run_id, episode_id, "b", lease_s=60)
    again = claim(pg_url, run_id, episode_id, "a", lease_s=60, token=first.token)
    assert again.takeovers == 0 and again.token != first.token
    stolen = claim(pg_url, run_id, episode_id, "b", lease_s=0)
    assert stolen.takeovers == 1
    with session_scope(pg_url) as session:
        assert not heartbeat(session, again), "the old holder must notice it lost the claim"
        assert not finish_claim(session, again, ClaimStatus.done)
        assert finish_claim(session, stolen, ClaimStatus.done)
    with pytest.raises(ClaimRefused, match="already done"):
        claim(pg_url, run_id, episode_id, "c", lease_s=0)


def test_takeovers_are_counted(pg_url):
    run_id, episode_id = make_episode(pg_url)
    claim(pg_url, run_id, episode_id, "w0", lease_s=60)
    counts = [claim(pg_url, run_id, episode_id, f"w{i}", lease_s=0).takeovers for i in range(1, 5)]
    assert counts == [1, 2, 3, 4]
