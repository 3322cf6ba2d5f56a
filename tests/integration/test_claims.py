"""Claims: one holder at a time, takeover after the lease, continuation by token, done is final."""

from __future__ import annotations

import uuid
from functools import partial

import pytest
from sqlalchemy import func, select

from metarl.domain.transitions import Transition
from metarl.store.claims import ClaimRefused, claim_stage, finish_claim, heartbeat
from metarl.store.db import session_scope, sql_transaction
from metarl.store.episodes import StaleTransition, finish_and_move, stage_row_and_claim
from metarl.store.records import ClaimStatus, Episode, EpisodeGroup, GroupStatus, ProbeAttempt, Run, RunStatus, Stage, StageClaim
from metarl.store.stage_records import submission_record
from tests.integration.helpers import new_episode, race

pytestmark = pytest.mark.integration


def make_episode(url: str) -> tuple[str, int]:
    return new_episode(url, name="claims")


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


def row_and_claim(url: str, episode_id: int, worker: str, *, stage: Stage = Stage.agent, attempt: int = 1, token: str | None = None):
    with session_scope(url) as session:
        return stage_row_and_claim(session, episode_id=episode_id, stage=stage, probe_attempt=attempt, worker=worker, token=token)


def test_the_stage_row_statement_claims_only_the_plain_cases(pg_url):
    run_id, episode_id = make_episode(pg_url)
    assert row_and_claim(pg_url, episode_id + 10_000, "a") == (None, None)
    row, elsewhere = row_and_claim(pg_url, episode_id, "a", stage=Stage.probe)
    assert row is not None and row.stage == Stage.agent and elsewhere is None
    assert row_and_claim(pg_url, episode_id, "a", attempt=2)[1] is None
    row, first = row_and_claim(pg_url, episode_id, "a")
    assert row.run_id == run_id and first is not None and first.takeovers == 0
    assert row_and_claim(pg_url, episode_id, "b")[1] is None  # a duplicate: left to the claim rules, which refuse it
    with pytest.raises(ClaimRefused, match="held by a"):
        claim(pg_url, run_id, episode_id, "b", lease_s=60)
    assert row_and_claim(pg_url, episode_id, "b", token="not-the-token")[1] is None
    _, continued = row_and_claim(pg_url, episode_id, "a", token=first.token)
    assert continued is not None and continued.claim_id == first.claim_id and continued.token != first.token and continued.takeovers == 0
    assert row_and_claim(pg_url, episode_id, "a", token=first.token)[1] is None  # the old token was replaced
    with session_scope(pg_url) as session:
        assert finish_claim(session, continued, ClaimStatus.done)
    assert row_and_claim(pg_url, episode_id, "a", token=continued.token)[1] is None  # done is final


def test_no_claim_is_made_for_an_ended_run(pg_url):
    run_id, episode_id = make_episode(pg_url)
    with session_scope(pg_url) as session:
        session.get(Run, run_id).status = RunStatus.stopped
    row, made = row_and_claim(pg_url, episode_id, "a")
    assert row.run_status == RunStatus.stopped and made is None
    with session_scope(pg_url) as session:
        assert session.execute(select(func.count()).select_from(StageClaim).where(StageClaim.episode_id == episode_id)).scalar_one() == 0


def test_finish_and_move_is_one_compare_and_set_of_claim_and_episode(pg_url):
    run_id, episode_id = make_episode(pg_url)
    _, stale_holder = row_and_claim(pg_url, episode_id, "a")
    stolen = claim(pg_url, run_id, episode_id, "b", lease_s=0)
    with session_scope(pg_url) as session:
        assert not finish_and_move(session, stale_holder, ClaimStatus.done, Transition(Stage.probe, 1))
    with session_scope(pg_url) as session:
        assert session.get(Episode, episode_id).stage == Stage.agent  # the taken-over holder moved nothing
        session.get(Episode, episode_id).stage = Stage.probe  # someone else moved it meanwhile
    with pytest.raises(StaleTransition):
        with session_scope(pg_url) as session:
            finish_and_move(session, stolen, ClaimStatus.done, Transition(Stage.probe, 1))
    with session_scope(pg_url) as session:
        assert session.get(StageClaim, stolen.claim_id).status == ClaimStatus.running  # rolled back with the move
        session.get(Episode, episode_id).stage = Stage.agent
    with session_scope(pg_url) as session:
        assert finish_and_move(session, stolen, ClaimStatus.failed, Transition(Stage.failed, 1), episode_error="gave up", claim_error="boom")
    with session_scope(pg_url) as session:
        episode = session.get(Episode, episode_id)
        assert (episode.stage, episode.error, episode.finished_at is not None) == (Stage.failed, "gave up", True)
        assert session.get(StageClaim, stolen.claim_id).error == "boom"
        assert session.get(EpisodeGroup, episode.group_id).status == GroupStatus.complete  # its group of one is complete


