"""Loading a run config and the task specs it names."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from schemas.base import ConfigError, FieldProblem, load_toml_model, read_toml_file, validate_model
from schemas.config_error import printable
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec


def load_task_spec(path: Path) -> TaskSpec:
    """Read one task spec file and the data files it names; its family must be one the learning backends can build.

    A spec naming an unknown family would pass the schema, start a run and then fail every probe
    (blamed on the agent), so it is a ConfigError naming the file, the field and the families,
    reported together with the schema's problems and every problem of the data files (file, line
    and field). An installed plugin grader that fails its checks (metarl/learning/grader_plugins.py) is a
    ConfigError too. The returned spec holds the data files' paths resolved against the spec's folder.
    """
    from metarl.learning.data_families import build_family, resolved_path
    from metarl.learning.grader_plugins import GraderPluginError, registered_graders
    from metarl.learning.registry import registered_families

    try:
        registered_graders()  # the sandbox loads every registered plugin grader: a broken one fails every run
    except GraderPluginError as err:
        raise ConfigError(str(path), [FieldProblem(field="(installed plugin graders)", message=err.message, fix=err.fix)]) from None
    families = registered_families()
    data = read_toml_file(path)
    family = data.get("family")
    family_problems: list[FieldProblem] = []
    defines_family = any(key in data for key in ("items", "grader")) or (isinstance(data.get("hidden_eval"), dict) and "path" in data["hidden_eval"])
    if isinstance(family, str) and family not in families and not defines_family:
        message = f"unknown task family {printable(family)!r}"
        family_problems.append(FieldProblem(field="family", message=message, fix=f"use one of {', '.join(sorted(families))}"))
    try:
        spec = validate_model(TaskSpec, data, str(path))
    except ConfigError as err:
        schema_problems = [problem for problem in err.problems if not (family_problems and problem.field == "family")]
        raise ConfigError(str(path), family_problems + schema_problems) from None
    if family_problems:
        raise ConfigError(str(path), family_problems)
    folder = Path(path).resolve().parent
    _, data_problems = build_family(spec, folder)
    if data_problems:
        raise ConfigError(str(path), data_problems)
    if spec.items is not None and spec.items.pool is not None:
        spec.items.pool = str(resolved_path(folder, spec.items.pool))
    if spec.hidden_eval.path is not None:
        spec.hidden_eval.path = str(resolved_path(folder, spec.hidden_eval.path))
    return spec


def load_run(path: Path) -> tuple[RunConfig, dict[str, TaskSpec]]:
    """Read the run config and every task spec it names; all problems are ConfigErrors naming the field."""
    config = load_toml_model(RunConfig, path)
    try:
        specs_dir = (Path(path).parent / config.run.task_specs_dir).resolve()
        specs_dir.is_dir()
    except (OSError, ValueError) as exc:
        raise ConfigError(
            str(path), [FieldProblem(field="run.task_specs_dir", message=f"unusable folder: {exc}", fix="give an existing folder of task specs")]
        ) from None
    specs: dict[str, TaskSpec] = {}
    for index, task_id in enumerate(config.run.tasks):
        spec_path = specs_dir / f"{task_id}.toml"
        try:
            is_file = spec_path.is_file()
        except (OSError, ValueError):
            is_file = False
        if not is_file:
            raise ConfigError(
                str(path),
                [FieldProblem(field=f"run.tasks.{index}", message=f"no task spec {spec_path}", fix=f"add {spec_path.name} to {specs_dir} or fix the id")],
            )
        spec = load_task_spec(spec_path)
        if spec.id != task_id:
            raise ConfigError(
                str(spec_path), [FieldProblem(field="id", message=f"id is {spec.id!r} but the file is {task_id}.toml", fix=f"set id = {task_id!r}")]
            )
        specs[task_id] = spec
    if all(spec.held_out for spec in specs.values()):
        raise ConfigError(str(path), [FieldProblem(field="run.tasks", message="every task is held out", fix="include at least one task that is not held out")])
    unrunnable = [problem for spec in specs.values() for problem in config.backends.train.task_problems(spec)]
    unrunnable += time_cap_problems(config, specs)
    if unrunnable:
        raise ConfigError(str(path), unrunnable)
    return config, specs


def time_cap_problems(config: RunConfig, specs: Mapping[str, TaskSpec]) -> list[FieldProblem]:
    """One problem per `run.episode_train_seconds` entry above a task's own cap on the run's train backend."""
    problems = []
    for index, seconds in enumerate(config.run.episode_train_seconds):
        over = {task_id: cap for task_id, spec in specs.items() if seconds > (cap := config.backends.train.train_seconds(spec))}
        if over:
            problems.append(
                FieldProblem(
                    field=f"run.episode_train_seconds.{index}",
                    message=f"{seconds:g} s is above the training-time cap of {', '.join(f'{task} ({cap:g} s)' for task, cap in sorted(over.items()))}",
                    fix=f"use at most {min(over.values()):g} s, or raise the cap in those task specs",
                )
            )
    return problems


def missing_backend_keys(config: RunConfig, environ: Mapping[str, str]) -> list[str]:
    """One line (problem and fix) per API key a configured backend reads from the environment that ``environ`` lacks.

    The backends read their keys only from the environment, and only when they first call their
    service: `metarl run` checks them here, before any database, broker or pool is started.
    """
    needs: dict[str, list[str]] = {}
    for stage, backend in config.backends.by_stage().items():
        variable = type(backend).api_key_env
        if variable is not None:
            needs.setdefault(variable, []).append(f"backends.{stage}")
    problems = []
    for variable, fields in needs.items():
        if not environ.get(variable, "").strip():
            uses = " and ".join(f'{field} (type = "{getattr(config.backends, field.split(".")[1]).type}")' for field in fields)
            problems.append(
                f"{uses} need{'s' if len(fields) == 1 else ''} {variable}, which is not set. "
                f"Fix: export {variable} (the API key of that service) here and on every worker host; it is never read from the config"
            )
    return problems
