"""A stage message's claim as the workers call it (`metarl.store.stage_work.claim_stage_work`), and the Runpod backend's
view of the run database (`metarl.store.runpod_runs`)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import update

from metarl.interfaces import CostItem
from metarl.runconfig import load_run
from metarl.store.claims import utcnow
from metarl.store.db import observing_statements, session_scope, sql_transaction
from metarl.store.episodes import open_groups
from metarl.store.records import Episode, InnerJob, InnerJobStatus, Run, RunStatus, Stage, StageClaim
from metarl.store.runpod_runs import RunpodRunStore
from metarl.store.stage_work import ClaimReads, StageClaimed, StageSkipped, StageWork, claim_stage_work
from orchestrator.loop import create_run
from tests.integration.helpers import sim_config

pytestmark = pytest.mark.integration


def sim_run(url: str, tmp_path, lease_s: float = 60.0) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """A sim run with one episode at the agent stage: (run id, episode id)."""
    config, specs = load_run(sim_config(tmp_path, name="stagework", lease_s=lease_s))
    run_id = create_run(url, config, specs)
    with sql_transaction(url) as sql:
        (episode_id,) = open_groups(sql, run_id=run_id, task_ids=["addition"], policy_version=0, size=1, held_out=False, now=utcnow())
    return run_id, episode_id


def test_a_stage_claims_in_one_statement_the_claim_rules_in_one_more_and_a_takeover_carries_the_last_error(pg_url, tmp_path):
    run_id, episode_id = sim_run(pg_url, tmp_path)
    loaded: list[StageClaimed] = []

    def work(worker: str, token: str | None = None, episode: int = episode_id):  # type: ignore[no-untyped-def]
        return claim_stage_work(
            pg_url,
            stage=Stage.agent,
            episode_id=episode,
            probe_attempt=1,
            token=token,
            worker=worker,
            load=lambda reads, claimed: loaded.append(claimed) or "read",
        )

    first = work("a")
    assert isinstance(first, StageWork) and first.loaded == "read" and loaded == [first.claimed]
    assert (first.claimed.claim.takeovers, first.claimed.ctx.run_id, first.claimed.ctx.episode_id, first.claimed.task.id) == (0, run_id, episode_id, "addition")
    statements: list[object] = []
    with observing_statements(statements.append):
        refused = work("b")
    assert refused == StageSkipped(f"stage agent of episode {episode_id} is held by a")
    assert len(statements) == 2, "the stage row with its plain claim, then the claim rules (the run's config is known)"
    assert len(loaded) == 1, "a refused claim loads nothing"

    with session_scope(pg_url) as session:
        session.execute(
            update(StageClaim).where(StageClaim.id == first.claimed.claim.claim_id).values(heartbeat_at=utcnow() - dt.timedelta(hours=1), error="Killed: 9")
        )
    statements.clear()
    with observing_statements(statements.append):
        taken = work("c")
    assert isinstance(taken, StageWork) and len(statements) == 2
    assert (taken.claimed.claim.takeovers, taken.claimed.claim.last_error) == (1, "Killed: 9")
    assert isinstance(work("a", token=first.claimed.claim.token), StageSkipped), "the old holder's continuation is refused"
    continued = work("c", token=taken.claimed.claim.token)
    assert isinstance(continued, StageWork) and continued.claimed.claim.takeovers == 1

    assert work("x", episode=episode_id + 10_000) == StageSkipped("no such episode")
    with session_scope(pg_url) as session:
        session.get(Run, run_id).status = RunStatus.stopping
    assert isinstance(work("c", token=continued.claimed.claim.token), StageWork), "a stopping run still finishes its stages"
    with session_scope(pg_url) as session:
        session.get(Run, run_id).status = RunStatus.stopped
    assert work("d") == StageSkipped("its run is stopped")
    with session_scope(pg_url) as session:
        session.get(Episode, episode_id).stage = Stage.probe
    assert work("d") == StageSkipped("episode is elsewhere (probe, attempt 1)")


def test_a_loader_reads_on_the_claims_connection(pg_url, tmp_path):
    from metarl import composition as registry

    _, episode_id = sim_run(pg_url, tmp_path)
    seen: list[object] = []

    def load(reads: ClaimReads, claimed: StageClaimed) -> str:
        key = registry.base_score_key(claimed.config, claimed.task, "tiny-never-scored")
        statements: list[object] = []
        with observing_statements(statements.append):
            seen.append(reads.cached_base_score(key))
        seen.append(len(statements))
        return claimed.config.run.name

    outcome = claim_stage_work(pg_url, stage=Stage.agent, episode_id=episode_id, probe_attempt=1, token=None, worker="a", load=load)
    assert isinstance(outcome, StageWork) and outcome.loaded == "stagework" and seen == [None, 1]


def test_the_runpod_view_of_the_run_database(pg_url, tmp_path):
    run_id, episode_id = sim_run(pg_url, tmp_path)
    runs = RunpodRunStore(pg_url)
    charge = CostItem(source="runpod", description="pod seconds", quantity=10.0, unit="second", unit_price_usd=0.001, key=f"runpod:pod-1:{run_id}")
    runs.record_costs(run_id, episode_id, [charge])
    runs.record_costs(run_id, episode_id, [charge])  # the same interval billed again: kept once
    assert runs.run_total_usd(run_id) == pytest.approx(0.01)
    state = runs.run_state(run_id)
    assert state is not None and (state.status, state.stop_requested) == (RunStatus.running, False)
    assert runs.run_state("no-such-run") is None

    with session_scope(pg_url) as session:
        session.get(Episode, episode_id).stage = Stage.train
        session.add(InnerJob(run_id=run_id, episode_id=episode_id, name=f"metarl-{run_id[:8]}-{episode_id}", backend="runpod", status=InnerJobStatus.running))
    view = runs.reap_view(run_id[:8])
    assert view is not None and (view.run_id, view.status, view.live_jobs) == (run_id, RunStatus.running, frozenset({f"metarl-{run_id[:8]}-{episode_id}"}))
    assert view.config.run.name == "stagework"
    assert runs.reap_view("ffffffff-not-a-run") is None

    key = 0x5EED
    held, waited = threading.Event(), threading.Event()
    release = threading.Event()

    def holder() -> None:
        with runs.holding_lock(key):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    with runs.trying_lock(key) as got:
        assert not got, "a second process got a held lock"
    release.set()
    thread.join(10)
    with runs.trying_lock(key) as got:
        assert got
        waited.set()
    assert waited.is_set()