def submitted(run_id: str, episode_id: int, job_toml: str):  # type: ignore[no-untyped-def]
    return submission_record(
        episode_id=episode_id,
        run_id=run_id,
        attempt=1,
        job_toml=job_toml,
        workspace_uri=None,
        agent_tokens=7,
        agent_backend="sim",
        policy_tokens=[1, 2],
        behaviour_logprobs=[-0.5, -0.25],
        prompt_length=1,
    )


def attempts(url: str, episode_id: int) -> list[str]:
    with session_scope(url) as session:
        return [a.job_toml for a in session.execute(select(ProbeAttempt).where(ProbeAttempt.episode_id == episode_id)).scalars()]


def test_a_move_in_autocommit_writes_its_records_with_it_or_nothing(pg_url):
    run_id, episode_id = make_episode(pg_url)
    _, stale_holder = row_and_claim(pg_url, episode_id, "a")
    stolen = claim(pg_url, run_id, episode_id, "b", lease_s=0)
    with sql_transaction(pg_url, autocommit=True) as sql:
        assert not finish_and_move(sql, stale_holder, ClaimStatus.done, Transition(Stage.probe, 1), records=[submitted(run_id, episode_id, "stale")])
    assert attempts(pg_url, episode_id) == []  # taken over: no record
    with session_scope(pg_url) as session:
        session.get(Episode, episode_id).stage = Stage.probe  # someone else moved it meanwhile
    with pytest.raises(StaleTransition):
        with sql_transaction(pg_url, autocommit=True) as sql:
            finish_and_move(sql, stolen, ClaimStatus.done, Transition(Stage.probe, 1), records=[submitted(run_id, episode_id, "late")])
    with session_scope(pg_url) as session:
        assert session.get(StageClaim, stolen.claim_id).status == ClaimStatus.running  # nothing was written, in autocommit too
        session.get(Episode, episode_id).stage = Stage.agent
    assert attempts(pg_url, episode_id) == []
    with sql_transaction(pg_url, autocommit=True) as sql:
        assert finish_and_move(sql, stolen, ClaimStatus.done, Transition(Stage.probe, 1), records=[submitted(run_id, episode_id, "kept")])
    assert attempts(pg_url, episode_id) == ["kept"]
    with session_scope(pg_url) as session:
        assert session.get(Episode, episode_id).stage == Stage.probe and session.get(StageClaim, stolen.claim_id).status == ClaimStatus.done
        assert session.execute(select(ProbeAttempt.run_id).where(ProbeAttempt.episode_id == episode_id)).scalar_one() == run_id


def test_an_ending_move_completes_its_group_in_autocommit_and_records_must_agree_with_the_move(pg_url):
    run_id, episode_id = make_episode(pg_url)
    _, held = row_and_claim(pg_url, episode_id, "a")
    with pytest.raises(ValueError, match="episode_id"):
        with sql_transaction(pg_url) as sql:
            finish_and_move(sql, held, ClaimStatus.done, Transition(Stage.probe, 1), records=[submitted(run_id, episode_id + 1, "other episode")])
    with sql_transaction(pg_url, autocommit=True) as sql:
        assert finish_and_move(sql, held, ClaimStatus.failed, Transition(Stage.failed, 1), episode_error="gave up")
    with session_scope(pg_url) as session:
        group = session.get(EpisodeGroup, session.get(Episode, episode_id).group_id)
        assert (group.status, group.ended_episodes) == (GroupStatus.complete, 1)


