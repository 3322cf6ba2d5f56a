"""bench.pipeline_overhead: settings, worker-log parsing, CPU accounting, the run config and the report (no services)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from bench.pipeline_overhead import (
    CHAIN_MODULES,
    CHAIN_TRANSPORT,
    BenchSettings,
    GroupCpu,
    MachineCpu,
    PhaseResult,
    StageProfile,
    TaskStat,
    chain_worker_command,
    cpu_ms_per_episode,
    cpu_ms_per_message,
    expected_tasks,
    group_cpu_s,
    machine_busy_ratio,
    machine_cpu,
    machine_cpu_of,
    merge_stats,
    overhead_ratio,
    pair_ratios,
    parse_worker_log,
    per_stage_ms,
    render,
    run_config_toml,
    stage_of,
    stat_cpu_s,
    validate_settings,
    verdict,
)

REPO = Path(__file__).resolve().parents[2]

LOG = """\
[2026-11-30 01:34:59,101: INFO/MainProcess] Task metarl.stage.train[0f1c2d3e-0000-4000-8000-000000000001] received
[2026-11-30 01:34:59,150: INFO/ForkPoolWorker-1] Task metarl.stage.train[0f1c2d3e-0000-4000-8000-000000000001] retry: Retry in 0.01s
[2026-11-30 01:34:59,170: INFO/MainProcess] Task metarl.stage.train[0f1c2d3e-0000-4000-8000-000000000001] received
[2026-11-30 01:34:59,230: INFO/ForkPoolWorker-1] Task metarl.stage.train[0f1c2d3e-0000-4000-8000-000000000001] succeeded in 0.06s: 'succeeded'
[2026-11-30 01:34:59,240: INFO/MainProcess] Task metarl.outer.update[0f1c2d3e-0000-4000-8000-000000000002] received
[2026-11-30 01:34:59,300: INFO/ForkPoolWorker-1] Task metarl.outer.update[0f1c2d3e-0000-4000-8000-000000000002] succeeded in 1.5e-02s: 'done'
[2026-11-30 01:34:59,301: WARNING/MainProcess] something unrelated
"""


def test_settings_need_whole_batches() -> None:
    assert validate_settings(BenchSettings(episodes=200)) == []
    assert "multiple" in validate_settings(BenchSettings(episodes=20))[0]
    settings = BenchSettings(episodes=200, group_size=4, groups_per_batch=2)
    assert settings.episodes_per_batch == 8 and settings.outer_steps == 25
    with pytest.raises(ValueError):
        BenchSettings(episodes=4)


def test_expected_tasks_counts_five_per_episode_and_one_outer_per_batch() -> None:
    assert expected_tasks(200, 8) == 1025
    assert expected_tasks(40, 8) == 205


def test_parse_worker_log_counts_receipts_retries_and_runtimes() -> None:
    stats = parse_worker_log(LOG)
    train, outer = stats["metarl.stage.train"], stats["metarl.outer.update"]
    assert (train.received, train.retried, train.succeeded, train.runtime_s) == (2, 1, 1, [0.06])
    assert (outer.received, outer.succeeded) == (1, 1) and outer.mean_ms == pytest.approx(15.0)
    merged = merge_stats([stats, stats])
    assert merged["metarl.stage.train"].received == 4 and merged["metarl.stage.train"].runtime_s == [0.06, 0.06]


def test_per_stage_ms_spreads_runtime_over_every_execution() -> None:
    result = PhaseResult(name="ours", episodes=1, outer_steps=1, wall_s=1.0, tasks=3, worker_cpu_s=0.1, driver_cpu_s=0.1, task_stats=parse_worker_log(LOG))
    assert per_stage_ms(result) == pytest.approx({"train": 30.0, "outer": 15.0})


@pytest.mark.parametrize(
    ("name", "stage"),
    [("metarl.stage.agent", "agent"), ("bench.plain.eval", "eval"), ("metarl.outer.update", "outer"), ("bench.plain.outer", "outer")],
)
def test_stage_of(name: str, stage: str) -> None:
    assert stage_of(name) == stage


def test_ratio_and_verdict() -> None:
    assert overhead_ratio(30.0, 20.0) == pytest.approx(1.5) and verdict(1.5) == "meets" and verdict(1.51) == "misses"
    with pytest.raises(ValueError):
        overhead_ratio(0.0, 1.0)


def test_stat_cpu_s_reads_group_and_cpu_from_a_proc_stat_line() -> None:
    line = "4242 (celery (worker) x) S 1 4200 4200 0 -1 4194560 100 0 0 0 250 50 0 0 39 19 2 0 100 0 0"
    assert stat_cpu_s(line, 100.0) == (4200, pytest.approx(3.0))


def test_run_config_is_the_zero_duration_simulator(tmp_path: Path) -> None:
    from metarl.runconfig import load_run

    path = tmp_path / "run.toml"
    path.write_text(run_config_toml(BenchSettings(episodes=40, tick_s=0.05), REPO / "tasks_specs", tmp_path / "artifacts"), encoding="utf-8")
    config, specs = load_run(path)
    assert config.run.max_outer_steps == 5 and config.window.in_flight == 40 and config.window.tick_s == 0.05
    assert config.backends.agent.type == config.backends.train.type == "sim"
    assert config.backends.agent.invalid_rate == 0.0 and config.backends.train.failure_rate == 0.0
    assert config.backends.train.duration.median_s == config.backends.eval.duration.median_s == 0.0
    assert config.outer.max_steps_off_policy >= config.run.max_outer_steps
    assert not any(spec.held_out for spec in specs.values())


@pytest.mark.parametrize("chain", sorted(CHAIN_MODULES))
def test_chain_workers_start_like_ours_with_another_app(chain: str) -> None:
    from metarl.pools import worker_command

    ours, theirs = worker_command("train"), chain_worker_command("train", chain)
    app, node = f"{CHAIN_MODULES[chain]}:app", f"{chain}-train@%h"
    assert theirs[theirs.index("-A") + 1] == app and theirs[theirs.index("-n") + 1] == node
    assert [a for a in theirs if a not in (app, node)] == [a for a in ours if a not in ("workers.app", "train@%h")]


@pytest.mark.parametrize("chain", sorted(CHAIN_MODULES))
def test_chain_train_pool_runs_as_many_processes_as_ours(chain: str) -> None:
    from metarl.pools import worker_command

    ours, theirs = worker_command("train", 3), chain_worker_command("train", chain, 3)
    assert theirs[theirs.index("-c") + 1] == "3" == ours[ours.index("-c") + 1]


def test_train_processes_are_bounded() -> None:
    assert BenchSettings(episodes=200, train_processes=2).train_processes == 2
    with pytest.raises(ValidationError):
        BenchSettings(episodes=200, train_processes=0)


def test_floor_chain_moves_each_episode_through_every_step_once() -> None:
    from bench._sim_floor_chain import STEPS, next_step

    assert [next_step(step) for step in STEPS[:-1]] == list(STEPS[1:])
    with pytest.raises(IndexError):
        next_step(STEPS[-1])


def test_round_trips_and_report() -> None:
    profile = StageProfile(calls=8, statements=9.0, transactions=2.0, checkouts=2.0, wall_ms=70.0, cpu_ms=20.0)
    assert profile.round_trips == 13.0  # statements + BEGIN and COMMIT of each transaction
    settings = BenchSettings(episodes=40)
    plain = PhaseResult(
        name="plain",
        episodes=40,
        outer_steps=5,
        wall_s=2.0,
        tasks=205,
        worker_cpu_s=2.0,
        driver_cpu_s=0.2,
        task_stats={"bench.plain.agent": TaskStat(received=40, succeeded=40, runtime_s=[0.01] * 40)},
    )
    ours = PhaseResult(
        name="ours",
        episodes=40,
        outer_steps=5,
        wall_s=10.0,
        tasks=205,
        worker_cpu_s=8.0,
        driver_cpu_s=3.0,
        postgres_cpu_s=1.0,
        db_commits=2000,
        ticks=100,
        tick_ms_mean=80.0,
        tick_sql=2000,
    )
    text = render(settings, [plain], [ours], {"agent": profile})
    assert "5.00x" in text and "MISSES" in text and "agent" in text
    slower_plain = plain.model_copy(update={"wall_s": 4.0})
    assert pair_ratios([plain, slower_plain], [ours, ours]) == [5.0, 2.5]
    assert "ratio of each pair: 5.00x, 2.50x" in render(settings, [plain, slower_plain], [ours, ours])
    floor = plain.model_copy(update={"name": "floor", "wall_s": 2.5, "postgres_cpu_s": 0.4})
    with_floor = render(settings, [plain], [ours], floor=[floor])
    assert "ratio floor/plain (median wall time): 1.25x" in with_floor and "\nfloor " in with_floor
    assert cpu_ms_per_episode(floor) == pytest.approx(1000 * (2.0 + 0.2 + 0.4) / 40)


def test_cpu_per_message_splits_celery_consumer_from_task_process() -> None:
    plain = PhaseResult(name="plain", episodes=40, outer_steps=5, wall_s=2.0, tasks=200, worker_cpu_s=2.0, consumer_cpu_s=1.5, driver_cpu_s=0.2)
    assert cpu_ms_per_message(plain) == pytest.approx((7.5, 2.5))
    assert cpu_ms_per_message(plain.model_copy(update={"consumer_cpu_s": None})) == (0.0, 0.0)
    assert cpu_ms_per_message(plain.model_copy(update={"tasks": 0})) == (0.0, 0.0)
    ours = plain.model_copy(
        update={
            "name": "ours",
            "worker_cpu_s": 4.0,
            "consumer_cpu_s": 1.6,
            "postgres_cpu_s": 1.0,
            "ticks": 10,
            "tick_ms_mean": 5.0,
            "tick_sql": 50,
            "db_commits": 100,
        }
    )
    assert "plain 7.50 + 2.50 ms, ours 8.00 + 12.00 ms" in render(BenchSettings(episodes=40), [plain], [ours])
    assert "5 worker processes (-c 1)" in render(BenchSettings(episodes=40), [plain], [ours])
    assert "the train pool's -c 2, in every pass" in render(BenchSettings(episodes=40, train_processes=2), [plain], [ours])


def test_group_cpu_counts_this_process_group_and_its_leader() -> None:
    total, leader = group_cpu_s({os.getpgrp()})
    assert total >= leader >= 0.0 and total > 0.0
    assert group_cpu_s(set()) == (0.0, 0.0)
    later = GroupCpu(total=3.5, leaders=1.25)
    assert later.fields_since(GroupCpu(total=1.0, leaders=0.25)) == {"worker_cpu_s": 2.5, "consumer_cpu_s": 1.0}


def test_machine_cpu_reads_busy_idle_and_steal_from_proc_stat() -> None:
    text = "cpu  100 5 40 800 20 3 2 7 0 0\ncpu0 50 2 20 400 10 1 1 3 0 0\nintr 1\n"
    reading = machine_cpu_of(text, ticks_per_s=100.0)
    assert reading == MachineCpu(busy_s=1.5, idle_s=8.2, steal_s=0.07)  # user+nice+system+irq+softirq, idle+iowait, steal
    assert machine_cpu_of("cpu  10 0 10 100\n", 10.0) == MachineCpu(busy_s=2.0, idle_s=10.0, steal_s=0.0)  # an old kernel's short line
    later = MachineCpu(busy_s=4.0, idle_s=9.0, steal_s=0.5)
    between = later.since(reading)
    assert (between.busy_s, between.idle_s, between.steal_s) == (2.5, pytest.approx(0.8), pytest.approx(0.43))
    now = machine_cpu()
    assert now.busy_s > 0.0 and now.idle_s >= 0.0


def test_machine_busy_ratio_uses_medians_and_is_shown_only_with_readings() -> None:
    plain = PhaseResult(name="plain", episodes=40, outer_steps=5, wall_s=2.0, tasks=205, worker_cpu_s=2.0, driver_cpu_s=0.2)
    ours = plain.model_copy(update={"name": "ours", "wall_s": 3.0, "postgres_cpu_s": 1.0, "ticks": 10, "tick_ms_mean": 5.0, "tick_sql": 50, "db_commits": 100})
    settings = BenchSettings(episodes=40)
    assert machine_busy_ratio([plain], [ours]) is None
    assert "machine's busy CPU" not in render(settings, [plain], [ours])
    plains = [plain.model_copy(update={"machine": MachineCpu(busy_s=busy, idle_s=0.5, steal_s=0.0)}) for busy in (4.0, 5.0, 9.0)]
    ourses = [ours.model_copy(update={"machine": MachineCpu(busy_s=busy, idle_s=1.0, steal_s=0.25)}) for busy in (7.0, 8.0, 30.0)]
    assert machine_busy_ratio(plains, ourses) == pytest.approx(8.0 / 5.0)
    text = render(settings, plains, ourses)
    assert "busy CPU (medians; every process, Redis and the kernel included): 1.60x" in text
    assert "0.25" in text.splitlines()[[i for i, line in enumerate(text.splitlines()) if line.startswith("ours")][0]]


def test_the_reuse_pass_is_the_plain_chain_on_our_transport_and_is_reported_beside_it() -> None:
    from bench._sim_plain_chain import CHAIN_TRANSPORT_ENV, chain_app
    from metarl.messaging.redis_broker import ClientReusingRedisTransport

    assert CHAIN_MODULES["reuse"] == CHAIN_MODULES["plain"]
    assert CHAIN_TRANSPORT == {"plain": "stock", "floor": "stock", "reuse": "ours"}
    assert type(chain_app("ours", "redis://127.0.0.1:1/0").connection_for_write().transport) is ClientReusingRedisTransport
    assert type(chain_app("stock", "redis://127.0.0.1:1/0").connection_for_write().transport) is not ClientReusingRedisTransport
    with pytest.raises(SystemExit, match=CHAIN_TRANSPORT_ENV):
        chain_app("fast", "redis://127.0.0.1:1/0")
    settings = BenchSettings(episodes=40)
    plain = PhaseResult(name="plain", episodes=40, outer_steps=5, wall_s=2.0, tasks=205, worker_cpu_s=2.0, driver_cpu_s=0.2)
    reuse = plain.model_copy(update={"name": "reuse", "wall_s": 1.6})
    ours = plain.model_copy(update={"name": "ours", "wall_s": 2.8, "postgres_cpu_s": 0.5, "ticks": 10, "tick_ms_mean": 5.0, "tick_sql": 50, "db_commits": 100})
    text = render(settings, [plain], [ours], reuse=[reuse])
    assert "ratio ours/plain (median wall time): 1.40x  target <= 1.5x: MEETS" in text
    assert "ratio ours/reuse (median wall time): 1.75x; of each pair: 1.75x" in text and "\nreuse " in text
    assert "ours/reuse" not in render(settings, [plain], [ours])
