"""The `metarl` command. Parses arguments and configs before importing anything heavy."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from metarl.store import RunIdError

EXIT_CONFIG_ERROR = 2
EXIT_NOT_FOUND = 3
EXIT_BUSY = 4
EXIT_FAILED_RUN = 1

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

    from metarl_cli.probe_command import add_parser as add_probe_parser

    add_probe_parser(sub)
    from metarl_cli.tasks_command import add_parser as add_tasks_parser

    add_tasks_parser(sub)
    return parser


def _config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        metavar="CONFIG",
        help="read [services] of this run config, as `metarl run CONFIG` does (METARL_DATABASE_URL and METARL_BROKER_URL win)",
    )


def configured_services(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(database URL, broker URL) of the command's `--config` [services], or (None, None): the environment then decides, as for every command."""
    path = getattr(args, "config", None)
    if path is None:
        return None, None
    from metarl.runconfig import load_run

    config, _specs = load_run(path)
    return config.services.database_url, config.services.broker_url


def _service_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-workers", action="store_true", help="do not spawn worker pools (they run elsewhere)")
    parser.add_argument("--quiet", action="store_true", help="no live progress display")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("METARL_LOGLEVEL", "WARNING"), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kombu.connection").setLevel(logging.ERROR)
    from metarl.store import RunIdError
    from schemas.config_error import ConfigError

    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()
        return code
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except RunIdError as err:
        return run_id_refused(err)
    except BrokenPipeError:
        return stdout_closed()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def stdout_closed() -> int:
    """The reader of our standard output went away (`metarl probe ... --json | head`): stop quietly, as the Python docs
    recommend for SIGPIPE: point stdout at /dev/null so the interpreter's final flush cannot fail again, and exit 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    from metarl.runconfig import load_run, missing_backend_keys

    if not args.dry_run and (args.json or args.usd_per_gpu_hour):
        print("error: --json and --usd-per-gpu-hour need --dry-run", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    config, specs = load_run(args.config)
    if args.dry_run:
        return dry_run(args, config, specs)
    missing = missing_backend_keys(config, os.environ)
    if missing:
        for line in missing:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if not args.no_workers:
        from metarl_cli.probe_command import preflight_isolation

        if (refusal := preflight_isolation(config)) is not None:
            print(f"error: {refusal}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
    from metarl.errors import PlatformFault

    with ExitStack() as stack:
        services = stack.enter_context(Services(config.services.database_url, config.services.broker_url, spawn_workers=not args.no_workers))
        from metarl.store import runs_transaction
        from orchestrator.loop import create_run

        if not args.new:
            with runs_transaction(services.database_url) as runs:
                earlier = runs.newest_run_named(config.run.name)
            if earlier is not None:
                return continue_run_named(services, earlier, args)
        try:
            run_id = create_run(services.database_url, config, specs)
        except PlatformFault as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        print(f"run {run_id} ({config.run.name}) created; `metarl run {args.config}` or `metarl resume {run_id}` continues it", flush=True)
        return drive(services, run_id, quiet=args.quiet)


def continue_run_named(services: Services, earlier: Any, args: argparse.Namespace) -> int:
    """`metarl run CONFIG` when a run of that name exists: continue it while unfinished, else say what it became (a restart
    policy that runs the command again never starts a second run; `--new` does)."""
    from schemas.states import RESUMABLE_RUN_STATUSES, RunStatus

    second = f"`metarl run {args.config} --new` starts a second run"
    if earlier.status in RESUMABLE_RUN_STATUSES:
        print(f"continuing run {earlier.run_id} ({earlier.status.value}); {second} instead", flush=True)
        return drive(services, earlier.run_id, quiet=args.quiet)
    if earlier.status == RunStatus.failed:
        print(
            f"error: run {earlier.run_id} of this name failed: {earlier.status_message}\n"
            f"fix the cause, then `metarl resume {earlier.run_id} --retry-failed`; or {second}",
            file=sys.stderr,
        )
        return EXIT_FAILED_RUN
    print(f"run {earlier.run_id} of this name is {earlier.status.value} ({earlier.status_message or 'no message'}); {second}", flush=True)
    return 0


def dry_run(args: argparse.Namespace, config: Any, specs: dict[str, Any]) -> int:
    """`run --dry-run`: print the plan of a loaded run config; no service, API or file is touched."""
    from metarl.dry_run import build_plan, parse_gpu_prices, render_json, render_text
    from metarl.learning.eval_secret import install_existing_eval_secret, install_provisional_eval_secret

    prices = parse_gpu_prices(args.usd_per_gpu_hour, config.backends.train, str(args.config))
    has_secret = install_existing_eval_secret(config.artifacts.root)
    if not has_secret:
        install_provisional_eval_secret()
    plan = build_plan(config, specs, args.config, prices, provisional_secret=not has_secret)
    sys.stdout.write(render_json(plan) + "\n" if args.json else render_text(plan))
    sys.stdout.flush()
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        services = stack.enter_context(Services(*configured_services(args), spawn_workers=not args.no_workers))
        from metarl.store import NotRetryable, runs_transaction
        from schemas.states import RunStatus

        with runs_transaction(services.database_url) as runs:
            run_id = runs.resolve_run_id(args.run_id)
            run = runs.summary(run_id)
            if run is None:
                return no_such_run(run_id)
            if run.status == RunStatus.failed and not args.retry_failed:
                print(
                    f"error: run {run_id} failed: {run.status_message}\n"
                    f"fix the cause, then `metarl resume {run_id} --retry-failed` retries its failed outer step "
                    f"from policy version {run.policy_version}",
                    file=sys.stderr,
                )
                return EXIT_FAILED_RUN
            if args.retry_failed:
                try:
                    reopened = runs.reopen_failed_run(run_id)
                except NotRetryable as err:
                    print(f"error: {err}", file=sys.stderr)
                    return EXIT_FAILED_RUN
                print(
                    f"retrying outer step {reopened.step} from policy version {reopened.policy_version} (it failed with: {reopened.previous_error})", flush=True
                )
        return drive(services, run_id, quiet=args.quiet)


def drive(services: Services, run_id: str, quiet: bool) -> int:
    from metarl.errors import PlatformFault
    from metarl.messaging.celery_app import make_app
    from metarl_cli.progress import ProgressDisplay
    from orchestrator.loop import Orchestrator, OrchestratorBusy
    from schemas.states import RunStatus

    stop_event = threading.Event()
    received: list[int] = []

    def stop_on(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT and signum in received:
            raise KeyboardInterrupt  # a second Ctrl-C does not wait for the tick to end
        received.append(signum)
        stop_event.set()

    previous = {signum: signal.signal(signum, stop_on) for signum in (signal.SIGTERM, signal.SIGINT)}
    orchestrator = Orchestrator(services.database_url, make_app(services.broker_url), run_id)
    display = ProgressDisplay(services.database_url, run_id, enabled=not quiet)
    try:
        with display:
            status = orchestrator.loop(stop_event, on_tick=display.update)
    except OrchestratorBusy as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BUSY
    except PlatformFault as err:
        from metarl.store import pause_run

        pause_run(services.database_url, run_id, f"paused: {err}")
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED_RUN
    except KeyboardInterrupt:
        return interrupted_by_ctrl_c(services, run_id)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if status == RunStatus.running and signal.SIGINT in received:
        return interrupted_by_ctrl_c(services, run_id)
    if status == RunStatus.running:
        mark_interrupted(services, run_id, "interrupted (SIGTERM)")
        print(f"stopped this process; run {run_id} continues with `metarl resume {run_id}`")
        return 0
    display.print_summary()
    if status == RunStatus.paused:
        from metarl.store import runs_transaction

        with runs_transaction(services.database_url) as runs:
            summary = runs.summary(run_id)
        print(f"error: run {run_id} {summary.status_message if summary else 'paused'}; fix the cause, then `metarl resume {run_id}`", file=sys.stderr)
    return 0 if status in (RunStatus.finished, RunStatus.stopped) else 1


def interrupted_by_ctrl_c(services: Services, run_id: str) -> int:
    """Ctrl-C stopped this orchestrator: the run is kept as `interrupted`; exit 130 as a shell expects."""
    mark_interrupted(services, run_id, "interrupted (Ctrl-C)")
    print(f"\ninterrupted: run {run_id} is kept; `metarl resume {run_id}` continues it", file=sys.stderr)
    return 130


def mark_interrupted(services: Services, run_id: str, message: str) -> None:
    """The run's orchestrator stopped: show the run as `interrupted` (resumable) unless it has ended."""
    from metarl.store import runs_transaction

    with runs_transaction(services.database_url) as runs:
        runs.mark_interrupted(run_id, f"{message}; `metarl resume {run_id}` continues it")


