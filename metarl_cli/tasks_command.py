"""`metarl tasks check [DIR]` and `metarl tasks show ID`: task specs and their data files, as the run sees them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

DEFAULT_SPECS_DIR = Path(__file__).resolve().parents[1] / "tasks_specs"
EXIT_CONFIG_ERROR = 2


def add_parser(sub: Any) -> None:
    """The ``tasks`` subcommand and its ``check`` and ``show`` actions (``sub`` is the parser's subparsers)."""
    tasks = sub.add_parser("tasks", help="check task specs and their data files, or show what the agent sees of one")
    actions = tasks.add_subparsers(dest="tasks_command", required=True)
    check = actions.add_parser("check", help="validate every task spec of a folder and its data files (every problem at once)")
    check.add_argument("folder", nargs="?", type=Path, default=DEFAULT_SPECS_DIR, help="folder of task specs (default: the repository's tasks_specs/)")
    show = actions.add_parser("show", help="print the TASK.md the agent gets for a task (never its hidden eval)")
    show.add_argument("task", help="task id (a spec in --dir) or a path to a task spec .toml")
    show.add_argument("--dir", type=Path, default=DEFAULT_SPECS_DIR, help="folder of task specs (default: the repository's tasks_specs/)")
    show.add_argument("--artifacts", help="artifacts root whose hidden-eval secret keeps a held-back example out (default: METARL_EVAL_SECRET)")


def check_folder(folder: Path) -> tuple[list[str], list[Any]]:
    """(ids of the valid specs, ConfigErrors of the others) of every ``*.toml`` of ``folder``; an installed
    plugin (family or grader) that cannot be used is one ConfigError naming its entry point."""
    from metarl.learning.grader_plugins import GraderPluginError, registered_graders
    from metarl.learning.registry import FamilyRegistryError, registered_families
    from metarl.runconfig import load_task_spec
    from schemas.base import ConfigError, FieldProblem

    try:
        registered_graders()
        registered_families()
    except GraderPluginError as err:
        return [], [ConfigError("installed plugins", [FieldProblem(field="(entry points)", message=err.message, fix=err.fix)])]
    except FamilyRegistryError as err:
        return [], [ConfigError("installed plugins", [FieldProblem(field="(entry points)", message=str(err), fix="fix or uninstall the plugin package")])]
    if not folder.is_dir():
        return [], [ConfigError(str(folder), [FieldProblem(field="(folder)", message="is not a folder", fix="give the folder of the task specs")])]
    valid: list[str] = []
    errors: list[Any] = []
    for path in sorted(folder.glob("*.toml")):
        try:
            spec = load_task_spec(path)
        except ConfigError as err:
            errors.append(err)
            continue
        if spec.id != path.stem:
            errors.append(
                ConfigError(str(path), [FieldProblem(field="id", message=f"id is {spec.id!r} but the file is {path.name}", fix=f"set id = {path.stem!r}")])
            )
            continue
        valid.append(spec.id)
    if not valid and not errors:
        errors.append(
            ConfigError(str(folder), [FieldProblem(field="(folder)", message="holds no *.toml task spec", fix="add task specs or give another folder")])
        )
    return valid, errors


def cmd_check(folder: Path) -> int:
    valid, errors = check_folder(folder)
    for error in errors:
        print(error.render(), file=sys.stderr)
    if valid:
        print(f"{len(valid)} task spec(s) valid: {', '.join(valid)}")
    return EXIT_CONFIG_ERROR if errors else 0


def spec_path(task: str, folder: Path) -> Path:
    """The spec file a ``tasks show`` argument names."""
    candidate = Path(task)
    return candidate if candidate.suffix == ".toml" else folder / f"{task}.toml"


def cmd_show(task: str, folder: Path, artifacts: str | None) -> int:
    from metarl.learning.eval_secret import EvalSecretMissing, install_tool_eval_secret
    from metarl.runconfig import load_task_spec
    from metarl.workspace import render_task_md
    from schemas.base import ConfigError

    if artifacts is not None:
        try:
            install_tool_eval_secret(artifacts)
        except EvalSecretMissing as err:
            print(f"error: --artifacts: {err}", file=sys.stderr)
            return EXIT_CONFIG_ERROR
    try:
        spec = load_task_spec(spec_path(task, folder))
    except ConfigError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(render_task_md(spec))
    return 0


def cmd_tasks(args: Any) -> int:
    """Run ``metarl tasks check`` or ``metarl tasks show``."""
    if args.tasks_command == "check":
        return cmd_check(args.folder)
    return cmd_show(args.task, args.dir, args.artifacts)
