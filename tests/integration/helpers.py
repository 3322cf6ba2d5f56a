"""Helpers for integration tests: fast sim configs; the exactly-once checks live in metarl.store.exactly_once."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from metarl.store.db import session_scope
from metarl.store.exactly_once import assert_exactly_once
from metarl.store.records import Episode, EpisodeGroup, ProbeAttempt, Reward, Run, Stage

__all__ = ["REPO", "assert_exactly_once", "sim_config"]

REPO = Path(__file__).resolve().parents[2]


def sim_config(
    tmp_path: Path,
    *,
    name: str = "itest",
    max_outer_steps: int = 2,
    train_median_s: float = 0.3,
    agent_median_s: float = 0.05,
    eval_median_s: float = 0.05,
    failure_rate: float = 0.05,
    lease_s: float = 3.0,
    redispatch_after_s: float = 3.0,
    in_flight: int = 8,
    held_out_group_size: int | None = None,
    batches_ahead: int | None = None,
    extra: str = "",
) -> Path:
    """Write a fast simulator run config and return its path."""
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""
[run]
name = "{name}"
seed = 7
tasks = ["addition", "reversal", "date_format"]
task_specs_dir = "{REPO / "tasks_specs"}"
max_outer_steps = {max_outer_steps}

[backends.agent]
type = "sim"
duration = {{ median_s = {agent_median_s}, sigma = 0.3, max_s = 5.0 }}

[backends.train]
type = "sim"
duration = {{ median_s = {train_median_s}, sigma = 0.3, max_s = 30.0 }}
failure_rate = {failure_rate}
poll_interval_s = 0.2

[backends.eval]
type = "sim"
duration = {{ median_s = {eval_median_s}, sigma = 0.3, max_s = 5.0 }}

[backends.outer]
type = "sim"
duration = {{ median_s = 0.05, sigma = 0.1, max_s = 1.0 }}

[window]
in_flight = {in_flight}
tick_s = 0.2
{f"batches_ahead = {batches_ahead}" if batches_ahead is not None else ""}

[outer]
group_size = 2
groups_per_batch = 2
{f"held_out_group_size = {held_out_group_size}" if held_out_group_size else ""}

[artifacts]
root = "{tmp_path / "artifacts"}"

[retries]
lease_s = {lease_s}
redispatch_after_s = {redispatch_after_s}
{extra}
"""
    )
    return path


def new_episode(url: str, stage: Stage = Stage.agent, name: str = "test") -> tuple[str, int]:
    """A run with one group of one episode at `stage`, first attempt: (run id, episode id)."""
    run_id = str(uuid.uuid4())
    with session_scope(url) as session:
        session.add(Run(id=run_id, name=name, config={}, task_specs={}))
        session.flush()
        group = EpisodeGroup(run_id=run_id, task_id="addition", policy_version=0, size=1)
        session.add(group)
        session.flush()
        episode = Episode(run_id=run_id, group_id=group.id, index_in_group=0, task_id="addition", policy_version=0, stage=stage, probe_attempt=1)
        session.add(episode)
        session.flush()
        return run_id, episode.id


def finished_episode(url: str, reward_run_id: str | None = None) -> tuple[str, int]:
    """A run with one done episode, one passed attempt and its reward (under `reward_run_id` when given, else the run's own)."""
    run_id, episode_id = new_episode(url, Stage.done, name="run-id-rows")
    with session_scope(url) as session:
        session.add(ProbeAttempt(episode_id=episode_id, run_id=run_id, attempt=1, job_toml="", agent_backend="sim", passed=True))
        session.add(Reward(episode_id=episode_id, run_id=reward_run_id or run_id, total=0.5, job=0.5, validation=1.0, efficiency=0.0, speed=0.0, weights={}))
    return run_id, episode_id


def race(calls: list[Callable[[], object]], timeout_s: float = 30.0) -> list[object]:
    """Run the calls at once, a thread each released together, and return what they returned (in the order they ended).

    A call that raises re-raises here, and one still running after `timeout_s` fails the test, instead of its outcome
    silently missing from the list.
    """
    start = threading.Barrier(len(calls))
    outcomes: list[object] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run(call: Callable[[], object]) -> None:
        start.wait(10)
        try:
            outcome = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread below, re-raised there
            with lock:
                errors.append(err)
            return
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    running = sum(thread.is_alive() for thread in threads)
    if running:
        raise AssertionError(f"{running} of {len(calls)} raced calls still running after {timeout_s:g} s")
    return outcomes
