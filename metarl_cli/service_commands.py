"""`metarl worker`, `db` and `metrics`: run a worker pool, migrate the database, serve Prometheus metrics."""

from __future__ import annotations

import argparse
import os
import sys

from metarl_cli.exits import EXIT_CONFIG_ERROR
from metarl_cli.services import Services, configured_services


def cmd_worker(args: argparse.Namespace) -> int:
    """`metarl worker --pool POOL`: become one Celery worker pool of the configured database and broker."""
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
    """`metarl db upgrade|current`: migrate the database, or print its revision."""
    from metarl.store import current_revision, upgrade_database

    with Services(*configured_services(args), spawn_workers=False, migrate=False) as services:
        if args.action == "upgrade":
            upgrade_database(services.database_url)
        print(f"database at revision {current_revision(services.database_url)}")
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    """`metarl metrics`: serve Prometheus metrics until stopped."""
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
