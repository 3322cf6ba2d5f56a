"""Which trainer process a launch state names, and whether it still runs.

A pid alone can be reused, so a launch state also records the process's start. psutil's start time is wall-clock
(boot time plus ticks since boot), so a step of the system clock (a VM's clock synced after a pause) moves it and a
live trainer looked ended; the start in seconds after boot, with the boot's id, does not move.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil


def process_identity(pid: int) -> dict[str, Any]:
    """What tells a process from a later one with its pid: its start in seconds after boot and the boot's id where
    `/proc` has them (a step of the system clock moves neither), else psutil's wall-clock start time."""
    started = started_after_boot(pid)
    if started is not None:
        return {"started_after_boot_s": started, "boot_id": boot_id()}
    return {"create_time": psutil.Process(pid).create_time()}


def started_after_boot(pid: int) -> float | None:
    """Seconds from boot to the process's start (`/proc/PID/stat`, field 22), None without such a file."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces and parentheses
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def boot_id() -> str | None:
    """This boot's id (`/proc/sys/kernel/random/boot_id`), None where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return None


def same_process(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether two identities (:func:`process_identity`) are one process: boot-relative starts when both have them,
    else wall-clock start times within a second (launch states written before the boot-relative start)."""
    if "started_after_boot_s" in recorded and "started_after_boot_s" in current:
        return (
            recorded.get("boot_id") == current.get("boot_id") and abs(float(recorded["started_after_boot_s"]) - float(current["started_after_boot_s"])) < 0.02
        )
    if "create_time" in recorded:
        return abs(float(recorded["create_time"]) - psutil.Process(int(recorded["pid"])).create_time()) <= 1.0
    return False


def process_alive(state: Mapping[str, Any]) -> bool:
    """True while the trainer process a launch state names (its pid and identity) runs (zombies count as ended)."""
    pid = int(state["pid"])
    try:
        process = psutil.Process(pid)
        if not same_process(state, process_identity(pid)):
            return False
        if process.status() == psutil.STATUS_ZOMBIE:
            os.waitpid(pid, os.WNOHANG)
            return False
        return True
    except (psutil.NoSuchProcess, ChildProcessError):
        return False
