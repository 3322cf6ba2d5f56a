"""The limits of one episode's job that the local policy sees and its job language keeps to.

TASK.md tells a trainer agent the training-time cap, the rollout budget, the allowed models and the
dataset limits (``metarl/workspace/task_md.py``). :class:`JobLimits` holds the same values for one
episode, and the rollout length that holds the task's longest answer (its examples, and its
grader's ``max_chars`` when the spec writes one, are in TASK.md too); :func:`limit_tokens` writes
the four TASK.md limits into the policy's context as a few bucketed tokens, and
:func:`rules_from_context` reads back, from those tokens alone, what the grammar needs to keep
every sampled job inside them (``metarl.policy.job_language``). The rollout budget's token is the
largest power of two at or below the budget, so a job the grammar allows never exceeds the real
budget (unless no job fits it at all: below 640 tokens the grammar keeps its smallest choices).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from schemas.task_spec import TaskSpec

TIME_BOUNDS: tuple[int, ...] = (10, 30, 90, 300)
"""Upper bounds (seconds, inclusive) of the training-time buckets; one more bucket holds longer caps."""

ROLLOUT_EXPONENTS: tuple[int, ...] = tuple(range(9, 31))
"""Rollout-budget tokens ``rbud=2^k``: k is the exponent of the largest power of two at or below the budget, clamped to this range."""

SIZE_BOUNDS: tuple[int, ...] = (32, 64, 256, 1000, 4000, 20000, 50000)
"""Dataset-size marks of the limit tokens (the job language's size grid)."""

LONGEST_ROLLOUT_TOKENS = 64
"""The most rollout tokens an answer's minimum asks for: the job language's largest `max_tokens` and the local trainer's bound
(`metarl/learning/grpo.py`, LocalTrainConfig.max_tokens)."""

MODEL_NAMES: tuple[str, ...] = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B")
"""The base models the job language can write (the order of its model slot)."""


class JobLimits(BaseModel):
    """What one episode's job must keep to: its task's budget and dataset limits, at the episode's training-time cap."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train_seconds: float = Field(gt=0, le=7 * 24 * 3600, description="Training-time cap of the episode's inner job (seconds)")
    max_rollout_tokens: int = Field(ge=1, le=10**12, description="Cap on max_steps x batch_size x max_tokens")
    allowed_models: tuple[str, ...] = Field(min_length=1, max_length=16, description="Base models the job may choose")
    min_dataset_size: int = Field(ge=1, le=1_000_000, description="Smallest dataset the job may ship")
    max_dataset_size: int = Field(ge=1, le=1_000_000, description="Largest dataset the job may ship")
    difficulty_range: tuple[float, float] = Field(description="Lowest and highest difficulty the job may ask for, within [0, 1]")
    min_max_tokens: int = Field(
        default=1,
        ge=1,
        le=LONGEST_ROLLOUT_TOKENS,
        description="Fewest rollout tokens that hold the task's longest answer and the end token (1 = no minimum)",
    )

    def dataset_size(self, size: int) -> int:
        """``size`` moved into the task's dataset range."""
        return min(max(int(size), self.min_dataset_size), self.max_dataset_size)

    def difficulty(self, difficulty: float) -> float:
        """``difficulty`` moved into the task's declared range."""
        low, high = self.difficulty_range
        return min(max(float(difficulty), low), high)

    def max_tokens(self, max_tokens: int) -> int:
        """``max_tokens`` raised to what the task's longest answer needs: a rollout cut shorter cannot be right."""
        return max(int(max_tokens), self.min_max_tokens)

    def max_steps_in_budget(self, max_steps: int, batch_size: int, max_tokens: int) -> int:
        """``max_steps`` lowered (to 1 at least) until max_steps x batch_size x max_tokens fits the rollout budget."""
        return min(int(max_steps), max(1, self.max_rollout_tokens // max(1, batch_size * max_tokens)))


def answer_max_tokens(longest_answer_bytes: int) -> int:
    """Rollout tokens that hold an answer of ``longest_answer_bytes`` UTF-8 bytes and the end token, at most LONGEST_ROLLOUT_TOKENS
    (a token holds one byte at least: the local trainer's tokenizer is a character, or a byte, per token, `metarl/learning/tokenizer.py`)."""
    return min(max(1, longest_answer_bytes + 1), LONGEST_ROLLOUT_TOKENS)


def job_limits(task: TaskSpec, train_seconds: float | None = None) -> JobLimits:
    """The limits of a job for ``task``; ``train_seconds`` is the episode's cap (default: the task's CPU cap)."""
    from metarl.policy.task_features import task_examples

    return JobLimits(
        train_seconds=task.budget.max_train_seconds if train_seconds is None else train_seconds,
        max_rollout_tokens=task.budget.max_rollout_tokens,
        allowed_models=tuple(task.budget.allowed_models),
        min_dataset_size=task.data.min_dataset_size,
        max_dataset_size=task.data.max_dataset_size,
        difficulty_range=task.data.difficulty_range,
        min_max_tokens=answer_max_tokens(longest_answer_bytes([answer for _, answer in task_examples(task)], declared_max_chars(task))),
    )


def declared_max_chars(task: TaskSpec) -> int:
    """The longest answer the spec's ``[grader]`` declares with an explicit ``max_chars`` (TASK.md shows it), else 0.

    A grader's default ``max_chars`` says nothing about the task's answers, so only a value written in the spec counts."""
    grader = task.grader
    if grader is None or "max_chars" not in grader.model_fields_set:
        return 0
    return int(getattr(grader, "max_chars", 0))


def longest_answer_bytes(answers: Sequence[str], declared_chars: int = 0) -> int:
    """UTF-8 bytes of the longest answer: the longest of ``answers``, or ``declared_chars`` characters at the widest
    bytes-per-character those answers use (1 when they are ASCII or there are none), whichever is longer."""
    sizes = [(len(answer.encode()), len(answer)) for answer in answers if answer]
    widest = max((size / chars for size, chars in sizes), default=1.0)
    return max(max((size for size, _ in sizes), default=0), math.ceil(declared_chars * widest))


def _bucket(value: float, bounds: Sequence[float]) -> int:
    for index, bound in enumerate(bounds):
        if value <= bound:
            return index
    return len(bounds)


def rollout_exponent(budget: int) -> int:
    """The exponent of the budget's token: floor(log2(budget)), clamped to ROLLOUT_EXPONENTS."""
    exponent = int(math.floor(math.log2(max(1, budget))))
    return min(max(exponent, ROLLOUT_EXPONENTS[0]), ROLLOUT_EXPONENTS[-1])


TIME_TOKENS = tuple(f"time<={bound}" for bound in TIME_BOUNDS) + (f"time>{TIME_BOUNDS[-1]}",)
ROLLOUT_TOKENS = tuple(f"rbud=2^{exponent}" for exponent in ROLLOUT_EXPONENTS)
MODEL_TOKENS = tuple(f"allow={name}" for name in MODEL_NAMES)
SIZE_LOW_TOKENS = tuple(f"dmin>={bound}" for bound in SIZE_BOUNDS)
SIZE_HIGH_TOKENS = tuple(f"dmax<={bound}" for bound in SIZE_BOUNDS)

LIMIT_TOKENS: tuple[str, ...] = TIME_TOKENS + ROLLOUT_TOKENS + MODEL_TOKENS + SIZE_LOW_TOKENS + SIZE_HIGH_TOKENS
"""Every limit token, in vocabulary order."""

MAX_LIMIT_TOKEN_COUNT = 4 + len(MODEL_NAMES)
"""Limit tokens in one context at most: time, budget, one per allowed model, dataset low and high."""


def limit_tokens(limits: JobLimits) -> tuple[str, ...]:
    """The context's limit tokens, in a fixed order.

    ``dmin>=v``: the largest size mark at or below the smallest allowed size; ``dmax<=v``: the smallest mark
    at or above the largest allowed size (marks clamped to the ends of SIZE_BOUNDS).
    """
    low = max([index for index, bound in enumerate(SIZE_BOUNDS) if bound <= limits.min_dataset_size], default=0)
    high = min([index for index, bound in enumerate(SIZE_BOUNDS) if bound >= limits.max_dataset_size], default=len(SIZE_BOUNDS) - 1)
    return (
        TIME_TOKENS[_bucket(limits.train_seconds, TIME_BOUNDS)],
        f"rbud=2^{rollout_exponent(limits.max_rollout_tokens)}",
        *(token for name, token in zip(MODEL_NAMES, MODEL_TOKENS) if name in limits.allowed_models),
        SIZE_LOW_TOKENS[low],
        SIZE_HIGH_TOKENS[high],
    )


@dataclass(frozen=True)
class ContextRules:
    """What the grammar keeps a job to, read from its context: the models it may write, a rollout-token bound (None: none)."""

    models: frozenset[str] = frozenset(MODEL_NAMES)
    rollout_bound: int | None = None


def rules_from_context(context: Sequence[str]) -> ContextRules:
    """The rules of a context's limit tokens; a context without them (or allowing none of the job language's models) leaves that rule open."""
    models = frozenset(name for name, token in zip(MODEL_NAMES, MODEL_TOKENS) if token in context)
    bound = None
    for token in context:
        if token.startswith("rbud=2^"):
            bound = 2 ** int(token.removeprefix("rbud=2^"))
    return ContextRules(models=models or frozenset(MODEL_NAMES), rollout_bound=bound)
