"""Scale benchmark: 100,000 simulated episodes in one run; orchestrator memory, database size, `metarl status` time.

    python -m bench.scale [--episodes 100000] [--pipeline-episodes 600] [--min-part-s 30] [--status-repeats 5]

What is measured, precisely:

1. Pipeline, part 1. A run with every backend `sim` at zero duration (simulated agent, cloud,
   scorer and outer update; 6 task families, groups of 8, 16 groups per outer step, 128 episodes in
   flight) goes through the real system: five Celery worker pools and the orchestrator
   (`metarl run --no-workers`), each its own process, on a real Redis and a real PostgreSQL.
   Once half of `--pipeline-episodes` episodes have ended and at least `--min-part-s` seconds have
   passed, `metarl stop` drains it. The orchestrator's resident memory (VmRSS) is sampled every
   0.5 s; the first 10 s of each orchestrator process (its start) are left out of the memory figures.
2. Fill. The full size does not go through the pipeline on 2 cores within 15 minutes (the
   pipeline's rate is printed), so the run is grown to `--episodes` by copying the records that
   part 1 wrote: every finished group with its episodes, stage claims, submissions, inner jobs,
   evaluations, rewards, cost-ledger lines, outer steps and policy versions, in the database
   (`metarl.store.replicate`), with new ids, step and version numbers shifted past the existing ones, and
   the unique keys (inner-job names, idempotency keys) suffixed. The copies are row-for-row what the
   pipeline writes, but carry no dead tuples from the pipeline's updates.
3. Pipeline, part 2. `metarl resume` continues the same run on the grown database for the other
   half of `--pipeline-episodes` (and at least `--min-part-s`), with the same memory sampling, then it is drained again.
4. `metarl status RUN_ID` and `metarl status RUN_ID --json`, each run `--status-repeats` times as
   a new process (what an operator types; process start and imports included), plus the time of
   the status queries alone (metarl.store.status.run_status in this process).
5. Database size: pg_total_relation_size of each table (heap, indexes, TOAST) divided by the
   run's episodes, after the fill (all rows) and after part 1 (pipeline rows only).

Targets: orchestrator memory flat (no growth with episodes), `metarl status` under 1 s.
Redis and PostgreSQL are private servers on free ports (metarl.testing.services), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from metarl.pools import WorkerPools
from metarl.store import count_episodes, dispose_engines, replicate_finished_records, run_record, table_sizes, upgrade_database, vacuum_analyze
from metarl.testing.drill import REPO, read_run_id, service_env, sim_run_config, start_orchestrator, stop_quietly
from metarl.testing.services import PrivatePostgres, PrivateRedis
from schemas.states import Stage

EPISODES_PER_STEP = 128
TABLES = (
    "runs",
    "policy_versions",
    "episode_groups",
    "episodes",
    "stage_claims",
    "probe_attempts",
    "inner_jobs",
    "evaluations",
    "baseline_scores",
    "rewards",
    "cost_ledger",
    "run_spend",
    "outer_steps",
)
STATUS_TARGET_S = 1.0
WARM_UP_S = 10.0
"""Seconds of each orchestrator process's start (imports, first ticks, caches filling) left out of the memory figures."""
MIN_PART_S = 30.0
"""Each pipeline part runs at least this long, so that it has samples after its warm-up even on a fast machine."""
FLAT_KIB_PER_1000 = 1024.0
"""The memory target: under 1 MiB of growth per 1,000 episodes."""


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process in KiB (VmRSS), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        return None
    return None


@dataclass
class Sampler:
    """Samples a process's RSS and the run's ended episodes every `interval_s` in a background thread."""

    pid: int
    database_url: str
    run_id: str
    interval_s: float = 0.5
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin sampling."""
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            rss = rss_kib(self.pid)
            if rss is None:
                return
            self.samples.append((time.monotonic() - started, rss, ended_episodes(self.database_url, self.run_id)))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def ended_episodes(url: str, run_id: str) -> int:
    """Episodes of the run that reached done or failed."""
    return count_episodes(url, run_id, (Stage.done, Stage.failed))


def all_episodes(url: str, run_id: str) -> int:
    """Episodes of the run."""
    return count_episodes(url, run_id)


@dataclass
class PipelinePart:
    """One stretch of the real pipeline: episodes it ended, seconds, and the orchestrator's memory."""

    name: str
    episodes: int
    seconds: float
    samples: list[tuple[float, int, int]]

    @property
    def rate(self) -> float:
        """Episodes ended per second."""
        return self.episodes / self.seconds if self.seconds > 0 else 0.0