def cmd_stop(args: argparse.Namespace) -> int:
    from metarl.store import runs_transaction

    with Services(*configured_services(args), spawn_workers=False) as services, runs_transaction(services.database_url) as runs:
        run_id = runs.resolve_run_id(args.run_id)
        requested = runs.request_stop(run_id)
    if not requested:
        return no_such_run(run_id)
    print(f"stop requested for run {run_id}: in-flight episodes finish, then it stops")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from metarl import settings

    config_database, config_broker = configured_services(args)
    database_url = settings.database_url(config_database)
    if database_url and args.run_id is not None and args.episode is None:
        shown = run_status_at_head(args, database_url, settings.broker_url(config_broker))
        if shown is not None:
            return shown
    from metarl.store import runs_transaction

    with Services(config_database, config_broker, spawn_workers=False) as services, runs_transaction(services.database_url) as runs:
        run_id = None if args.run_id is None else runs.resolve_run_id(args.run_id)
        if args.episode is not None:
            try:
                report = runs.episode_report(args.episode)
            except LookupError:
                report = None
            if report is None or run_id not in (None, report["episode"]["run"]):
                print(f"error: no episode {args.episode}" + (f" in run {run_id}" if run_id else ""), file=sys.stderr)
                return EXIT_NOT_FOUND
            print(json.dumps(report, indent=2, default=str))
            return 0
        if run_id is None:
            listed = runs.list_runs()
            if args.json:
                print(json.dumps(listed, indent=2))
            else:
                from rich.console import Console

                from metarl.report.terminal import runs_table

                Console().print(runs_table(listed))
            return 0
        try:
            status = runs.run_status(run_id, services.broker_url)
        except LookupError:
            return no_such_run(run_id)
    show_run_status(status, as_json=args.json)
    return 0


