"""`metarl status` and `report`: read a run's records and show them (tables or JSON) or write its report."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from metarl_cli.exits import EXIT_CONFIG_ERROR, EXIT_FAILED_RUN, EXIT_NOT_FOUND, no_such_run
from metarl_cli.services import Services, configured_services


def cmd_status(args: argparse.Namespace) -> int:
    """`metarl status [RUN_ID] [--episode N]`: the runs, one run's status, or one episode's story and cost."""
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
