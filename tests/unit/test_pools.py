"""Worker processes per pool: what `WorkerPools` starts (no process is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metarl.messaging.queues import QUEUES
from metarl.pools import MAX_POOL_PROCESSES, WorkerPools, pool_processes


def processes_flag(command: list[str]) -> str:
    return command[command.index("-c") + 1]


def test_every_pool_gets_one_process_unless_asked() -> None:
    assert pool_processes(QUEUES, None) == {pool: 1 for pool in QUEUES}
    assert pool_processes(QUEUES, {"train": 3}) == {pool: 3 if pool == "train" else 1 for pool in QUEUES}


def test_worker_pools_start_the_asked_processes_per_pool(tmp_path: Path) -> None:
    pools = WorkerPools("postgresql://unused", "redis://unused", tmp_path, concurrency={"train": 2})
    assert processes_flag(pools.command("train")) == "2"
    assert processes_flag(pools.command("agent")) == "1"


def test_a_pool_not_started_here_is_named_with_the_ones_that_are() -> None:
    with pytest.raises(ValueError, match=r"pool\(s\) trian .*use some of probe"):
        pool_processes(("probe",), {"trian": 2})


@pytest.mark.parametrize("count", [0, -1, MAX_POOL_PROCESSES + 1])
def test_a_process_count_out_of_range_names_the_pool_and_the_range(count: int) -> None:
    with pytest.raises(ValueError, match=rf"pool train is {count}: give 1 to {MAX_POOL_PROCESSES}"):
        pool_processes(QUEUES, {"train": count})
