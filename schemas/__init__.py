"""Pydantic schemas (task specs, job.toml, run config) and SQLAlchemy records of metarl."""

from schemas.base import ConfigError, FieldProblem, load_toml_model, parse_toml_text, dump_toml_model
from schemas.job import JobSpec
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

__all__ = [
    "ConfigError",
    "FieldProblem",
    "JobSpec",
    "RunConfig",
    "TaskSpec",
    "dump_toml_model",
    "load_toml_model",
    "parse_toml_text",
]
