"""Build the backend object for each stage from its config (`type` picks the implementation)."""

from __future__ import annotations

from metarl.backends.base import AgentBackend, EvalBackend, OuterBackend, TrainBackend
from metarl.backends.sim import SimAgent, SimEval, SimOuter, SimTrain
from schemas.run_config import Backends


def agent_backend(backends: Backends) -> AgentBackend:
    return SimAgent(backends.agent)


def train_backend(backends: Backends) -> TrainBackend:
    return SimTrain(backends.train)


def eval_backend(backends: Backends) -> EvalBackend:
    return SimEval(backends.eval)


def outer_backend(backends: Backends) -> OuterBackend:
    return SimOuter(backends.outer)
