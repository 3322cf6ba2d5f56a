"""bench.async_vs_sync and its discrete-event simulation: event queue, exact timings on tiny runs, metrics (no services)."""

from __future__ import annotations

import math

import pytest

from bench._sim_des import (
    EVAL_DONE,
    OUTER_DONE,
    CloudSettings,
    PolicySettings,
    Simulation,
    busy_fraction,
    draw_duration,
    draw_submission,
    per_item,
    pod_usd,
    pop_event,
    push_event,
    record_digest,
    steps_per_hour,
    summarize,
)
from bench.async_vs_sync import load_tasks, outcome, real_probe, scaled_steps
from metarl.backends.sim.config import SimDuration

TASKS = load_tasks()


def fixed(seconds: float) -> SimDuration:
    return SimDuration(median_s=seconds, sigma=0.0, max_s=seconds)


def tiny_cloud(**changes: object) -> CloudSettings:
    """2 pods, groups of 2, one group per batch, 2 steps, fixed durations, nothing invalid or failing."""
    values: dict[str, object] = dict(
        pods=2,
        outer_steps=2,
        group_size=2,
        groups_per_batch=1,
        invalid_rate=0.0,
        gpu_failure_rate=0.0,
        agent=fixed(60),
        probe=fixed(10),
        train=fixed(600),
        eval=fixed(30),
        outer=fixed(60),
        probe_workers=8,
        eval_workers=8,
        usd_per_pod_hour=0.88,
    )
    values.update(changes)
    return CloudSettings(**values)


def always_pass(text: str, task: object) -> bool:
    return True


def test_events_come_out_in_time_order_and_ties_first_in_first_out() -> None:
    queue: list = []
    push_event(queue, 5.0, EVAL_DONE, 1, seq=1)
    push_event(queue, 1.0, EVAL_DONE, 2, seq=2)
    push_event(queue, 5.0, OUTER_DONE, 3, seq=3)
    push_event(queue, 5.0, EVAL_DONE, 4, seq=0)
    assert [pop_event(queue).ref for _ in range(4)] == [2, 4, 1, 3]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_event_times_must_be_finite_and_not_negative(bad: float) -> None:
    with pytest.raises(ValueError):
        push_event([], bad, EVAL_DONE, 1, seq=1)


def test_metrics_math() -> None:
    assert busy_fraction(2400.0, 2, 1520.0) == pytest.approx(2400 / 3040)
    assert steps_per_hour(54, 30 * 3600.0) == pytest.approx(1.8)
    assert pod_usd(3600.0 * 16, 0.88) == pytest.approx(14.08)
    assert per_item(10.0, 4) == 2.5 and math.isnan(per_item(1.0, 0))
    with pytest.raises(ValueError):
        busy_fraction(1.0, 0, 1.0)
    with pytest.raises(ValueError):
        steps_per_hour(1, 0.0)


def test_sync_waits_for_each_batch_and_its_outer_update() -> None:
    record = Simulation(tiny_cloud(), PolicySettings(mode="sync"), TASKS, always_pass).run()
    # per step: agent 60 + probe 10 + train 600 (both jobs in parallel) + eval 30 + outer 60 = 760 s
    assert record.makespan_s == pytest.approx(1520.0)
    assert [(s.created_at, s.done_at) for s in record.steps] == [(700.0, 760.0), (1460.0, 1520.0)]
    metrics = summarize(record, 0.88)
    assert metrics.busy_fraction == pytest.approx(2400 / (2 * 1520))
    assert metrics.jobs_succeeded == 4 and metrics.max_staleness == 0