def make_group(url: str, size: int, held_out: bool = False) -> tuple[str, int, list[int]]:
    run_id = str(uuid.uuid4())
    with session_scope(url) as session:
        session.add(Run(id=run_id, name="claims", config={}, task_specs={}))
        session.flush()
        group = EpisodeGroup(run_id=run_id, task_id="addition", policy_version=0, size=size, held_out=held_out)
        session.add(group)
        session.flush()
        episodes = [Episode(run_id=run_id, group_id=group.id, index_in_group=i, task_id="addition", policy_version=0) for i in range(size)]
        session.add_all(episodes)
        session.flush()
        return run_id, group.id, [episode.id for episode in episodes]


@pytest.mark.parametrize("held_out, final", [(False, GroupStatus.complete), (True, GroupStatus.evaluated)])
def test_episodes_ending_at_once_complete_their_group_once(pg_url, held_out, final):
    import psycopg

    from metarl.store.db import normalise_url
    from metarl.store.tick_wakeup import CHANNEL

    size = 6
    run_id, group_id, episode_ids = make_group(pg_url, size, held_out)
    claims = [row_and_claim(pg_url, episode_id, f"w{index}")[1] for index, episode_id in enumerate(episode_ids)]

    def end(held) -> bool:  # type: ignore[no-untyped-def]
        with sql_transaction(pg_url, autocommit=True) as sql:
            return finish_and_move(sql, held, ClaimStatus.failed, Transition(Stage.failed, 1), episode_error="gave up")

    with psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        moved = race([partial(end, held) for held in claims])
        notices = [note.payload for note in listener.notifies(timeout=1.0, stop_after=size)]
    assert moved == [True] * size, "every episode's move happens"
    assert notices == [run_id], "one tick request, from the move that completed the group"
    with session_scope(pg_url) as session:
        group = session.get(EpisodeGroup, group_id)
        assert (group.status, group.ended_episodes) == (final, size)


@pytest.mark.parametrize("other_writes, moved", [("heartbeat_at = now()", True), ("token = 'taken-over', takeovers = takeovers + 1", False)])
def test_a_move_waiting_on_a_concurrent_claim_update_rechecks_the_claim(pg_url, other_writes, moved):
    import threading

    import psycopg

    from metarl.store.db import normalise_url

    run_id, episode_id = make_episode(pg_url)
    _, held = row_and_claim(pg_url, episode_id, "a")
    outcome: list[object] = []
    with psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg://", "postgresql://")) as other:
        other.execute(f"UPDATE stage_claims SET {other_writes} WHERE id = %s", (held.claim_id,))  # holds the row lock, uncommitted

        def move() -> None:
            with sql_transaction(pg_url, autocommit=True) as sql:
                outcome.append(finish_and_move(sql, held, ClaimStatus.done, Transition(Stage.probe, 1), records=[submitted(run_id, episode_id, "x")]))

        mover = threading.Thread(target=move)
        mover.start()
        mover.join(0.5)
        assert mover.is_alive(), "the move should wait for the other transaction's row lock"
        other.commit()
        mover.join(10)
    assert outcome == [moved]
    assert attempts(pg_url, episode_id) == (["x"] if moved else [])
    with session_scope(pg_url) as session:
        assert session.get(Episode, episode_id).stage == (Stage.probe if moved else Stage.agent)


def test_every_claim_rule_is_one_statement_and_a_takeover_reads_the_last_holders_error(pg_url):
    from metarl.store.db import observing_statements

    run_id, episode_id = make_episode(pg_url)
    first = claim(pg_url, run_id, episode_id, "a", lease_s=60)
    with session_scope(pg_url) as session:
        session.get(StageClaim, first.claim_id).error = "MemoryError: out of memory"
    statements: list[object] = []
    with observing_statements(statements.append):
        with pytest.raises(ClaimRefused, match="held by a"):
            claim(pg_url, run_id, episode_id, "b", lease_s=60)
        assert len(statements) == 1, statements
        stolen = claim(pg_url, run_id, episode_id, "b", lease_s=0)
        assert len(statements) == 2, statements
        continued = claim(pg_url, run_id, episode_id, "b", lease_s=60, token=stolen.token)
        assert len(statements) == 3, statements
    assert (stolen.takeovers, stolen.last_error) == (1, "MemoryError: out of memory")
    assert (continued.claim_id, continued.takeovers) == (stolen.claim_id, 1), "a continuation is not a takeover"
