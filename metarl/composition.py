"""Build the backend object for each stage from its config: the one place that joins the backends to the run database (the store), above both.

Each stage's config model names its backend class (``backend_class``, a ``module:Class`` path in
its vendor's `config.py`); the class is imported here only when a run uses it, and builds itself
with ``from_run_config``. Nothing here knows a vendor by name.
"""

from __future__ import annotations

from typing import Any

from metarl.interfaces import AgentBackend, BaseScoreKey, EvalBackend, HoldsRunResources, OuterBackend, TrainBackend
from metarl.probe.job import BackendCheck
from metarl.settings import database_url as configured_database_url
from metarl.store import RunpodRunStore
from metarl.store import base_score_key as make_base_score_key
from schemas.backend_config import BackendConfig
from schemas.backend_registry import import_path
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec


def backend_class(backend: BackendConfig) -> Any:
    """The class of a configured backend, imported now."""
    return import_path(type(backend).backend_class)


class RunServices:
    """What the backends get from outside their folder: the run database, as each one needs to see it."""

    def __init__(self, database_url: str | None = None):
        self.database_url = database_url

    def runpod_runs(self) -> RunpodRunStore | None:
        """The run database as the Runpod backend sees it: `database_url`, else the configured one (`METARL_DATABASE_URL`); None without."""
        url = self.database_url or configured_database_url()
        return RunpodRunStore(url) if url else None


def agent_backend(config: RunConfig) -> AgentBackend:
    backend: AgentBackend = backend_class(config.backends.agent).from_run_config(config, RunServices())
    return backend


def train_backend(config: RunConfig, services: RunServices | None = None) -> TrainBackend:
    backend: TrainBackend = backend_class(config.backends.train).from_run_config(config, services or RunServices())
    return backend


def eval_backend(config: RunConfig) -> EvalBackend:
    backend: EvalBackend = backend_class(config.backends.eval).from_run_config(config, RunServices())
    return backend


def outer_backend(config: RunConfig) -> OuterBackend:
    backend: OuterBackend = backend_class(config.backends.outer).from_run_config(config, RunServices())
    return backend


def base_score_key(config: RunConfig, task: TaskSpec, model_name: str) -> BaseScoreKey:
    """The key base scores of ``model_name`` on ``task`` are cached under with this run's eval backend, without building it."""
    scorer = backend_class(config.backends.eval)
    identity = scorer.base_model_identity(config.backends.eval, model_name, task)
    return make_base_score_key(task, model_name, scorer.name, identity)


def probe_checks(config: RunConfig) -> list[BackendCheck]:
    """Compile checks of the configured train backend, so a job that would not run is caught by the probe."""
    compile_checks = getattr(backend_class(config.backends.train), "compile_checks", None)
    return list(compile_checks(config)) if compile_checks is not None else []


def release_train_resources(config: RunConfig, run_id: str, database_url: str) -> int:
    """Give back what a finished run still holds on its train backend (Runpod's warm pods); returns how many."""
    if not issubclass(backend_class(config.backends.train), HoldsRunResources):
        return 0  # nothing outlives a job on this backend: none is built
    backend = train_backend(config, RunServices(database_url))
    return backend.release_run(run_id) if isinstance(backend, HoldsRunResources) else 0