def test_async_keeps_pods_busy_and_batches_without_waiting() -> None:
    record = Simulation(tiny_cloud(), PolicySettings(mode="async", in_flight=4, max_steps_off_policy=2), TASKS, always_pass).run()
    # both groups open at t=0; jobs 1-2 run 70-670, jobs 3-4 run 670-1270; group 2 evaluated at 1300
    assert [(j.start, j.end) for j in record.jobs] == [(70.0, 670.0), (70.0, 670.0), (670.0, 1270.0), (670.0, 1270.0)]
    assert record.makespan_s == pytest.approx(1360.0)
    assert [s.staleness for s in record.steps] == [(0,), (1,)]
    assert summarize(record, 0.88).busy_fraction == pytest.approx(2400 / (2 * 1360))


def test_a_group_staler_than_the_bound_is_dropped_and_replaced() -> None:
    record = Simulation(tiny_cloud(), PolicySettings(mode="async", in_flight=4, max_steps_off_policy=0), TASKS, always_pass).run()
    assert record.dropped_groups == 1 and record.dropped_gpu_s == pytest.approx(1200.0)
    # the replacement group opens at 1300 with version 1: 60 + 10 + 600 + 30, then the update
    assert record.makespan_s == pytest.approx(1300.0 + 700.0 + 60.0)
    metrics = summarize(record, 0.88)
    assert metrics.jobs_on_gpu == 6 and metrics.jobs_used == 4 and metrics.max_staleness == 0


def test_the_real_probe_keeps_invalid_jobs_off_the_pods() -> None:
    cloud = tiny_cloud(invalid_rate=1.0, max_probe_attempts=2)
    record = Simulation(cloud, PolicySettings(mode="async", in_flight=4), TASKS, real_probe()).run()
    assert record.jobs == [] and record.unvalidated == record.episodes == 4 and record.probe_rejections == 8
    naive = Simulation(cloud.model_copy(update={"invalid_on_gpu": fixed(300)}), PolicySettings(mode="sync-no-probe"), TASKS, real_probe()).run()
    metrics = summarize(naive, 0.88)
    assert metrics.invalid_jobs_on_gpu == metrics.jobs_failed_on_gpu == 4
    assert metrics.invalid_gpu_s == pytest.approx(1200.0) and metrics.invalid_gpu_usd == pytest.approx(1200 / 3600 * 0.88)


def test_generated_invalid_jobs_are_exactly_the_ones_the_probe_rejects() -> None:
    probe = real_probe()
    task = TASKS["addition"]
    submissions = [draw_submission(3, episode, 1, 0.2, episode % 5, task) for episode in range(1, 301)]
    assert 30 <= sum(s.invalid for s in submissions) <= 90
    assert all(probe(s.job_toml, task) is (not s.invalid) for s in submissions)


def test_seeded_runs_are_reproducible_and_share_draws_across_policies() -> None:
    cloud = CloudSettings(pods=4, outer_steps=3, group_size=4, groups_per_batch=2, seed=11)
    policy = PolicySettings(mode="async", in_flight=16)
    first = record_digest(Simulation(cloud, policy, TASKS, real_probe()).run())
    assert first == record_digest(Simulation(cloud, policy, TASKS, real_probe()).run())
    assert first != record_digest(Simulation(cloud.model_copy(update={"seed": 12}), policy, TASKS, real_probe()).run())
    assert draw_duration(cloud.train, 11, "train", 5) == draw_duration(cloud.train, 11, "train", 5)


def test_scale_and_targets() -> None:
    assert scaled_steps(1.0) == 54 and scaled_steps(0.25) == 14 and scaled_steps(0.01) == 2
    with pytest.raises(ValueError):
        scaled_steps(0.0)
    cloud = tiny_cloud(outer_steps=4)
    fast = summarize(Simulation(cloud, PolicySettings(mode="async", in_flight=4), TASKS, always_pass).run(), 0.88)
    slow = summarize(Simulation(cloud, PolicySettings(mode="sync"), TASKS, always_pass).run(), 0.88)
    result = outcome(fast, slow)
    assert result.speedup == pytest.approx(fast.steps_per_hour / slow.steps_per_hour)
    assert result.probe_ok and result.speedup > 1.0