def run_status_at_head(args: argparse.Namespace, database_url: str, broker_url: str | None) -> int | None:
    """`metarl status RUN_ID` on a configured database at the migrations' head, over one psycopg connection (no SQLAlchemy import).

    None when the database is behind the migrations: the caller then takes the usual path, which
    migrates it first. A database that cannot be reached is an error that names it (no traceback).
    """
    from metarl.store import DatabaseUnreachable, read_run_status_at_head, without_password

    try:
        read = read_run_status_at_head(database_url, args.run_id, broker_url)
    except DatabaseUnreachable as err:
        print(
            f"error: cannot read the run database {without_password(database_url)}: {err.reason}. Fix: check METARL_DATABASE_URL and that PostgreSQL runs there",
            file=sys.stderr,
        )
        return EXIT_FAILED_RUN
    if read is None:
        return None
    if read.status is None:
        return no_such_run(read.run_id)
    show_run_status(read.status, as_json=args.json)
    return 0


def run_id_refused(err: RunIdError) -> int:
    """Say why a typed run id names no single run; the exit code (not found, or a usage error for an ambiguous prefix)."""
    print(f"error: {err.message()}", file=sys.stderr)
    return EXIT_NOT_FOUND if err.kind == "unknown" else EXIT_CONFIG_ERROR


def no_such_run(run_id: str) -> int:
    """Say that there is no run with this id (escaped for the terminal); the exit code."""
    from schemas.config_error import printable

    print(f"error: no run with id {printable(run_id)}; `metarl status` lists runs", file=sys.stderr)
    return EXIT_NOT_FOUND


def show_run_status(status: dict[str, Any], *, as_json: bool) -> None:
    """Print one run's status as JSON or as tables."""
    if as_json:
        print(json.dumps(status, indent=2, default=str))
        return
    from metarl.report.terminal import print_status  # rich: only for the tables

    print_status(status)


