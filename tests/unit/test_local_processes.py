"""Which trainer process a launch state names (`metarl/backends/local/processes.py`): pid reuse and clock steps."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from metarl.backends.local.processes import boot_id, process_alive, process_identity, same_process, started_after_boot

linux_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="boot-relative starts are read from /proc")


@pytest.fixture()
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait(timeout=10)


@linux_proc
def test_the_boot_relative_start_is_psutils_start_less_the_boot_time(sleeper: subprocess.Popen[bytes]) -> None:
    started = started_after_boot(sleeper.pid)
    assert started is not None
    assert abs(started - (psutil.Process(sleeper.pid).create_time() - psutil.boot_time())) < 0.02
    assert started_after_boot(2**22 + 7) is None  # above the kernel's pid limit: no such process


def test_identities_are_one_process_only_on_the_same_boot_at_the_same_start() -> None:
    recorded = {"pid": 10, "started_after_boot_s": 120.5, "boot_id": "b1"}
    assert same_process(recorded, {"started_after_boot_s": 120.5, "boot_id": "b1"})
    assert not same_process(recorded, {"started_after_boot_s": 120.51 + 0.02, "boot_id": "b1"})  # a later process with the pid
    assert not same_process(recorded, {"started_after_boot_s": 120.5, "boot_id": "b2"})  # after a reboot
    assert not same_process({"pid": 10}, {"started_after_boot_s": 120.5, "boot_id": "b1"})


@linux_proc
def test_a_running_trainer_stays_alive_when_the_system_clock_steps(sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"pid": sleeper.pid, **process_identity(sleeper.pid)}
    legacy = {"pid": sleeper.pid, "create_time": psutil.Process(sleeper.pid).create_time()}
    assert state["boot_id"] == boot_id() and process_alive(state) and process_alive(legacy)
    real_boot_time = psutil._pslinux.boot_time()
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real_boot_time + 5.0)  # what a 5 s clock step does to btime
    assert process_alive(state)
    assert not process_alive(legacy)  # the wall-clock record, as launch states had it, takes the live trainer for ended


@linux_proc
def test_an_ended_trainer_or_another_process_with_its_pid_is_not_alive(sleeper: subprocess.Popen[bytes]) -> None:
    state = {"pid": sleeper.pid, **process_identity(sleeper.pid)}
    assert not process_alive({**state, "started_after_boot_s": state["started_after_boot_s"] - 1.0})
    sleeper.kill()
    sleeper.wait(timeout=10)
    assert not process_alive(state)
