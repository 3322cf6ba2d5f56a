"""The `metarl` command's arguments: the parser of every subcommand and the argparse types that check numbers on the way in."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from metarl_cli import probe_command, tasks_command

BIGINT_MAX = 2**63 - 1
"""Largest id PostgreSQL's bigint columns hold (episode ids)."""
CELERY_LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "fatal")


def whole_number(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]; anything else is a usage error (exit 2) naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give {what} from {low} to {high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {what} from {low} to {high}")
        return value

    return parse


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in (low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give more than {low:g} and at most {high:g} seconds")
        return value

    return parse


def pool_processes_arg(text: str) -> int:
    """`--concurrency`: 1 to MAX_POOL_PROCESSES worker processes."""
    from metarl.pools import MAX_POOL_PROCESSES

    return whole_number(1, MAX_POOL_PROCESSES, "a number of worker processes")(text)


def autoscale_arg(text: str) -> str:
    """`--autoscale MAX,MIN`, checked by `metarl.pools.parse_autoscale` (a max below the min is refused, not reordered)."""
    from metarl.pools import parse_autoscale

    try:
        largest, smallest = parse_autoscale(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--autoscale ")) from None
    return f"{largest},{smallest}"


def build_parser() -> argparse.ArgumentParser:
    """The parser of `metarl` and each of its subcommands."""
    parser = argparse.ArgumentParser(prog="metarl", description="Train a trainer agent by RL to write RL training jobs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="start a run from a run config (embedded services unless METARL_DATABASE_URL is set)")
    run.add_argument("config", type=Path)
    run.add_argument("--new", action="store_true", help="start a second run even when an unfinished run of the same name exists (default: continue that run)")
    _service_flags(run)
    run.add_argument(
        "--dry-run", action="store_true", help="print the pods, images, compiled prime-rl configs and cost estimate; call no API, start and write nothing"
    )
    run.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    run.add_argument(
        "--usd-per-gpu-hour",
        action="append",
        default=[],
        metavar="TYPE=USD",
        help="with --dry-run: list price of one GPU of a Runpod GPU type per hour, for the estimate (repeatable)",
    )

    resume = sub.add_parser("resume", help="continue a run after a crash or a stop")
    resume.add_argument("run_id", help="the run's id or a unique prefix of it")
    resume.add_argument(
        "--retry-failed", action="store_true", help="a failed run: retry its failed outer step from the same saved policy version (fix the cause first)"
    )
    _service_flags(resume)
    _config_flag(resume)

    stop = sub.add_parser("stop", help="ask a run to stop gracefully (in-flight episodes finish)")
    stop.add_argument("run_id", help="the run's id or a unique prefix of it")
    _config_flag(stop)

    status = sub.add_parser("status", help="show runs, or one run in detail")
    status.add_argument("run_id", nargs="?", help="the run's id or a unique prefix of it (none: list the runs)")
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    status.add_argument("--episode", type=whole_number(1, BIGINT_MAX, "an episode id"), help="what happened to one episode and what it cost")
    _config_flag(status)

    report = sub.add_parser("report", help="write one run's report: an HTML page, PNG plots and CSV tables")
    report.add_argument("run_id", help="the run's id or a unique prefix of it")
    report.add_argument("--out", type=Path, help="output folder (default: <artifacts root or METARL_HOME>/reports/RUN_ID)")
    report.add_argument(
        "--versus-search", type=Path, metavar="CSV", help="also draw this bench.versus_search CSV (the agent against the searches) beside the run's plots"
    )
    _config_flag(report)

    worker = sub.add_parser("worker", help="start one worker pool (services mode)")
    worker.add_argument("--pool", required=True, choices=["agent", "probe", "train", "eval", "outer"])
    processes = worker.add_mutually_exclusive_group()
    processes.add_argument("--concurrency", type=pool_processes_arg, default=1, help="a fixed number of worker processes (Flower cannot resize it)")
    processes.add_argument(
        "--autoscale", type=autoscale_arg, metavar="MAX,MIN", help="grow and shrink between MIN and MAX worker processes (Flower can change the range)"
    )
    worker.add_argument("--loglevel", type=str.lower, choices=CELERY_LOG_LEVELS, default="info")
    _config_flag(worker)

    db = sub.add_parser("db", help="database migrations")
    db.add_argument("action", choices=["upgrade", "current"])
    _config_flag(db)

    metrics = sub.add_parser("metrics", help="serve Prometheus metrics (queue depths, stages, latencies, costs)")
    metrics.add_argument("--port", type=whole_number(1, 65535, "a TCP port"), default=9108)
    metrics.add_argument("--host", default="127.0.0.1")
    metrics.add_argument(
        "--interval",
        type=seconds_between(0.0, 3600.0),
        default=5.0,
        help="seconds between the serving loop's wake-ups (scrapes read the records when they come)",
    )
    _config_flag(metrics)

    probe_command.add_parser(sub)
    tasks_command.add_parser(sub)
    return parser


def _config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="CONFIG",
        help="read [services] of this run config, as `metarl run CONFIG` does (METARL_DATABASE_URL and METARL_BROKER_URL win)",
    )


def _service_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-workers", action="store_true", help="do not spawn worker pools (they run elsewhere)")
    parser.add_argument("--quiet", action="store_true", help="no live progress display")
