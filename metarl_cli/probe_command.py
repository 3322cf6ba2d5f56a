"""`metarl probe DIR --task ID [--config RUN.toml] [--json]`: probe a workspace folder as the probe stage does.

The folder holds what an agent writes (job.toml, the environment module, the dataset: an
attempt's ``files/`` folder). The probe is :func:`metarl.probe.workspace.probe_workspace`, the
function the probe stage runs, under the same isolation (:mod:`metarl.sandbox.isolation`), so a user can
debug an agent's output or run an outside hostile corpus against the real probe.

- ``--task ID`` names a task spec: ``ID.toml`` in the run config's task-spec folder with
  ``--config``, else in the repository's ``tasks_specs/``; a path to a ``.toml`` file also works.
- ``--config`` adds what the run config decides: the train backend's compile check (the probe
  stage's ``registry.probe_checks``) and ``[sandbox] min_isolation``. Without it there is no
  backend check and the isolation must be ``full``.
- Exit status: 0 valid, 1 refused (every problem printed), 2 bad usage, an unusable config or task
  spec, or a host that cannot give the required isolation. ``--json`` prints ``verdict``,
  ``passed``, ``problems``, ``isolation`` (the level the module ran under; null when it did not
  run), ``isolation_layers``, ``backend_checks``, ``task`` and ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

EXIT_VALID = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
REPO_TASK_SPECS = Path(__file__).resolve().parent.parent / "tasks_specs"


def add_parser(sub: Any) -> None:
    """The ``probe`` subcommand (``sub`` is the parser's subparsers)."""
    probe = sub.add_parser("probe", help="probe a workspace folder (job.toml, environment module, dataset) exactly as the probe stage does")
    probe.add_argument("folder", type=Path, help="the folder holding job.toml, the environment module and the dataset (an attempt's files/)")
    probe.add_argument(
        "--task", required=True, help="task id (a spec in the config's task-spec folder, or the repository's tasks_specs/), or a path to a task spec .toml"
    )
    probe.add_argument("--config", type=Path, help="run config: its task specs, its train backend's compile check and its [sandbox] min_isolation")
    probe.add_argument("--seed", type=int, default=0, help="episode seed: picks the sample items the reward is checked on (default 0)")
    probe.add_argument("--json", action="store_true", help="print the verdict as JSON")
    probe.add_argument(
        "--artifacts",
        help="artifacts root whose hidden-eval secret the contamination check uses (default: the run config's, else .metarl/artifacts; METARL_EVAL_SECRET wins)",
    )


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def load_task(task: str, config_path: Path | None) -> tuple[Any, list[Any], str, Literal["process", "full"], str | None]:
    """(task spec, backend checks, their name, min_isolation, the run's artifacts root) for the arguments; ConfigError on a bad file."""
    from metarl.runconfig import load_task_spec
    from schemas.base import ConfigError, FieldProblem

    checks: list[Any] = []
    check_name = "none"
    minimum: Literal["process", "full"] = "full"
    if config_path is not None:
        from metarl import composition as registry
        from metarl.runconfig import load_run

        config, specs = load_run(config_path)
        checks, check_name, minimum = registry.probe_checks(config), config.backends.train.type, config.sandbox.min_isolation
        if task in specs:
            return specs[task], checks, check_name, minimum, config.artifacts.root
        folder = (Path(config_path).parent / config.run.task_specs_dir).resolve()
    else:
        folder = REPO_TASK_SPECS
    path = Path(task) if task.endswith(".toml") else folder / f"{task}.toml"
    if not path.is_file():
        raise ConfigError(
            str(path),
            [FieldProblem(field="--task", message=f"no task spec {path}", fix=f"use a task id with a spec in {folder}, or a path to a .toml task spec")],
        )
    return load_task_spec(path), checks, check_name, minimum, (config.artifacts.root if config_path is not None else None)


def cmd_probe(args: argparse.Namespace) -> int:
    """Run the probe on ``args.folder``; print the verdict; 0 valid, 1 refused, 2 unusable input or isolation."""
    from metarl.learning.eval_secret import DEFAULT_TOOL_ARTIFACTS, EvalSecretMissing, install_tool_eval_secret
    from metarl.probe.workspace import probe_workspace
    from metarl.sandbox.parent import IsolationUnavailable, SandboxLimits, SandboxUnavailable
    from schemas.base import ConfigError

    folder: Path = args.folder
    if not folder.is_dir():
        return _usage(f"{folder} is not a folder; give the folder that holds job.toml (an attempt's files/ folder)")
    if not 0 <= args.seed < 2**63:
        return _usage("--seed must be between 0 and 2**63 - 1")
    try:
        task, checks, check_name, minimum, run_artifacts = load_task(args.task, args.config)
    except ConfigError as err:
        return _usage(str(err))
    artifacts = args.artifacts or run_artifacts or DEFAULT_TOOL_ARTIFACTS
    try:
        install_tool_eval_secret(artifacts)
    except EvalSecretMissing as err:
        where = "--artifacts" if args.artifacts else ("the run config's [artifacts] root" if run_artifacts else "the default artifacts root")
        return _usage(f"{where}: {err}")
    started = time.perf_counter()
    try:
        verdict = probe_workspace(folder, task, checks, seed=args.seed, limits=SandboxLimits(min_isolation=minimum))
    except IsolationUnavailable as err:
        return _usage(str(err))
    except SandboxUnavailable as err:
        return _usage(f"the sandbox could not run (not the workspace's fault): {err}")
    seconds = time.perf_counter() - started
    report = {
        "verdict": "valid" if verdict.passed else "refused",
        "passed": verdict.passed,
        "task": task.id,
        "problems": [problem.model_dump() for problem in verdict.errors],
        "isolation": verdict.isolation,
        "isolation_layers": verdict.isolation_layers,
        "backend_checks": check_name,
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return EXIT_VALID if verdict.passed else EXIT_REFUSED


def render(report: dict[str, Any]) -> str:
    """The verdict as text: one header line, then every problem with its fix."""
    ran = f"isolation {report['isolation']}" if report["isolation"] else "the environment module did not run"
    count = len(report["problems"])
    head = "VALID" if report["passed"] else f"REFUSED: {count} problem{'s' if count != 1 else ''}"
    lines = [f"{head} (task {report['task']}, {ran}, backend checks: {report['backend_checks']}, {report['seconds']:.2f} s)"]
    for problem in report["problems"]:
        lines.append(f"- {problem['field']}: {problem['message']}")
        lines.append(f"  fix: {problem['fix']}")
    return "\n".join(lines)


def preflight_isolation(config: Any) -> str | None:
    """Why this host cannot run a run's agent code at its ``[sandbox] min_isolation`` (None: it can,
    or the run's agent writes no code). ``metarl run`` refuses to start the worker pools on such a host."""
    if config.backends.agent.type == "sim":
        return None
    from metarl.sandbox import isolation
    from metarl.sandbox.parent import RUNNER
    from metarl.sandbox_runner import ALLOWED_MODULES

    return isolation.refusal(isolation.host_isolation(str(RUNNER), ALLOWED_MODULES), config.sandbox.min_isolation)
