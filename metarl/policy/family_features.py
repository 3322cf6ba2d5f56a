"""Features of a task family that the local policy conditions on, computed from what any family has.

The policy's context (``metarl.policy.job_language.context_tokens``) holds these features instead of
a family's name: the type and length of its answers, the length of its prompts, its grader kind,
its declared difficulty range and a hash of its description, each bucketed into a few tokens. A
family the policy never saw maps onto the same tokens, so it is always a valid context.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from statistics import fmean
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AnswerType = Literal["digits", "letters", "mixed", "text"]
ANSWER_TYPES: tuple[AnswerType, ...] = ("digits", "letters", "mixed", "text")
"""All ASCII digits; all letters; no whitespace but neither of those; anything with whitespace."""

ANSWER_LENGTH_BOUNDS: tuple[int, ...] = (2, 4, 8, 16)
"""Upper bounds (characters, inclusive) of the answer-length buckets; one more bucket holds longer answers."""

PROMPT_LENGTH_BOUNDS: tuple[int, ...] = (8, 16, 32, 64)
"""Upper bounds (characters, inclusive) of the prompt-length buckets; one more bucket holds longer prompts."""

GRADER_BUCKETS = 8
"""Hash buckets of the grader kind."""

DESCRIPTION_BUCKETS = 8
"""Hash buckets of the normalised description."""

DIFFICULTY_STEPS = 4
"""The declared difficulty range is rounded outwards to multiples of 1 / DIFFICULTY_STEPS."""

DEFAULT_GRADER_KIND = "builtin"
"""The grader kind of a family whose spec names none."""


class FamilyFeatures(BaseModel):
    """The bucketed features of one task family that the local policy sees in its context."""

    model_config = ConfigDict(frozen=True)

    answer_type: AnswerType = Field(description="What the answers are made of: digits, letters, mixed (no whitespace) or text.")
    answer_length: int = Field(ge=0, le=len(ANSWER_LENGTH_BOUNDS), description="Bucket of the mean answer length (index into ANSWER_LENGTH_BOUNDS).")
    prompt_length: int = Field(ge=0, le=len(PROMPT_LENGTH_BOUNDS), description="Bucket of the mean prompt length (index into PROMPT_LENGTH_BOUNDS).")
    grader: int = Field(ge=0, lt=GRADER_BUCKETS, description="Hash bucket of the grader kind.")
    difficulty_low: int = Field(ge=0, lt=DIFFICULTY_STEPS, description="Lowest declared difficulty, rounded down, in steps of 1/DIFFICULTY_STEPS.")
    difficulty_high: int = Field(ge=1, le=DIFFICULTY_STEPS, description="Highest declared difficulty, rounded up, in steps of 1/DIFFICULTY_STEPS.")
    description: int = Field(ge=0, lt=DESCRIPTION_BUCKETS, description="Hash bucket of the normalised description.")


def answer_type_of(answer: str) -> AnswerType:
    """The type of one answer."""
    if answer and all("0" <= character <= "9" for character in answer):
        return "digits"
    if answer.isalpha():
        return "letters"
    if answer and not any(character.isspace() for character in answer):
        return "mixed"
    return "text"


def family_answer_type(answers: Sequence[str]) -> AnswerType:
    """The type shared by every answer; ``text`` when any answer is text (or there are none), else ``mixed``."""
    kinds = {answer_type_of(answer) for answer in answers}
    if len(kinds) == 1:
        return kinds.pop()
    return "text" if not kinds or "text" in kinds else "mixed"


def length_bucket(lengths: Sequence[int], bounds: Sequence[int]) -> int:
    """Index of the first bound at or above the mean length (``len(bounds)`` above them all; 0 when there are no lengths)."""
    if not lengths:
        return 0
    mean = fmean(lengths)
    for index, bound in enumerate(bounds):
        if mean <= bound:
            return index
    return len(bounds)


def stable_bucket(text: str, buckets: int, salt: str) -> int:
    """A bucket in ``[0, buckets)`` from a SHA-256 of ``salt`` and the text: the same in every process."""
    digest = hashlib.sha256(f"{salt}\x1f{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % buckets


def normalised_description(description: str) -> str:
    """Lower case with runs of whitespace collapsed, so reflowing a description keeps its bucket."""
    return " ".join(description.lower().split())


def difficulty_buckets(low: float, high: float) -> tuple[int, int]:
    """The declared range rounded outwards to steps of 1/DIFFICULTY_STEPS: ``(low step, high step)`` with low < high.

    ``ValueError`` when the range is not within [0, 1] or low exceeds high.
    """
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"difficulty range ({low}, {high}) must satisfy 0 <= low <= high <= 1")
    low_step = min(math.floor(low * DIFFICULTY_STEPS), DIFFICULTY_STEPS - 1)
    high_step = max(math.ceil(high * DIFFICULTY_STEPS), low_step + 1)
    return low_step, high_step


def family_features(
    description: str,
    grader_kind: str = DEFAULT_GRADER_KIND,
    difficulty_range: tuple[float, float] = (0.0, 1.0),
    examples: Sequence[tuple[str, str]] = (),
) -> FamilyFeatures:
    """The features of a family from its description, grader kind, declared difficulty range and example (prompt, answer) items."""
    low, high = difficulty_buckets(*difficulty_range)
    return FamilyFeatures(
        answer_type=family_answer_type([answer for _, answer in examples]),
        answer_length=length_bucket([len(answer) for _, answer in examples], ANSWER_LENGTH_BOUNDS),
        prompt_length=length_bucket([len(prompt) for prompt, _ in examples], PROMPT_LENGTH_BOUNDS),
        grader=stable_bucket(grader_kind.strip().lower() or DEFAULT_GRADER_KIND, GRADER_BUCKETS, "grader"),
        difficulty_low=low,
        difficulty_high=high,
        description=stable_bucket(normalised_description(description), DESCRIPTION_BUCKETS, "description"),
    )


def _bucket_names(prefix: str, bounds: Sequence[int]) -> tuple[str, ...]:
    return tuple(f"{prefix}<={bound}" for bound in bounds) + (f"{prefix}>{bounds[-1]}",)


ANSWER_TYPE_TOKENS = tuple(f"ans={kind}" for kind in ANSWER_TYPES)
ANSWER_LENGTH_TOKENS = _bucket_names("alen", ANSWER_LENGTH_BOUNDS)
PROMPT_LENGTH_TOKENS = _bucket_names("plen", PROMPT_LENGTH_BOUNDS)
GRADER_TOKENS = tuple(f"grader={index}" for index in range(GRADER_BUCKETS))
DIFFICULTY_LOW_TOKENS = tuple(f"dlo={step / DIFFICULTY_STEPS}" for step in range(DIFFICULTY_STEPS))
DIFFICULTY_HIGH_TOKENS = tuple(f"dhi={step / DIFFICULTY_STEPS}" for step in range(1, DIFFICULTY_STEPS + 1))
DESCRIPTION_TOKENS = tuple(f"desc={index}" for index in range(DESCRIPTION_BUCKETS))

FEATURE_TOKENS: tuple[str, ...] = (
    ANSWER_TYPE_TOKENS + ANSWER_LENGTH_TOKENS + PROMPT_LENGTH_TOKENS + GRADER_TOKENS + DIFFICULTY_LOW_TOKENS + DIFFICULTY_HIGH_TOKENS + DESCRIPTION_TOKENS
)
"""Every feature token, in vocabulary order."""

FEATURE_TOKEN_COUNT = 7
"""Feature tokens in one context (one per feature)."""


def feature_tokens(features: FamilyFeatures) -> tuple[str, ...]:
    """The context's feature tokens, one per feature, in a fixed order."""
    return (
        ANSWER_TYPE_TOKENS[ANSWER_TYPES.index(features.answer_type)],
        ANSWER_LENGTH_TOKENS[features.answer_length],
        PROMPT_LENGTH_TOKENS[features.prompt_length],
        GRADER_TOKENS[features.grader],
        DIFFICULTY_LOW_TOKENS[features.difficulty_low],
        DIFFICULTY_HIGH_TOKENS[features.difficulty_high - 1],
        DESCRIPTION_TOKENS[features.description],
    )
