"""The train submit's inner-job creation: one statement under the backend's lock, a tick that does not hold up stage inserts,
and the slot a train stage that gives up gives back."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from sqlalchemy import func, select, text

from metarl.domain.transitions import Transition
from metarl.store.db import session_scope, sql_transaction
from metarl.store.episodes import finish_and_move, stage_row_and_claim
from metarl.store.inner_jobs import create_within_limits, lost_record
from metarl.store.progress import train_slots
from metarl.store.records import RUN_ROW_LOCK, ClaimStatus, CostEntry, Episode, EpisodeGroup, InnerJob, InnerJobStatus, Run, RunStatus, Stage
from tests.integration.helpers import race

pytestmark = pytest.mark.integration


def make_run(url: str, episodes: int, config: dict[str, Any] | None = None) -> tuple[str, list[int]]:
    """A run with one group of `episodes` episodes at the train stage."""
    run_id = str(uuid.uuid4())
    with session_scope(url) as session:
        session.add(Run(id=run_id, name="limits", config=config or {}, task_specs={}))
        session.flush()
        group = EpisodeGroup(run_id=run_id, task_id="addition", policy_version=0, size=episodes)
        session.add(group)
        session.flush()
        rows = [Episode(run_id=run_id, group_id=group.id, index_in_group=i, task_id="addition", policy_version=0, stage=Stage.train) for i in range(episodes)]
        session.add_all(rows)
        session.flush()
        return run_id, [row.id for row in rows]


def create(url: str, run_id: str, episode_id: int, *, capacity: int, max_usd: float = 100.0, backend: str = "sim"):  # type: ignore[no-untyped-def]
    with sql_transaction(url, autocommit=True) as sql:
        return create_within_limits(
            sql,
            run_id=run_id,
            episode_id=episode_id,
            name=f"job-{episode_id}",
            backend=backend,
            simulated=True,
            model_name="tiny",
            max_usd=max_usd,
            capacity=capacity,
        )


def test_capacity_is_per_backend_across_runs(pg_url):
    run_a, (a1, a2) = make_run(pg_url, 2)
    run_b, (b1, b2) = make_run(pg_url, 2)
    first = create(pg_url, run_a, a1, capacity=2)
    assert not isinstance(first, str) and first.status == InnerJobStatus.launching and first.external_id is None
    assert not isinstance(create(pg_url, run_b, b1, capacity=2), str)
    assert create(pg_url, run_a, a2, capacity=2) == "capacity", "the other run's job holds the backend's second slot"
    assert not isinstance(create(pg_url, run_b, b2, capacity=2, backend="local"), str), "another backend has slots of its own"
    with session_scope(pg_url) as session:
        session.execute(InnerJob.__table__.update().where(InnerJob.episode_id == a1).values(status=InnerJobStatus.succeeded))
    assert not isinstance(create(pg_url, run_a, a2, capacity=2), str), "a finished job frees its slot"


def set_run_status(url: str, run_id: str, status: RunStatus) -> None:
    with session_scope(url) as session:
        session.execute(Run.__table__.update().where(Run.id == run_id).values(status=status))


@pytest.mark.parametrize("status", [RunStatus.interrupted, RunStatus.paused, RunStatus.stopped, RunStatus.failed, RunStatus.finished])
def test_an_interrupted_or_ended_runs_left_over_job_holds_no_slot_until_it_is_resumed(pg_url, status):
    backend = f"local-{status.value}-{uuid.uuid4().hex[:6]}"
    old, (held,) = make_run(pg_url, 1)
    new, (first, second) = make_run(pg_url, 2)
    assert not isinstance(create(pg_url, old, held, capacity=1, backend=backend), str)
    assert create(pg_url, new, first, capacity=1, backend=backend) == "capacity", "a live run's job holds the slot"
    set_run_status(pg_url, old, status)
    assert not isinstance(create(pg_url, new, first, capacity=1, backend=backend), str), f"a job of a run left {status.value} held the slot"
    assert create(pg_url, new, second, capacity=1, backend=backend) == "capacity", "the new run's own job counts"
    with session_scope(pg_url) as session:
        session.execute(InnerJob.__table__.update().where(InnerJob.episode_id == first).values(status=InnerJobStatus.succeeded))
    set_run_status(pg_url, old, RunStatus.running)
    assert create(pg_url, new, second, capacity=1, backend=backend) == "capacity", "the resumed run's job counts again"


def age_train_heartbeat(url: str, episode_id: int, seconds: float) -> None:
    with session_scope(url) as session:
        session.execute(
            text("UPDATE stage_claims SET heartbeat_at = now() - make_interval(secs => :age) WHERE episode_id = :episode AND stage = 'train'"),
            {"age": seconds, "episode": episode_id},
        )


def slots_held_elsewhere(url: str, run_id: str) -> int:
    with session_scope(url) as session:
        run = session.get(Run, run_id)
        assert run is not None
        return train_slots(session, run, waiting=1)[1]


def test_an_interrupted_runs_job_that_a_worker_still_polls_holds_its_slot_until_the_polls_stop(pg_url):
    """Pools on other hosts go on polling an interrupted run's pod: it holds its slot while its train claim's heartbeat is younger
    than the run's lease plus its poll interval (30 + 5 s here), and frees it once older (migration 0015)."""
    backend = f"runpod-{uuid.uuid4().hex[:6]}"
    old, (polled,) = make_run(pg_url, 1, {"retries": {"lease_s": 30.0}, "backends": {"train": {"type": backend, "poll_interval_s": 5.0}}})
    new, (first,) = make_run(pg_url, 1, {"backends": {"train": {"type": backend}}})
    with sql_transaction(pg_url, autocommit=True) as sql:
        _, claim = stage_row_and_claim(sql, episode_id=polled, stage=Stage.train, probe_attempt=1, worker="w", token=None)
    assert claim is not None and not isinstance(create(pg_url, old, polled, capacity=1, backend=backend), str)
    set_run_status(pg_url, old, RunStatus.interrupted)
    assert create(pg_url, new, first, capacity=1, backend=backend) == "capacity", "a worker polls the interrupted run's job"
    assert slots_held_elsewhere(pg_url, new) == 1
    age_train_heartbeat(pg_url, polled, 33.0)
    assert create(pg_url, new, first, capacity=1, backend=backend) == "capacity", "a poll interval late is not yet stale"
    age_train_heartbeat(pg_url, polled, 40.0)
    assert slots_held_elsewhere(pg_url, new) == 0
    assert not isinstance(create(pg_url, new, first, capacity=1, backend=backend), str), "nobody polls it any more: the slot is free"