def drive_pipeline(
    name: str, args_: list[str], env: dict[str, str], url: str, run_id: str | None, until_more: int, log: Path, min_seconds: float = MIN_PART_S
) -> tuple[str, PipelinePart]:
    """Start the orchestrator (`run` or `resume`), wait for `until_more` more ended episodes and at least `min_seconds`, `metarl stop`,
    wait for the drain."""
    orchestrator = start_orchestrator(args_, env, log_path=None if run_id is None else log)
    try:
        if run_id is None:
            run_id = read_run_id(orchestrator)
            threading.Thread(target=lambda: [None for _ in orchestrator.stdout], daemon=True).start()  # type: ignore[union-attr]
        before = ended_episodes(url, run_id)
        sampler = Sampler(orchestrator.pid, url, run_id)
        sampler.start()
        started = time.monotonic()
        while ended_episodes(url, run_id) - before < until_more or time.monotonic() - started < min_seconds:
            if orchestrator.poll() is not None:
                raise RuntimeError(f"the orchestrator exited early with {orchestrator.returncode}; see {log}")
            time.sleep(1.0)
        seconds = time.monotonic() - started
        ended = ended_episodes(url, run_id) - before
        stopped = subprocess.run(
            [sys.executable, "-m", "metarl_cli.main", "stop", run_id], env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
        )
        if stopped.returncode != 0:
            raise RuntimeError(f"metarl stop failed: {stopped.stderr}")
        orchestrator.wait(timeout=600)
        sampler.stop()
    finally:
        stop_quietly([orchestrator])
    return run_id, PipelinePart(name, ended, seconds, sampler.samples)


def fill(url: str, run_id: str, target: int) -> tuple[int, int, float]:
    """Grow the run to at least `target` episodes by copying its finished groups and their records
    (`metarl.store.replicate`), then VACUUM ANALYZE; (copies, episodes added, seconds)."""
    started = time.monotonic()
    added = replicate_finished_records(url, run_id, target)
    vacuum_analyze(url)
    return added.copies, added.episodes_added, time.monotonic() - started


def time_status(env: dict[str, str], run_id: str, repeats: int, as_json: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) seconds of `metarl status RUN_ID [--json]` as a new process, `repeats` times (the first included)."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "metarl_cli.main", "status", run_id, *(["--json"] if as_json else [])],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise RuntimeError(f"metarl status failed: {done.stderr}")
        if as_json:
            json.loads(done.stdout)
    return walls, cpus


def time_status_queries(url: str, broker: str, run_id: str, repeats: int) -> list[float]:
    """Seconds of the status queries alone (metarl.store.status.run_status on a new psycopg connection each time, as the command opens), in this process."""
    from metarl.store import read_run_status

    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        read_run_status(url, run_id, broker)
        times.append(time.perf_counter() - started)
    return times


def measured_samples(part: PipelinePart, warm_up_s: float = WARM_UP_S) -> list[tuple[float, int, int]]:
    """The part's (seconds, RSS KiB, ended episodes) samples after its process's warm-up."""
    return [sample for sample in part.samples if sample[0] >= warm_up_s]


def memory_summary(part: PipelinePart) -> tuple[float, float, float, float]:
    """(first, median, max, last) RSS in MiB over the part, after its warm-up (all samples when none came after it)."""
    samples = [rss for _, rss, _ in measured_samples(part) or part.samples]
    mib = [s / 1024 for s in samples]
    return mib[0], statistics.median(mib), max(mib), mib[-1]


