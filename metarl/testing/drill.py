"""A run under test: simulator configs, worker pools and an orchestrator as separate processes, and crash tools.

Used by the fault campaign (tests/integration/test_faults.py) and the benchmarks (bench.resume,
bench.scale). Every process is started in its own process group so it can be killed with -9
together with its children (Celery pool processes), as a crash would. What the drills read of the
run's records is in `metarl.store.run_reads`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from metarl.pools import WorkerPools, signal_group, stop_process_group
from metarl.settings import BROKER_ENV, DATABASE_ENV

REPO = Path(__file__).resolve().parents[2]
TASK_SPECS = REPO / "tasks_specs"


def sim_run_config(
    path: Path,
    *,
    artifacts_root: Path,
    name: str = "drill",
    seed: int = 7,
    tasks: tuple[str, ...] = ("addition", "reversal", "date_format"),
    max_outer_steps: int = 2,
    agent_s: float = 0.05,
    train_s: float = 0.3,
    eval_s: float = 0.05,
    outer_s: float = 0.05,
    max_s: float = 30.0,
    failure_rate: float = 0.05,
    invalid_rate: float = 0.3,
    agent_usd_per_million_tokens: float = 0.0,
    poll_interval_s: float = 0.2,
    max_concurrent_jobs: int = 16,
    in_flight: int = 8,
    tick_s: float = 0.2,
    group_size: int = 2,
    groups_per_batch: int = 2,
    max_steps_off_policy: int = 2,
    lease_s: float = 3.0,
    redispatch_after_s: float = 3.0,
    max_stage_attempts: int = 3,
    max_run_usd: float = 100.0,
    eval_deadline_s: float | None = None,
    train_deadline_s: float | None = None,
) -> Path:
    """Write a simulator run config (every backend `sim`) to `path` and return it."""
    limits = {"eval_s": eval_deadline_s, "train_s": train_deadline_s}
    deadline_lines = "".join(f"{key} = {value}\n" for key, value in limits.items() if value is not None)
    deadlines = f"\n[deadlines]\n{deadline_lines}" if deadline_lines else ""
    task_list = ", ".join(f'"{task}"' for task in tasks)
    path.write_text(
        f"""# SIMULATOR run for fault drills and benchmarks (metarl.testing.drill)
[run]
name = "{name}"
seed = {seed}
tasks = [{task_list}]
task_specs_dir = "{TASK_SPECS}"
max_outer_steps = {max_outer_steps}

[backends.agent]
type = "sim"
duration = {{ median_s = {agent_s}, sigma = 0.3, max_s = {max_s} }}
invalid_rate = {invalid_rate}
usd_per_million_tokens = {agent_usd_per_million_tokens}

[backends.train]
type = "sim"
duration = {{ median_s = {train_s}, sigma = 0.3, max_s = {max_s} }}
failure_rate = {failure_rate}
poll_interval_s = {poll_interval_s}
max_concurrent_jobs = {max_concurrent_jobs}

[backends.eval]
type = "sim"
duration = {{ median_s = {eval_s}, sigma = 0.3, max_s = {max_s} }}

[backends.outer]
type = "sim"
duration = {{ median_s = {outer_s}, sigma = 0.1, max_s = {max_s} }}

[window]
in_flight = {in_flight}
tick_s = {tick_s}

[outer]
group_size = {group_size}
groups_per_batch = {groups_per_batch}
max_steps_off_policy = {max_steps_off_policy}

[artifacts]
root = "{artifacts_root}"

[retries]
lease_s = {lease_s}
redispatch_after_s = {redispatch_after_s}
max_stage_attempts = {max_stage_attempts}

[budget]
max_run_usd = {max_run_usd}
{deadlines}""",
        encoding="utf-8",
    )
    return path


def service_env(database_url: str, broker_url: str, **extra: str) -> dict[str, str]:
    """This process's environment pointed at a database and a broker."""
    env = dict(os.environ)
    env[DATABASE_ENV] = database_url
    env[BROKER_ENV] = broker_url
    env.setdefault("PYTHONPATH", str(REPO))
    env.update(extra)
    return env


def start_orchestrator(args: list[str], env: dict[str, str], log_path: Path | None = None) -> subprocess.Popen[str]:
    """`metarl run|resume ... --no-workers --quiet` in its own process group; stdout is a pipe unless `log_path`."""
    command = [sys.executable, "-m", "metarl_cli.main", *args, "--no-workers", "--quiet"]
    if log_path is None:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    with open(log_path, "a", encoding="utf-8") as log:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read_run_id(orchestrator: subprocess.Popen[str], timeout_s: float = 120.0) -> str:
    """The run id from the first line `metarl run` prints (`run <id> (<name>) created; ...`)."""
    assert orchestrator.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = orchestrator.stdout.readline()
        if line.startswith("run "):
            return line.split()[1]
        if not line and orchestrator.poll() is not None:
            raise RuntimeError(f"the orchestrator exited with {orchestrator.returncode} before creating the run")
    raise RuntimeError("the orchestrator did not print a run id in time")


def kill_group(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """kill -9 a process group we started, and reap its leader."""
    signal_group(process.pid, 9)
    process.wait()


def kill_everything(pools: WorkerPools, orchestrators: list[subprocess.Popen[str]]) -> None:
    """kill -9 every orchestrator and every worker pool (with its pool processes), at once."""
    for orchestrator in orchestrators:
        if orchestrator.poll() is None:
            signal_group(orchestrator.pid, 9)
    pools.kill_all()
    for orchestrator in orchestrators:
        orchestrator.wait()


def stop_quietly(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM then SIGKILL each process group still alive (cleanup)."""
    for process in processes:
        if process.poll() is None:
            stop_process_group(process, timeout_s=10)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Poll `predicate` until true and return the seconds it took; AssertionError naming `what` after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
