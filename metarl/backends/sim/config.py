"""Config models of the SIMULATOR backends (`type = "sim"` in every stage)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from schemas.backend_config import AgentBackendConfig, EvalBackendConfig, OuterBackendConfig, TrainBackendConfig
from schemas.base import StrictModel


class SimDuration(StrictModel):
    """Lognormal duration of a simulated stage, in simulated-cloud seconds."""

    median_s: float = Field(default=0.2, ge=0.0, le=7 * 24 * 3600, description="Median duration in seconds")
    sigma: float = Field(default=0.5, ge=0.0, le=5.0, description="Lognormal sigma (0 = always the median)")
    max_s: float = Field(default=30.0, ge=0.0, le=7 * 24 * 3600, description="Upper clamp of one duration")

    @model_validator(mode="after")
    def _median_within_clamp(self) -> SimDuration:
        if self.median_s > self.max_s:
            raise PydanticCustomError(
                "duration_range",
                "median_s {median} is above max_s {max}: every duration would be clamped to max_s",
                {
                    "median": self.median_s,
                    "max": self.max_s,
                    "fix": f"make median_s at most max_s (raise max_s to {self.median_s:g} or more, or lower median_s)",
                },
            )
        return self


class SimAgentBackend(AgentBackendConfig):
    """SIMULATOR of a trainer agent: writes real job.toml text, some of it invalid on purpose."""

    type: Literal["sim"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.sim.simulator:SimAgent"
    planner: ClassVar[str] = "metarl.backends.sim.plan:agent_plan"
    duration: SimDuration = Field(default_factory=SimDuration, description="Time one agent attempt takes")
    invalid_rate: float = Field(default=0.3, ge=0.0, le=1.0, description="Chance an untrained simulated agent writes an invalid job")
    invalid_decay: float = Field(default=0.8, ge=0.0, le=1.0, description="invalid_rate multiplier per policy version")
    tokens_mean: int = Field(default=1500, ge=1, le=10_000_000, description="Mean policy tokens per attempt")
    usd_per_million_tokens: float = Field(default=0.0, ge=0.0, le=1000.0, description="Simulated token price")


class SimTrainBackend(TrainBackendConfig):
    """SIMULATOR of a GPU cloud running inner jobs: durations, failures, prices; never real training."""

    type: Literal["sim"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.sim.simulator:SimTrain"
    planner: ClassVar[str] = "metarl.backends.sim.plan:train_plan"
    weights: ClassVar[str] = "simulated"
    duration: SimDuration = Field(default_factory=lambda: SimDuration(median_s=0.5), description="Inner job duration")
    failure_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="Chance a launched job fails")
    capacity_error_rate: float = Field(default=0.0, ge=0.0, le=1.0, description="Chance a launch hits a capacity error")
    usd_per_hour: float = Field(default=0.88, ge=0.0, le=1000.0, description="Simulated price of one pod (2x A40) per hour")
    max_concurrent_jobs: int = Field(default=16, ge=1, le=10_000, description="Simulated pods available at once")
    poll_interval_s: float = Field(default=0.2, ge=0.01, le=3600, description="Seconds between polls of a running job")


class SimEvalBackend(EvalBackendConfig):
    """SIMULATOR of the hidden-eval scorer: scores derived from the job with seeded noise."""

    type: Literal["sim"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.sim.simulator:SimEval"
    planner: ClassVar[str] = "metarl.backends.sim.plan:eval_plan"
    scores: ClassVar[frozenset[str]] = frozenset({"simulated", "local", "runpod"})
    duration: SimDuration = Field(default_factory=lambda: SimDuration(median_s=0.1), description="Eval duration")
    noise: float = Field(default=0.03, ge=0.0, le=1.0, description="Std-dev of score noise")


class SimOuterBackend(OuterBackendConfig):
    """SIMULATOR of the outer policy update: bumps the version and records the batch statistics."""

    type: Literal["sim"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.sim.simulator:SimOuter"
    planner: ClassVar[str] = "metarl.backends.sim.plan:outer_plan"
    duration: SimDuration = Field(default_factory=lambda: SimDuration(median_s=0.1), description="Update duration")


CONFIGS = (SimAgentBackend, SimTrainBackend, SimEvalBackend, SimOuterBackend)
