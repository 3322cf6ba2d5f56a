"""The `metarl` command. Parses arguments and configs before importing anything heavy.

Its parts: the parser (`metarl_cli/arguments.py`), the commands (`metarl_cli/run_commands.py`, `metarl_cli/read_commands.py`,
`metarl_cli/service_commands.py`, `metarl_cli/probe_command.py`, `metarl_cli/tasks_command.py`), the services a command
uses (`metarl_cli/services.py`) and the exit codes (`metarl_cli/exits.py`). Each imports only the standard library at
load time; what a command needs is imported when it runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

from metarl_cli import probe_command, tasks_command
from metarl_cli.arguments import build_parser
from metarl_cli.exits import EXIT_CONFIG_ERROR, run_id_refused
from metarl_cli.read_commands import cmd_report, cmd_status
from metarl_cli.run_commands import cmd_resume, cmd_run, cmd_stop
from metarl_cli.service_commands import cmd_db, cmd_metrics, cmd_worker


def main(argv: list[str] | None = None) -> int:
    """Run one `metarl` command; its exit code (a bad config or run id is a one-line error, not a traceback)."""
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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "resume": cmd_resume,
    "stop": cmd_stop,
    "status": cmd_status,
    "report": cmd_report,
    "worker": cmd_worker,
    "db": cmd_db,
    "metrics": cmd_metrics,
    "probe": probe_command.cmd_probe,
    "tasks": tasks_command.cmd_tasks,
}
"""Each subcommand's handler: it returns the exit code."""


if __name__ == "__main__":
    sys.exit(main())
