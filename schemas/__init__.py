"""Pydantic schemas (task specs, job.toml, run config) and SQLAlchemy records of metarl.

The names below are imported on first use, so that `import metarl.store.records` (what `metarl status`
needs) does not build every pydantic model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schemas.base import FieldProblem, dump_toml_model, load_toml_model, parse_toml_text
    from schemas.config_error import ConfigError
    from schemas.job import JobSpec
    from schemas.run_config import RunConfig
    from schemas.task_spec import TaskSpec

_HOMES = {
    "ConfigError": "schemas.config_error",
    "FieldProblem": "schemas.base",
    "dump_toml_model": "schemas.base",
    "load_toml_model": "schemas.base",
    "parse_toml_text": "schemas.base",
    "JobSpec": "schemas.job",
    "RunConfig": "schemas.run_config",
    "TaskSpec": "schemas.task_spec",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
