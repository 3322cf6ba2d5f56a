"""Resume benchmark: `kill -9` of everything mid-run, restart, and the exactly-once checks, at random kill points.

    python -m bench.resume [--repeats 20] [--seed 0] [--outer-steps 2] [--down-s 0]

Each repeat starts a simulator run (every backend `sim`: simulated agent, cloud, scorer and outer
update, with real Celery worker pools, a real Redis broker and a real PostgreSQL database) with the
timing of examples/sim.toml (lease and re-dispatch after 10 s, 8 episodes in flight). At a seeded
random point, after k stage transitions (k uniform in [2, 40]) plus a random fraction of a second,
it sends SIGKILL to the orchestrator and to all five worker pools (each pool's whole process group)
at once, waits `--down-s`, then restarts the five pools and `metarl resume RUN_ID`. It measures
the time from that restart to the first new stage transition (the first stage claim closed after
the restart: the claim, the episode's move and its result are one transaction), lets the run
finish, and runs the foundation's exactly-once checks (metarl.store.exactly_once) on its
records, the simulated cloud's launch records included.

Target: first transition under 10 s after the restart; every repeat passes the exactly-once checks.
Redis and PostgreSQL are private servers on free ports (metarl.testing.services), started here and
removed at the end; the shared ones are not touched.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from metarl.pools import WorkerPools
from metarl.store import closed_claims, dispose_engines, first_transition_after, in_flight, run_outcome, upgrade_database
from metarl.testing.drill import (
    kill_everything,
    read_run_id,
    service_env,
    sim_run_config,
    start_orchestrator,
    stop_quietly,
    wait_until,
)
from metarl.testing.services import PrivatePostgres, PrivateRedis
from schemas.states import RunStatus

TARGET_S = 10.0


@dataclass
class Repeat:
    """What one kill-and-resume repeat measured."""

    index: int
    kill_after_transitions: int
    in_flight_at_kill: dict[str, int]
    held_claims_at_kill: int
    restart_to_transition_s: float | None
    restart_to_pools_ready_s: float | None
    run_status: str
    episodes: int
    takeovers: int
    violations: list[str]
    wall_s: float


def pools_ready_at(log_dir: Path, offsets: dict[str, int]) -> dt.datetime | None:
    """When the last of the five restarted pools logged `ready.` (local time), reading each log from its offset."""
    times = []
    for pool, offset in offsets.items():
        with open(log_dir / f"worker-{pool}.log", "rb") as log:
            log.seek(offset)
            for line in log.read().decode("utf-8", "replace").splitlines():
                if line.endswith(" ready.") and line.startswith("["):
                    times.append(dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f"))
                    break
            else:
                return None
    return max(times) if times else None


def one_repeat(index: int, rng: random.Random, url: str, redis: PrivateRedis, work: Path, args: argparse.Namespace) -> Repeat:
    """One run: start, kill -9 everything at a random point, restart, finish, check."""
    import redis as redis_client

    started = time.monotonic()
    broker = redis.url(0)
    client = redis_client.Redis.from_url(broker)
    client.flushdb()
    client.close()
    artifacts = work / f"repeat-{index}" / "artifacts"
    artifacts.mkdir(parents=True)
    config = sim_run_config(
        work / f"repeat-{index}" / "run.toml",
        artifacts_root=artifacts,
        name=f"resume-{index}",
        seed=index,
        tasks=("addition", "reversal", "caesar", "max_of_list", "sorting", "date_format"),
        max_outer_steps=args.outer_steps,
        agent_s=0.1,
        train_s=0.5,
        eval_s=0.1,
        outer_s=0.1,
        max_s=5.0,
        in_flight=8,
        tick_s=0.3,
        group_size=4,
        groups_per_batch=2,
        lease_s=10.0,
        redispatch_after_s=10.0,
    )
    env = service_env(url, broker)
    pools = WorkerPools(url, broker, work / f"repeat-{index}" / "logs")
    processes = []
    try:
        pools.start()
        orchestrator = start_orchestrator(["run", str(config)], env)
        processes.append(orchestrator)
        run_id = read_run_id(orchestrator)
        kill_after = rng.randint(2, 40)
        wait_until(lambda: closed_claims(url, run_id) >= kill_after or orchestrator.poll() is not None, 300, f"{kill_after} stage transitions", 0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        kill_everything(pools, [orchestrator])
        at_kill = in_flight(url, run_id)
        time.sleep(args.down_s)
        log_dir = work / f"repeat-{index}" / "logs"
        offsets = {pool: (log_dir / f"worker-{pool}.log").stat().st_size for pool in pools.pools}
        restart_local = dt.datetime.now()
        restart = dt.datetime.now(dt.UTC)
        restart_clock = time.monotonic()
        pools.start()
        resumed = start_orchestrator(["resume", run_id], env, log_path=work / f"repeat-{index}" / "logs" / "resume.log")
        processes.append(resumed)
        transition: dt.datetime | None = None
        while time.monotonic() - restart_clock < 120 and transition is None:
            transition = first_transition_after(url, run_id, restart)
            if transition is None:
                time.sleep(0.05)
        resumed.wait(timeout=600)
        ready = pools_ready_at(log_dir, offsets)
        outcome = run_outcome(url, run_id, artifacts)
        violations = outcome.violations
        if outcome.status != RunStatus.finished.value:
            violations.insert(0, f"the run ended {outcome.status}, not finished")
    finally:
        pools.stop()
        stop_quietly(processes)
    return Repeat(
        index=index,
        kill_after_transitions=kill_after,
        in_flight_at_kill=at_kill.episodes_by_stage,
        held_claims_at_kill=at_kill.held_claims,
        restart_to_transition_s=None if transition is None else (transition - restart).total_seconds(),
        restart_to_pools_ready_s=None if ready is None else (ready - restart_local).total_seconds(),
        run_status=outcome.status,
        episodes=outcome.episodes,
        takeovers=outcome.takeovers,
        violations=violations,
        wall_s=time.monotonic() - started,
    )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def print_table(repeats: list[Repeat]) -> None:
    """One line per repeat, then the summary against the targets."""
    print(
        f"{'#':>3} {'kill after':>10} {'in flight at kill (stage:n)':<34} {'held':>4} {'restart->pools ready s':>22} {'restart->transition s':>21} {'run':>9} {'episodes':>8} {'takeovers':>9} {'exactly-once':>12} {'wall s':>7}"
    )
    for r in repeats:
        flight = " ".join(f"{stage}:{n}" for stage, n in sorted(r.in_flight_at_kill.items())) or "-"
        seconds = "none in 120 s" if r.restart_to_transition_s is None else f"{r.restart_to_transition_s:.2f}"
        verdict = "ok" if not r.violations else f"{len(r.violations)} FAIL"
        ready = "?" if r.restart_to_pools_ready_s is None else f"{r.restart_to_pools_ready_s:.2f}"
        print(
            f"{r.index:>3} {r.kill_after_transitions:>10} {flight:<34} {r.held_claims_at_kill:>4} {ready:>22} {seconds:>21} {r.run_status:>9} {r.episodes:>8} {r.takeovers:>9} {verdict:>12} {r.wall_s:>7.1f}"
        )
    for r in repeats:
        for problem in r.violations[:5]:
            print(f"  repeat {r.index}: {problem}")
    times = [r.restart_to_transition_s for r in repeats if r.restart_to_transition_s is not None]
    missing = len(repeats) - len(times)
    clean = sum(1 for r in repeats if not r.violations)
    print()
    print(f"{'metric':<52} {'value':>22} {'target':>10}")
    if times:
        print(f"{'restart -> first new stage transition, median s':<52} {statistics.median(times):>22.2f} {'< 10':>10}")
        print(f"{'restart -> first new stage transition, p90 s':<52} {percentile(times, 90):>22.2f} {'< 10':>10}")
        print(f"{'restart -> first new stage transition, max s':<52} {max(times):>22.2f} {'< 10':>10}")
        print(f"{'repeats under 10 s':<52} {f'{sum(t < TARGET_S for t in times)}/{len(repeats)}':>22} {'all':>10}")
    ready = [r.restart_to_pools_ready_s for r in repeats if r.restart_to_pools_ready_s is not None]
    if ready:
        print(f"{'restart -> all five pools ready (boot), median s':<52} {statistics.median(ready):>22.2f} {'':>10}")
        gaps = [
            r.restart_to_transition_s - r.restart_to_pools_ready_s
            for r in repeats
            if r.restart_to_transition_s is not None and r.restart_to_pools_ready_s is not None
        ]
        print(f"{'pools ready -> first new stage transition, median s':<52} {statistics.median(gaps):>22.2f} {'':>10}")
    if missing:
        print(f"{'repeats with no transition within 120 s':<52} {missing:>22} {'0':>10}")
    print(f"{'repeats passing every exactly-once check':<52} {f'{clean}/{len(repeats)}':>22} {'all':>10}")


def main(argv: list[str] | None = None) -> int:
    """Run the repeats, print the table; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="kill-and-resume repeats (each a whole run)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    parser.add_argument("--outer-steps", type=int, default=2, help="outer steps per run (each step needs 2 groups of 4 episodes)")
    parser.add_argument("--down-s", type=float, default=0.0, help="seconds everything stays down between the kill and the restart")
    parser.add_argument("--keep", type=Path, help="keep configs and logs in this folder (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds: pools, private servers and folders are cleaned up
    rng = random.Random(args.seed)
    repeats: list[Repeat] = []
    print(
        f"bench.resume: {args.repeats} repeats, seed {args.seed}, {args.outer_steps} outer steps per run, SIMULATOR backends, private Redis and PostgreSQL",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="metarl-bench-resume-") as tmp, PrivateRedis() as redis, PrivatePostgres() as postgres:
        url = postgres.create_database("bench_resume")
        upgrade_database(url)
        work = args.keep.resolve() if args.keep else Path(tmp)
        for index in range(args.repeats):
            repeat = one_repeat(index, rng, url, redis, work, args)
            repeats.append(repeat)
            seconds = "none" if repeat.restart_to_transition_s is None else f"{repeat.restart_to_transition_s:.2f} s"
            print(
                f"  repeat {index}: killed after {repeat.kill_after_transitions} transitions, first transition {seconds} after restart, run {repeat.run_status}, exactly-once {'ok' if not repeat.violations else 'FAILED'} ({repeat.wall_s:.0f} s)",
                flush=True,
            )
        dispose_engines()
    print()
    print_table(repeats)
    times = [r.restart_to_transition_s for r in repeats]
    met = all(t is not None and t < TARGET_S for t in times) and all(not r.violations for r in repeats)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
