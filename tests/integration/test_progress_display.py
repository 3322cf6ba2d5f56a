"""The live progress of `metarl run` reads the run's records and, off a terminal, prints a line only when one is due."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from metarl.interfaces import CostItem
from metarl.store.db import session_scope, sql_transaction
from metarl.store.episodes import record_costs
from metarl.store.records import Episode, EpisodeGroup, GroupStatus, InnerJob, InnerJobStatus, OuterStatus, OuterStep, Reward, Run, RunStatus, Stage
from metarl_cli.progress import ProgressDisplay, progress_line
from orchestrator.loop import TickReport
from tests.integration.helpers import new_episode

pytestmark = pytest.mark.integration


def test_the_snapshot_is_the_run_s_records(pg_url: str) -> None:
    run_id, episode_id = new_episode(pg_url, Stage.done)
    with session_scope(pg_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(config={"run": {"max_outer_steps": 3}}))
        session.add(
            Episode(
                run_id=run_id,
                group_id=session.get(Episode, episode_id).group_id,
                index_in_group=1,
                task_id="addition",
                policy_version=0,
                stage=Stage.train,
                probe_attempt=1,
            )
        )
        session.add(
            OuterStep(
                run_id=run_id,
                step=1,
                status=OuterStatus.done,
                policy_version_before=0,
                policy_version_after=1,
                n_groups=1,
                n_episodes=1,
                metrics={"reward_mean": 0.25},
            )
        )
    with sql_transaction(pg_url, autocommit=True) as session:
        record_costs(session, run_id, episode_id, [CostItem(source="sim", description="d", quantity=4, unit="s", unit_price_usd=0.5, key="c1")], simulated=True)
    snap = ProgressDisplay(pg_url, run_id).snapshot()
    assert snap == {
        "status": "running",
        "episodes_done": 1,
        "episodes_total": 2,
        "outer_step": 1,
        "max_outer_steps": 3,
        "reward": 0.25,
        "held_out": None,
        "held_out_version": None,
        "cost_usd": 2.0,
        "train_running": 0,
        "train_waiting": 1,  # the second episode is at train with no inner job
        "slots_held_elsewhere": 0,
    }


def test_the_held_out_figure_is_the_newest_evaluated_version_s_and_names_it(pg_url: str) -> None:
    run_id, _ = new_episode(pg_url, Stage.done)
    with session_scope(pg_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(config={"run": {"max_outer_steps": 3}}))
        for version, status, total in ((0, GroupStatus.evaluated, 0.25), (1, GroupStatus.evaluated, 0.75), (2, GroupStatus.open, 0.0)):
            group = EpisodeGroup(run_id=run_id, task_id="date_format", policy_version=version, size=1, held_out=True, status=status)
            session.add(group)
            session.flush()
            episode = Episode(
                run_id=run_id,
                group_id=group.id,
                index_in_group=0,
                task_id="date_format",
                policy_version=version,
                held_out=True,
                stage=Stage.done,
                probe_attempt=1,
            )
            session.add(episode)
            session.flush()
            session.add(Reward(episode_id=episode.id, run_id=run_id, total=total, job=total, validation=1.0, efficiency=0.0, speed=0.0, weights={}))
    snap = ProgressDisplay(pg_url, run_id).snapshot()
    assert (snap["held_out"], snap["held_out_version"]) == (0.75, 1)  # v2's group is still open
    assert "held-out 0.750 (v1)" in progress_line(snap)


def test_off_a_terminal_a_line_is_printed_at_the_start_every_five_seconds_and_at_the_end(
    pg_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, _ = new_episode(pg_url, Stage.agent)
    with session_scope(pg_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(config={"run": {"max_outer_steps": 2}}))
    display = ProgressDisplay(pg_url, run_id)
    reads: list[float] = []
    clock = [1000.0]
    read_run = display.snapshot

    def counted_snapshot() -> dict[str, object]:
        reads.append(clock[0])
        return read_run()

    monkeypatch.setattr("metarl_cli.progress.time.monotonic", lambda: clock[0])
    monkeypatch.setattr(display, "snapshot", counted_snapshot)
    with display:
        assert display.live is None  # pytest's stderr is not a terminal
        for step in range(12):  # ticks every 0.5 s for 6 s
            clock[0] = 1000.0 + 0.5 * step
            display.update(TickReport())
        clock[0] += 0.1
        display.update(TickReport(finished=True))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    assert reads == [1000.0, 1005.0, 1005.6]
    assert len(lines) == 3 and lines[0] == "[running] episodes 0/1 outer step 0/2 reward - cost $0.0000"


def test_a_run_waiting_for_train_slots_says_so_and_names_the_slots_other_runs_hold(pg_url: str) -> None:
    holder, holder_episode = new_episode(pg_url, Stage.train, name="holder")
    waiter, _ = new_episode(pg_url, Stage.train, name="waiter")
    elsewhere, elsewhere_episode = new_episode(pg_url, Stage.train, name="another-backend")
    with session_scope(pg_url) as session:
        for run_id, backend in ((holder, "local"), (waiter, "local"), (elsewhere, "sim")):
            config = {"run": {"max_outer_steps": 3}, "backends": {"train": {"type": backend}}}
            session.execute(update(Run).where(Run.id == run_id).values(config=config))
        session.add(InnerJob(run_id=holder, episode_id=holder_episode, name=f"job-{holder_episode}", backend="local", status=InnerJobStatus.running))
        session.add(InnerJob(run_id=elsewhere, episode_id=elsewhere_episode, name=f"job-{elsewhere_episode}", backend="sim", status=InnerJobStatus.running))
    waiting = ProgressDisplay(pg_url, waiter).snapshot()
    assert (waiting["train_running"], waiting["train_waiting"], waiting["slots_held_elsewhere"]) == (0, 1, 1)
    assert (
        progress_line(waiting)
        == "[running] episodes 0/1 outer step 0/3 reward - train 0 training, 1 waiting for a slot (1 slot held by other runs) cost $0.0000"
    )
    holding = ProgressDisplay(pg_url, holder).snapshot()
    assert (holding["train_running"], holding["train_waiting"]) == (1, 0)
    assert " train " not in progress_line(holding)  # nothing waits: the line stays as it was
    with session_scope(pg_url) as session:
        session.execute(update(Run).where(Run.id == holder).values(status=RunStatus.interrupted))
    after = ProgressDisplay(pg_url, waiter).snapshot()
    assert after["slots_held_elsewhere"] == 0  # an interrupted run's left-over job that nobody polls holds no slot (migration 0015)
    assert progress_line(after).endswith("train 0 training, 1 waiting for a slot cost $0.0000")
