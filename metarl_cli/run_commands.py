"""`metarl run`, `resume` and `stop`: start or continue a run and drive its orchestrator here until it ends, is stopped or is interrupted."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from contextlib import ExitStack
from typing import Any

from metarl_cli.exits import EXIT_BUSY, EXIT_CONFIG_ERROR, EXIT_FAILED_RUN, no_such_run
from metarl_cli.services import Services, configured_services


def cmd_run(args: argparse.Namespace) -> int:
    """`metarl run CONFIG`: continue the unfinished run of its name, else create one, and drive it (or print its plan with `--dry-run`)."""
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
        services = stack.enter_context(Services(config.services.database_url, config.services.broker_url, spawn_workers=False))
        from metarl.store import runs_transaction
        from orchestrator.loop import create_run

        if not args.new:
            with runs_transaction(services.database_url) as runs:
                earlier = runs.newest_run_named(config.run.name)
                refusal = None if earlier is None else resume_refusal(runs, earlier)
            if refusal is not None:
                print(f"error: {refusal}", file=sys.stderr)
                return EXIT_FAILED_RUN
            if earlier is not None:
                return continue_run_named(services, earlier, args)
        try:
            run_id = create_run(services.database_url, config, specs)
        except PlatformFault as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
        if not args.no_workers:
            services.start_workers()
        print(f"run {run_id} ({config.run.name}) created; `metarl run {args.config}` or `metarl resume {run_id}` continues it", flush=True)
        return drive(services, run_id, quiet=args.quiet)


def resume_refusal(runs: Any, run: Any) -> str | None:
    """Why the run cannot go on from its current policy version (its outer backend's saved state expired, or this code
    cannot load it); None: it can. Asked before any worker starts."""
    from metarl.artifact_store import ArtifactStore
    from metarl.errors import ArtifactMissing, ArtifactStoreUnavailable
    from metarl.store import utcnow
    from schemas.states import RunStatus

    if run.status == RunStatus.finished:
        return None  # a finished run is not continued
    saved = runs.saved_version(run.run_id, run.policy_version)
    if saved is None:
        return None
    saved_at, state_uri = saved
    config = runs.stored_config(run.run_id)
    outer = config.backends.outer
    problem = outer.resume_problem(run.policy_version, saved_at, utcnow(), config.run.max_outer_steps)
    if problem is None and state_uri is not None:
        try:
            state = outer.saved_state_problem(lambda: str(ArtifactStore(config.artifacts.root).file(state_uri)))
        except (ArtifactMissing, ArtifactStoreUnavailable):
            state = None  # not readable from this host: the workers that read it say what is wrong
        problem = None if state is None else f"policy version {run.policy_version}: {state}"
    return None if problem is None else f"run {run.run_id} cannot be resumed: {problem}"


def continue_run_named(services: Services, earlier: Any, args: argparse.Namespace) -> int:
    """`metarl run CONFIG` when a run of that name exists: continue it while unfinished, else say what it became (a restart
    policy that runs the command again never starts a second run; `--new` does)."""
    from schemas.states import RESUMABLE_RUN_STATUSES, RunStatus

    second = f"`metarl run {args.config} --new` starts a second run"
    if earlier.status in RESUMABLE_RUN_STATUSES:
        if not args.no_workers:
            services.start_workers()
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
    """`metarl resume RUN_ID`: drive a run again after a crash or a stop (a failed one with `--retry-failed`)."""
    with ExitStack() as stack:
        services = stack.enter_context(Services(*configured_services(args), spawn_workers=False))
        from metarl.store import NotRetryable, runs_transaction
        from schemas.states import RunStatus

        with runs_transaction(services.database_url) as runs:
            run_id = runs.resolve_run_id(args.run_id)
            run = runs.summary(run_id)
            if run is None:
                return no_such_run(run_id)
            refusal = resume_refusal(runs, run)
            if refusal is not None:
                print(f"error: {refusal}", file=sys.stderr)
                return EXIT_FAILED_RUN
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
        if not args.no_workers:
            services.start_workers()
        return drive(services, run_id, quiet=args.quiet)


def drive(services: Services, run_id: str, quiet: bool) -> int:
    """Run the run's orchestrator here until the run ends or a signal stops this process (SIGTERM or Ctrl-C; a second Ctrl-C does not wait for the tick); the exit code."""
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
    """`metarl stop RUN_ID`: ask the run to stop once its in-flight episodes finish."""
    from metarl.store import runs_transaction

    with Services(*configured_services(args), spawn_workers=False) as services, runs_transaction(services.database_url) as runs:
        run_id = runs.resolve_run_id(args.run_id)
        requested = runs.request_stop(run_id)
    if not requested:
        return no_such_run(run_id)
    print(f"stop requested for run {run_id}: in-flight episodes finish, then it stops")
    return 0