def slope_kib_per_1000(parts: list[PipelinePart]) -> float:
    """Least-squares slope of RSS against the run's ended episodes over all parts' samples after warm-up, in KiB per 1000 episodes.

    NaN (not measured) unless every part has at least three samples after its warm-up: a part
    without them would leave the slope to one process's start alone.
    """
    if any(len(measured_samples(part)) < 3 for part in parts):
        return float("nan")
    points = [(ended, rss) for part in parts for _, rss, ended in measured_samples(part)]
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return float("nan")
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def memory_verdict(slope: float) -> str:
    """The memory target's verdict for a slope in KiB per 1000 episodes (pure)."""
    if math.isnan(slope):
        return f"NOT MEASURED (a part had fewer than 3 samples after its {WARM_UP_S:.0f} s warm-up; raise --min-part-s)"
    return "met" if slope < FLAT_KIB_PER_1000 else "MISSED"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; exit 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100_000, help="episodes in the run at the end of the fill")
    parser.add_argument("--pipeline-episodes", type=int, default=600, help="episodes that go through the real pipeline (half before, half after the fill)")
    parser.add_argument("--status-repeats", type=int, default=5, help="timed `metarl status` calls of each kind")
    parser.add_argument("--in-flight", type=int, default=128, help="episodes the orchestrator keeps in flight")
    parser.add_argument(
        "--min-part-s",
        type=float,
        default=MIN_PART_S,
        help=f"each pipeline part runs at least this many seconds (memory is read after a {WARM_UP_S:.0f} s warm-up)",
    )
    parser.add_argument("--keep", type=Path, help="keep configs and logs in this folder")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds: pools, private servers and folders are cleaned up
    max_steps = 2 * math.ceil(max(args.episodes, args.pipeline_episodes) / EPISODES_PER_STEP) + 100
    print(
        f"bench.scale: {args.episodes} episodes in one run ({args.pipeline_episodes} through the real pipeline, the rest copied), SIMULATOR backends at zero duration, private Redis and PostgreSQL",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="metarl-bench-scale-") as tmp, PrivateRedis() as redis, PrivatePostgres() as postgres:
        work = args.keep.resolve() if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        url = postgres.create_database("bench_scale")
        upgrade_database(url)
        broker = redis.url(0)
        env = service_env(url, broker)
        config = sim_run_config(
            work / "scale.toml",
            artifacts_root=work / "artifacts",
            name="scale",
            tasks=("addition", "reversal", "caesar", "max_of_list", "sorting", "date_format"),
            max_outer_steps=max_steps,
            agent_s=0.0,
            train_s=0.0,
            eval_s=0.0,
            outer_s=0.0,
            poll_interval_s=0.01,
            max_concurrent_jobs=10_000,
            in_flight=args.in_flight,
            tick_s=0.5,
            group_size=8,
            groups_per_batch=16,
            lease_s=60.0,
            redispatch_after_s=60.0,
            max_run_usd=1_000_000.0,
        )
        pools = WorkerPools(url, broker, work / "logs")
        pools.start()
        try:
            half = max(1, args.pipeline_episodes // 2)
            run_id, part1 = drive_pipeline(
                "part 1 (empty database)", ["run", str(config)], env, url, None, half, work / "logs" / "orchestrator-1.log", args.min_part_s
            )
            print(f"  part 1: {part1.episodes} episodes in {part1.seconds:.0f} s ({part1.rate:.1f}/s)", flush=True)
            pipeline_rows = all_episodes(url, run_id)
            sizes_pipeline = table_sizes(url, TABLES)
            copies, added, fill_s = fill(url, run_id, args.episodes)
            total = all_episodes(url, run_id)
            print(f"  fill: {copies} copies of the finished records, +{added} episodes in {fill_s:.0f} s; run has {total} episodes", flush=True)
            sizes = table_sizes(url, TABLES)
            _, part2 = drive_pipeline(
                f"part 2 ({total} episodes in the run)",
                ["resume", run_id],
                env,
                url,
                run_id,
                args.pipeline_episodes - half,
                work / "logs" / "orchestrator-2.log",
                args.min_part_s,
            )
            print(f"  part 2: {part2.episodes} episodes in {part2.seconds:.0f} s ({part2.rate:.1f}/s)", flush=True)
        finally:
            pools.stop()
        final_total = all_episodes(url, run_id)
        status_tables = time_status(env, run_id, args.status_repeats, as_json=False)
        status_json = time_status(env, run_id, args.status_repeats, as_json=True)
        queries = time_status_queries(url, broker, run_id, args.status_repeats)
        policy_version = run_record(url, run_id).policy_version
        dispose_engines()

    print()
    print(f"run {run_id}: {final_total} episodes, policy version {policy_version}")
    print()
    print(f"{'pipeline part':<40} {'episodes':>9} {'seconds':>8} {'episodes/s':>11} {'RSS MiB first':>14} {'median':>7} {'max':>7} {'last':>7}")
    for part in (part1, part2):
        first, median, peak, last = memory_summary(part)
        print(f"{part.name:<40} {part.episodes:>9} {part.seconds:>8.0f} {part.rate:>11.1f} {first:>14.1f} {median:>7.1f} {peak:>7.1f} {last:>7.1f}")
    slope = slope_kib_per_1000([part1, part2])
    print(
        f"orchestrator RSS slope over both parts (after each {WARM_UP_S:.0f} s warm-up): {slope:+.1f} KiB per 1000 episodes; flat (< {FLAT_KIB_PER_1000:.0f}): {memory_verdict(slope)}"
    )
    print()
    print(f"{'table':<18} {'bytes (all rows)':>17} {'bytes/episode':>14} {'pipeline rows only: bytes/episode':>34}")
    for table in TABLES:
        print(f"{table:<18} {sizes[table]:>17,} {sizes[table] / total:>14.0f} {sizes_pipeline[table] / pipeline_rows:>34.0f}")
    print(f"{'all tables':<18} {sum(sizes.values()):>17,} {sum(sizes.values()) / total:>14.0f} {sum(sizes_pipeline.values()) / pipeline_rows:>34.0f}")
    print(f"(after the fill: {total} episodes; pipeline rows only: {pipeline_rows} episodes after part 1)")
    print()
    print(f"{'metarl status':<44} {'median wall s':>14} {'max wall s':>11} {'median CPU s':>13} {'target':>8}")
    for label, (walls, cpus) in (("metarl status RUN_ID (new process)", status_tables), ("metarl status RUN_ID --json (new process)", status_json)):
        print(f"{label:<44} {statistics.median(walls):>14.2f} {max(walls):>11.2f} {statistics.median(cpus):>13.2f} {'< 1':>8}")
    print(f"{'status queries alone (in process)':<44} {statistics.median(queries):>14.3f} {max(queries):>11.3f} {'':>13} {'':>8}")
    print("(CPU: user + system seconds of the status process itself; wall includes waiting for the database and for the CPU)")
    flat = memory_verdict(slope) == "met"
    fast = statistics.median(status_tables[0]) < STATUS_TARGET_S and statistics.median(status_json[0]) < STATUS_TARGET_S
    return 0 if flat and fast else 1


if __name__ == "__main__":
    sys.exit(main())
