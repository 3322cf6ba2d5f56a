"""Build the backend object for each stage from its config (`type` picks the implementation): the one place that joins the backends to the run database (the store), above both."""

from __future__ import annotations

from metarl.artifact_store import ArtifactStore
from metarl.backends.local.agent import LocalAgent, LocalOuter
from metarl.backends.local.train import LocalEval, LocalTrain, local_compile_problems
from metarl.backends.runpod.eval import PodVllmEval
from metarl.backends.runpod.train import RunpodTrain
from metarl.backends.sim.simulator import SimAgent, SimEval, SimOuter, SimTrain
from metarl.backends.tinker.agent import TinkerAgent
from metarl.backends.tinker.outer import TinkerOuter
from metarl.backends.vllm.eval import VllmEval
from metarl.interfaces import AgentBackend, BaseScoreKey, EvalBackend, OuterBackend, TrainBackend
from metarl.probe.job import BackendCheck
from metarl.settings import database_url as configured_database_url
from metarl.store import RunpodRunStore
from metarl.store import base_score_key as make_base_score_key
from schemas.run_config import (
    LocalAgentBackend,
    LocalEvalBackend,
    LocalOuterBackend,
    LocalTrainBackend,
    PodVllmEvalBackend,
    RunConfig,
    RunpodTrainBackend,
    SimOuterBackend,
    TinkerAgentBackend,
    TinkerOuterBackend,
    VllmEvalBackend,
)
from schemas.task_spec import TaskSpec


def agent_backend(config: RunConfig) -> AgentBackend:
    backend = config.backends.agent
    if isinstance(backend, LocalAgentBackend):
        return LocalAgent(backend)
    if isinstance(backend, TinkerAgentBackend):
        return TinkerAgent(backend)
    return SimAgent(backend)


def train_backend(config: RunConfig) -> TrainBackend:
    backend = config.backends.train
    if isinstance(backend, LocalTrainBackend):
        return LocalTrain(backend, ArtifactStore(config.artifacts.root), min_isolation=config.sandbox.min_isolation)
    if isinstance(backend, RunpodTrainBackend):
        return RunpodTrain(backend, config.artifacts.root, config.budget, runpod_runs(), pod_eval=pod_eval_config(config))
    return SimTrain(backend, ArtifactStore(config.artifacts.root).working_dir("sim-cloud"))


def runpod_runs(database_url: str | None = None) -> RunpodRunStore | None:
    """The run database as the Runpod backend sees it: `database_url`, else the configured one (`METARL_DATABASE_URL`); None without."""
    url = database_url or configured_database_url()
    return RunpodRunStore(url) if url else None


def pod_eval_config(config: RunConfig) -> PodVllmEvalBackend | None:
    """The on-pod eval's settings when the hidden eval runs on the train pods."""
    backend = config.backends.eval
    return backend if isinstance(backend, PodVllmEvalBackend) else None


def eval_backend_class(config: RunConfig) -> type[LocalEval] | type[VllmEval] | type[SimEval] | type[PodVllmEval]:
    backend = config.backends.eval
    if isinstance(backend, LocalEvalBackend):
        return LocalEval
    if isinstance(backend, VllmEvalBackend):
        return VllmEval
    if isinstance(backend, PodVllmEvalBackend):
        return PodVllmEval
    return SimEval


def eval_backend(config: RunConfig) -> EvalBackend:
    backend = config.backends.eval
    if isinstance(backend, PodVllmEvalBackend):
        return PodVllmEval(backend, config.artifacts.root)
    if isinstance(backend, LocalEvalBackend):
        return LocalEval(backend)
    if isinstance(backend, VllmEvalBackend):
        return VllmEval(backend)
    return SimEval(backend)


def base_score_key(config: RunConfig, task: TaskSpec, model_name: str) -> BaseScoreKey:
    """The key base scores of ``model_name`` on ``task`` are cached under with this run's eval backend, without building it."""
    backend_class = eval_backend_class(config)
    identity = backend_class.base_model_identity(config.backends.eval, model_name, task)  # type: ignore[arg-type]
    return make_base_score_key(task, model_name, backend_class.name, identity)


def outer_backend(config: RunConfig) -> OuterBackend:
    backend, agent = config.backends.outer, config.backends.agent
    if isinstance(backend, LocalOuterBackend) and isinstance(agent, LocalAgentBackend):
        return LocalOuter(backend, agent)
    if isinstance(backend, TinkerOuterBackend) and isinstance(agent, TinkerAgentBackend):
        return TinkerOuter(backend, agent)
    if isinstance(backend, SimOuterBackend):
        return SimOuter(backend)
    raise ValueError(f"backends.outer = {backend.type!r} needs backends.agent of the same type (RunConfig validates the pair)")


def probe_checks(config: RunConfig) -> list[BackendCheck]:
    """Compile checks of the configured train backend, so a job that would not run is caught by the probe."""
    if isinstance(config.backends.train, LocalTrainBackend):
        return [local_compile_problems]
    if isinstance(config.backends.train, RunpodTrainBackend):
        from metarl.backends.runpod.primerl.checks import primerl_compile_problems

        return [primerl_compile_problems]
    return []


def release_train_resources(config: RunConfig, run_id: str, database_url: str) -> int:
    """Give back what a finished run still holds on its train backend (Runpod pods); returns how many."""
    backend = config.backends.train
    if isinstance(backend, RunpodTrainBackend):
        return RunpodTrain(backend, config.artifacts.root, config.budget, runpod_runs(database_url), pod_eval=pod_eval_config(config)).release_run(run_id)
    return 0