def cmd_report(args: argparse.Namespace) -> int:
    """Write the report of one run (HTML, PNG, CSV) and print the path of its index.html."""
    from metarl.artifact_store import is_remote_root
    from metarl.report.tables import default_report_dir, printable
    from metarl.store import runs_transaction

    versus_rows = []
    if args.versus_search is not None:
        from metarl.versus_search import read_versus_csv

        versus_rows = read_versus_csv(args.versus_search)  # a bad CSV is a ConfigError naming its row and column, before any service starts
    with Services(*configured_services(args), spawn_workers=False) as services, runs_transaction(services.database_url) as runs:
        run_id = runs.resolve_run_id(args.run_id)
        try:
            data = runs.report_data(run_id)
        except LookupError:
            return no_such_run(run_id)
        home = services.home
    from metarl.report.html import write_report

    out = args.out if args.out is not None else default_report_dir(data.artifacts_root, home, data.run.id)
    try:
        index = write_report(data, out, versus_rows)
    except OSError as err:
        print(f"error: cannot write the report to {printable(str(out))}: {err.strerror or err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(index.resolve())
    if data.artifacts_root and is_remote_root(data.artifacts_root):
        from metarl.artifact_store import ArtifactStore
        from metarl.errors import ArtifactStoreUnavailable

        try:
            stored = ArtifactStore(data.artifacts_root).put_tree(out, f"reports/{data.run.id}")
        except ArtifactStoreUnavailable as err:
            print(f"error: the report is written here but not stored in the run's artifact store: {err}", file=sys.stderr)
            return EXIT_FAILED_RUN
        print(f"stored: {stored.partition('#')[0]}/index.html")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from metarl import settings
    from metarl.pools import worker_command

    config_database, config_broker = configured_services(args)
    for name, value in ((settings.DATABASE_ENV, settings.database_url(config_database)), (settings.BROKER_ENV, settings.broker_url(config_broker))):
        if not value:
            print(f"error: a worker needs {name} (or --config CONFIG with [services]): the pools share the run's database and broker", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        os.environ[name] = value

    command = worker_command(args.pool, args.concurrency, args.autoscale, args.loglevel)
    os.execv(command[0], command)
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from metarl.store import current_revision, upgrade_database

    with Services(*configured_services(args), spawn_workers=False, migrate=False) as services:
        if args.action == "upgrade":
            upgrade_database(services.database_url)
        print(f"database at revision {current_revision(services.database_url)}")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from metarl.metrics import listen_problem, serve_metrics

    problem = listen_problem(args.host, args.port)
    if problem is None:
        with Services(*configured_services(args), spawn_workers=False) as services:
            try:
                serve_metrics(services.database_url, services.broker_url, args.host, args.port, args.interval)
            except OSError as err:  # taken between the check and the start
                problem = f"cannot listen on {args.host}:{args.port}: {err.strerror or err}"
    if problem is not None:
        from schemas.config_error import printable

        print(f"error: {printable(problem)}. Fix: give a --host of this machine and a free --port", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from metarl_cli.probe_command import cmd_probe as probe

    return probe(args)


def cmd_tasks(args: argparse.Namespace) -> int:
    from metarl_cli.tasks_command import cmd_tasks as tasks

    return tasks(args)


class Services:
    """Database and broker for one command: the configured services, or the embedded default."""

    def __init__(self, database_url: str | None, broker_url: str | None, *, spawn_workers: bool, migrate: bool = True):
        from metarl import settings

        self.database_url_setting = settings.database_url(database_url)
        self.broker_url_setting = settings.broker_url(broker_url)
        self.spawn_workers = spawn_workers
        self.migrate = migrate
        self.home = settings.metarl_home()
        self.embedded: Any = None
        self.pools: Any = None
        self.database_url = ""
        self.broker_url: str | None = None

    def __enter__(self) -> Services:
        from metarl.store import upgrade_database

        if self.database_url_setting:
            self.database_url = self.database_url_setting
            if self.spawn_workers or self.migrate:
                note_services_mode(self.home, self.database_url_setting, self.broker_url_setting)
        else:
            refusal = services_mode_refusal(self.home)
            if refusal is not None:
                raise SystemExit(f"error: {refusal}")
            from metarl.embedded import EmbeddedServices

            self.embedded = EmbeddedServices(self.home)
            self.database_url = self.embedded.start_database()
        if self.broker_url_setting:
            self.broker_url = self.broker_url_setting
        elif self.embedded is not None:
            self.broker_url = self.embedded.broker_url
        if self.migrate:
            upgrade_database(self.database_url)
        if self.spawn_workers:
            if self.broker_url is None:
                raise SystemExit("error: METARL_BROKER_URL is not set while METARL_DATABASE_URL is; set both, or neither for the embedded default")
            from metarl.pools import WorkerPools

            self.pools = WorkerPools(self.database_url, self.broker_url, self.home / "logs")
            self.pools.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pools is not None:
            self.pools.stop()
        if self.embedded is not None:
            self.embedded.stop()


SERVICES_NOTE = "services.json"
"""Written under METARL_HOME by a command that used configured services: which ones (passwords left out)."""


def note_services_mode(home: Path, database_url: str, broker_url: str | None) -> None:
    """Record under `home` that runs of this folder live in services mode, so a later command does not open the embedded database."""
    from metarl.store import without_password

    home.mkdir(parents=True, exist_ok=True)
    note = {"database_url": without_password(database_url), "broker_url": without_password(broker_url) if broker_url else None}
    (home / SERVICES_NOTE).write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")


def services_mode_refusal(home: Path) -> str | None:
    """Why this command must not open the embedded database (a run of this folder lives in services mode), or None."""
    path = home / SERVICES_NOTE
    if not path.is_file():
        return None
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        note = {}
    from schemas.config_error import printable

    return (
        f"runs of {home} live in services mode (database {printable(str(note.get('database_url')))}, broker {printable(str(note.get('broker_url')))}), "
        f"but METARL_DATABASE_URL is not set, so this command would open the empty embedded database. Fix: set METARL_DATABASE_URL and "
        f"METARL_BROKER_URL as for `metarl run`, or pass --config CONFIG; remove {path} to use the embedded database here again"
    )


COMMANDS = {
    "run": cmd_run,
    "resume": cmd_resume,
    "stop": cmd_stop,
    "status": cmd_status,
    "report": cmd_report,
    "worker": cmd_worker,
    "db": cmd_db,
    "metrics": cmd_metrics,
    "probe": cmd_probe,
    "tasks": cmd_tasks,
}


if __name__ == "__main__":
    sys.exit(main())