def test_budget_is_checked_before_capacity(pg_url):
    run_id, (first, second) = make_run(pg_url, 2)
    assert not isinstance(create(pg_url, run_id, first, capacity=1, max_usd=1.0), str)
    with session_scope(pg_url) as session:
        session.add(
            CostEntry(
                run_id=run_id,
                source="pod",
                description="pod time",
                quantity=1.0,
                unit="h",
                unit_price_usd=1.5,
                amount_usd=1.5,
                simulated=True,
                idempotency_key="k1",
            )
        )
    assert create(pg_url, run_id, second, capacity=1, max_usd=1.0) == "budget"
    assert create(pg_url, run_id, second, capacity=1, max_usd=2.0) == "capacity"


def test_concurrent_creations_never_pass_the_capacity(pg_url):
    runs = [make_run(pg_url, 6) for _ in range(2)]
    outcomes = race([partial(create, pg_url, run_id, episode_id, capacity=3) for run_id, ids in runs for episode_id in ids])
    assert len(outcomes) == 12
    assert sum(not isinstance(outcome, str) for outcome in outcomes) == 3
    assert outcomes.count("capacity") == 9
    with session_scope(pg_url) as session:
        assert session.execute(select(func.count()).select_from(InnerJob)).scalar_one() == 3


def test_a_tick_holding_its_run_row_does_not_hold_up_a_stage_claim(pg_url):
    run_id, (episode_id,) = make_run(pg_url, 1)
    claimed = threading.Event()

    def claim() -> None:
        with sql_transaction(pg_url, autocommit=True) as sql:
            stage_row_and_claim(sql, episode_id=episode_id, stage=Stage.train, probe_attempt=1, worker="w", token=None)
        claimed.set()

    with session_scope(pg_url) as tick:
        tick.get(Run, run_id, with_for_update=RUN_ROW_LOCK)  # held until the tick's transaction ends
        claimer = threading.Thread(target=claim)
        claimer.start()
        assert claimed.wait(5), "the claim's insert (a foreign key to the run) waited for the tick's row lock"
    claimer.join(5)


def test_a_train_stage_that_gives_up_frees_its_slot_with_its_move(pg_url):
    run_id, (first, second) = make_run(pg_url, 2)
    with sql_transaction(pg_url, autocommit=True) as sql:
        _, claim = stage_row_and_claim(sql, episode_id=first, stage=Stage.train, probe_attempt=1, worker="w", token=None)
    assert claim is not None and not isinstance(create(pg_url, run_id, first, capacity=1), str)
    assert create(pg_url, run_id, second, capacity=1) == "capacity"
    lost = lost_record(first, "abandoned: gave up")
    stolen = replace(claim, token="not-the-token")
    with sql_transaction(pg_url, autocommit=True) as sql:
        assert not finish_and_move(sql, stolen, ClaimStatus.failed, Transition(Stage.failed, 1), records=[lost])
    assert create(pg_url, run_id, second, capacity=1) == "capacity", "a refused move writes no lost record"
    with sql_transaction(pg_url, autocommit=True) as sql:
        assert finish_and_move(sql, claim, ClaimStatus.failed, Transition(Stage.failed, 1), episode_error="gave up", records=[lost])
    with session_scope(pg_url) as session:
        job = session.execute(select(InnerJob).where(InnerJob.episode_id == first)).scalar_one()
        assert (job.status, job.error) == (InnerJobStatus.lost, "abandoned: gave up") and job.finished_at is not None
    assert not isinstance(create(pg_url, run_id, second, capacity=1), str), "the lost job no longer holds the slot"
    with session_scope(pg_url) as session:
        session.execute(InnerJob.__table__.update().where(InnerJob.episode_id == second).values(status=InnerJobStatus.succeeded))
    with sql_transaction(pg_url, autocommit=True) as sql:
        _, claim = stage_row_and_claim(sql, episode_id=second, stage=Stage.train, probe_attempt=1, worker="w", token=None)
        assert finish_and_move(sql, claim, ClaimStatus.failed, Transition(Stage.failed, 1), records=[lost_record(second, "abandoned")])
    with session_scope(pg_url) as session:
        assert session.execute(select(InnerJob.status).where(InnerJob.episode_id == second)).scalar_one() == InnerJobStatus.succeeded, (
            "an ended job keeps its outcome"
        )
