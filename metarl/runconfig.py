"""Loading a run config and the task specs it names."""

from __future__ import annotations

from pathlib import Path

from schemas.base import ConfigError, FieldProblem, load_toml_model
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec


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
                str(path), [FieldProblem(field=f"run.tasks.{index}", message=f"no task spec {spec_path}", fix=f"add {spec_path.name} to {specs_dir} or fix the id")]
            )
        spec = load_toml_model(TaskSpec, spec_path)
        if spec.id != task_id:
            raise ConfigError(str(spec_path), [FieldProblem(field="id", message=f"id is {spec.id!r} but the file is {task_id}.toml", fix=f"set id = {task_id!r}")])
        specs[task_id] = spec
    if all(spec.held_out for spec in specs.values()):
        raise ConfigError(str(path), [FieldProblem(field="run.tasks", message="every task is held out", fix="include at least one task that is not held out")])
    return config, specs
