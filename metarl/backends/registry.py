"""Build the backend object for each stage from its config (`type` picks the implementation)."""

from __future__ import annotations

from metarl.backends.base import AgentBackend, EvalBackend, OuterBackend, TrainBackend
from metarl.backends.sim import SimAgent, SimEval, SimOuter, SimTrain
from pathlib import Path

from schemas.run_config import RunConfig


def agent_backend(config: RunConfig) -> AgentBackend:
    return SimAgent(config.backends.agent)


def train_backend(config: RunConfig) -> TrainBackend:
    return SimTrain(config.backends.train, Path(config.artifacts.root) / "sim-cloud")


def eval_backend(config: RunConfig) -> EvalBackend:
    return SimEval(config.backends.eval)


def outer_backend(config: RunConfig) -> OuterBackend:
    return SimOuter(config.backends.outer)
