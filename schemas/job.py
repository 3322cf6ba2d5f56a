"""`job.toml`: the training job a trainer agent writes into its workspace.

Hyperparameters left out mean "backend default"; whether a job sets them explicitly is tracked.
Learning rate and kl_coef defaults depend on the train backend (:data:`TRAIN_DEFAULTS`): the CPU
stand-in's tiny models and prime-rl's real ones on GPUs need different ones.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from schemas.base import StrictModel

WORKSPACE_FILE = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"


class JobModel(StrictModel):
    """Which base model to train and how."""

    name: str = Field(min_length=1, max_length=200, description="Base model id, e.g. Qwen/Qwen3-0.6B")
    lora_rank: int = Field(default=0, ge=0, le=256, description="LoRA rank; 0 trains all weights")


class JobTraining(StrictModel):
    """Optimiser and loop settings (None = backend default)."""

    learning_rate: float | None = Field(
        default=None, gt=0, le=1.0, description="Learning rate (backend default: local 1e-3; runpod/prime-rl 3e-6 full fine-tuning, 1e-4 LoRA)"
    )
    max_steps: int | None = Field(default=None, ge=1, le=100_000, description="Optimiser steps")
    batch_size: int | None = Field(default=None, ge=1, le=65_536, description="Rollouts per step (divisible by group_size)")
    group_size: int | None = Field(default=None, ge=1, le=1024, description="Samples per prompt for group-relative advantages")
    kl_coef: float | None = Field(
        default=None,
        ge=0,
        le=10.0,
        description=(
            "Regulariser weight; what it regularises depends on the train backend. local (CPU): the k3 KL penalty to the base "
            "model. runpod (prime-rl v0.8.0): [trainer.loss] kl_tau, the weight of (trainer logprob - inference logprob)^2 per "
            "token, which keeps the trained policy near the policy that sampled the rollouts; prime-rl has no KL to the base model"
        ),
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Random seed of the inner job")


class JobRollout(StrictModel):
    """Sampling settings during training (None = backend default)."""

    temperature: float | None = Field(default=None, gt=0, le=5.0, description="Sampling temperature")
    max_tokens: int | None = Field(default=None, ge=1, le=32_768, description="Max completion tokens per rollout")


class JobReward(StrictModel):
    """Reward components of the environment and their weights."""

    components: dict[str, float] = Field(
        default_factory=lambda: {"correctness": 1.0},
        min_length=1,
        max_length=8,
        description="Component name -> weight (names from the environment's rubric)",
    )

    @model_validator(mode="after")
    def _check_weights(self) -> JobReward:
        for name, weight in self.components.items():
            if not (-10.0 <= weight <= 10.0):
                raise ValueError(f"weight of component {name!r} is {weight}; keep weights within [-10, 10]")
        if all(weight <= 0 for weight in self.components.values()):
            raise ValueError("at least one reward component needs a positive weight")
        return self


class JobDataset(StrictModel):
    """The dataset file shipped in the workspace."""

    path: str = Field(default="dataset.jsonl", pattern=WORKSPACE_FILE, description="Dataset file name inside the workspace")
    size: int = Field(default=1000, ge=1, le=1_000_000, description="Number of examples")
    difficulty: float = Field(default=0.5, ge=0.0, le=1.0, description="Generator difficulty, 0 = easiest")


class JobEnvironment(StrictModel):
    """The environment/reward module in the workspace."""

    module: str = Field(default="environment.py", pattern=WORKSPACE_FILE, description="Python file defining the rubric")


DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_MAX_STEPS = 40
DEFAULT_BATCH_SIZE = 64
DEFAULT_GROUP_SIZE = 8
DEFAULT_KL_COEF = 0.0
DEFAULT_TEMPERATURE = 1.0
DEFAULT_MAX_TOKENS = 16


class TrainDefaults(StrictModel):
    """The hyperparameters whose default depends on the train backend (the others are the same everywhere,
    so the probe's budget checks do not need to know the backend)."""

    learning_rate: float = Field(gt=0, le=1.0, description="Learning rate when the job trains all weights")
    lora_learning_rate: float = Field(gt=0, le=1.0, description="Learning rate when the job trains a LoRA (model.lora_rank > 0)")
    kl_coef: float = Field(ge=0, le=10.0, description="training.kl_coef (see its description for what it weighs on each backend)")


CPU_TRAIN_DEFAULTS = TrainDefaults(learning_rate=DEFAULT_LEARNING_RATE, lora_learning_rate=DEFAULT_LEARNING_RATE, kl_coef=DEFAULT_KL_COEF)
"""The local CPU stand-in (and the simulator): tiny models that learn at 1e-3 within a minute; no KL by default."""

PRIME_RL_TRAIN_DEFAULTS = TrainDefaults(learning_rate=3e-6, lora_learning_rate=1e-4, kl_coef=1e-3)
"""Runpod inner jobs on prime-rl v0.8.0, from the tag's own configs: full fine-tuning at 3e-6
(examples/basic/reverse-text/rl.toml, configs/ci/integration/reverse-text/start.toml,
configs/debug/algo/grpo.toml), LoRA at 1e-4 (configs/debug/algo/opd_lora.toml and
sft_distill_lora.toml, rank 8); kl_coef is compiled to kl_tau and defaults to the tag's own
DefaultLossConfig.kl_tau (1e-3), written explicitly so a default job does not depend on it."""

TRAIN_DEFAULTS: dict[str, TrainDefaults] = {"local": CPU_TRAIN_DEFAULTS, "sim": CPU_TRAIN_DEFAULTS, "runpod": PRIME_RL_TRAIN_DEFAULTS}
"""Defaults by ``backends.train.type``."""


def train_defaults(train_backend: str) -> TrainDefaults:
    """The defaults a train backend fills in (KeyError for an unknown backend type)."""
    return TRAIN_DEFAULTS[train_backend]


class ResolvedTraining(StrictModel):
    """Training settings of a job with every default filled in."""

    learning_rate: float = Field(gt=0, le=1.0, description="Learning rate")
    max_steps: int = Field(ge=1, le=100_000, description="Optimiser steps")
    batch_size: int = Field(ge=1, le=65_536, description="Rollouts per step")
    group_size: int = Field(ge=1, le=1024, description="Samples per prompt")
    kl_coef: float = Field(ge=0, le=10.0, description="Regulariser weight (see JobTraining.kl_coef)")
    temperature: float = Field(gt=0, le=5.0, description="Sampling temperature")
    max_tokens: int = Field(ge=1, le=32_768, description="Max completion tokens")

    @property
    def rollout_tokens(self) -> int:
        return self.max_steps * self.batch_size * self.max_tokens


class JobSpec(StrictModel):
    """A complete inner training job as written in `job.toml`."""

    TUNABLE_COUNT: ClassVar[int] = 7

    model: JobModel
    training: JobTraining = Field(default_factory=JobTraining)
    rollout: JobRollout = Field(default_factory=JobRollout)
    reward: JobReward = Field(default_factory=JobReward)
    dataset: JobDataset = Field(default_factory=JobDataset)
    environment: JobEnvironment = Field(default_factory=JobEnvironment)

    def resolved(self, defaults: TrainDefaults = CPU_TRAIN_DEFAULTS) -> ResolvedTraining:
        """Hyperparameters with defaults filled in: learning rate and kl_coef from the train backend's
        ``defaults`` (the CPU stand-in's unless given), the rest the same on every backend."""
        default_lr = defaults.lora_learning_rate if self.model.lora_rank > 0 else defaults.learning_rate
        return ResolvedTraining(
            learning_rate=self.training.learning_rate if self.training.learning_rate is not None else default_lr,
            max_steps=self.training.max_steps if self.training.max_steps is not None else DEFAULT_MAX_STEPS,
            batch_size=self.training.batch_size if self.training.batch_size is not None else DEFAULT_BATCH_SIZE,
            group_size=self.training.group_size if self.training.group_size is not None else DEFAULT_GROUP_SIZE,
            kl_coef=self.training.kl_coef if self.training.kl_coef is not None else defaults.kl_coef,
            temperature=self.rollout.temperature if self.rollout.temperature is not None else DEFAULT_TEMPERATURE,
            max_tokens=self.rollout.max_tokens if self.rollout.max_tokens is not None else DEFAULT_MAX_TOKENS,
        )

    def explicit_hyperparameters(self) -> int:
        """How many tunable hyperparameters the job sets explicitly rather than leaving to defaults."""
        values = [
            self.training.learning_rate,
            self.training.max_steps,
            self.training.batch_size,
            self.training.group_size,
            self.training.kl_coef,
            self.rollout.temperature,
            self.rollout.max_tokens,
        ]
        return sum(value is not None for value in values)
