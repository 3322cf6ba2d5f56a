"""The episode reward (docs/architecture.md, "The reward"), as small pure functions."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.run_config import EpisodeRewardWeights


class RewardInputs(BaseModel):
    """Everything the reward of one episode depends on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    passed_on_attempt: int | None = Field(default=None, ge=1, le=1000, description="Probe attempt that passed; None = never passed")
    max_probe_attempts: int = Field(ge=1, le=1000, description="Retry cap of the probe")
    agent_tokens: int = Field(ge=0, le=10**12, description="Agent tokens spent up to the passing submission")
    base_score: float | None = Field(default=None, ge=0.0, le=1.0, description="Hidden-eval score of the untrained base")
    trained_score: float | None = Field(default=None, ge=0.0, le=1.0, description="Hidden-eval score after training")
    train_seconds: float | None = Field(default=None, ge=0.0, le=10**9, description="Wall seconds of the inner job")
    train_budget_seconds: float = Field(gt=0.0, le=10**9, description="The task's wall-clock cap for one inner job")


class RewardBreakdown(BaseModel):
    """The reward and its components (each stored per episode)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    total: float = Field(ge=-1000.0, le=1000.0, description="Weighted sum")
    job: float = Field(ge=-1.0, le=1.0, description="Normalised hidden-eval improvement")
    validation: float = Field(ge=0.0, le=1.0, description="Credit for passing the probe early")
    efficiency: float = Field(ge=0.0, le=1.0, description="Credit for few agent tokens")
    speed: float = Field(ge=0.0, le=1.0, description="Credit for fast training, only when the job improved")
    raw_improvement: float | None = Field(default=None, ge=-1.0, le=1.0, description="trained - base on the hidden eval")


def job_credit(base_score: float, trained_score: float, min_headroom: float) -> float:
    """Share of the base model's headroom the job closed: 1 = solved, 0 = no change, negative = worse.

    The headroom is at least `min_headroom`: on a family the base model nearly solves, a change of one or two eval items
    would otherwise be worth +-1."""
    headroom = max(1.0 - base_score, min_headroom)
    return max(-1.0, min(1.0, (trained_score - base_score) / headroom))


def validation_credit(passed_on_attempt: int | None, decay: float) -> float:
    """1.0 for a first-try pass, times `decay` per extra attempt, 0 when the cap was hit."""
    if passed_on_attempt is None:
        return 0.0
    return decay ** (passed_on_attempt - 1)


def efficiency_credit(agent_tokens: int, token_scale: int, passed: bool) -> float:
    """Fewer agent tokens to a passing submission is better; halved at `token_scale` tokens."""
    if not passed:
        return 0.0
    return token_scale / (token_scale + agent_tokens)


def speed_credit(train_seconds: float | None, budget_seconds: float, improved: bool) -> float:
    """Share of the time budget left unused, only for a job that really improved the model."""
    if not improved or train_seconds is None:
        return 0.0
    return max(0.0, min(1.0, 1.0 - train_seconds / budget_seconds))


def compute_reward(inputs: RewardInputs, weights: EpisodeRewardWeights) -> RewardBreakdown:
    """Compose the episode reward from its components."""
    passed = inputs.passed_on_attempt is not None
    trained = passed and inputs.base_score is not None and inputs.trained_score is not None
    raw = (inputs.trained_score - inputs.base_score) if trained else None  # type: ignore[operator]
    job = job_credit(inputs.base_score, inputs.trained_score, weights.min_headroom) if trained else 0.0  # type: ignore[arg-type]
    validation = validation_credit(inputs.passed_on_attempt, weights.validation_decay)
    efficiency = efficiency_credit(inputs.agent_tokens, weights.token_scale, passed)
    speed = speed_credit(inputs.train_seconds, inputs.train_budget_seconds, improved=raw is not None and raw > 0)
    total = weights.job * job + weights.validation * validation + weights.efficiency * efficiency + weights.speed * speed
    return RewardBreakdown(total=total, job=job, validation=validation, efficiency=efficiency, speed=speed, raw_improvement=raw)
