"""The task families' graders, defined once: partial credit, exact match, the format check and the length penalty.

Standard library only (``re``), and no import of metarl: the same file runs in three places.

- In metarl, :mod:`metarl.learning.families` grades with it (training rewards, hidden evals).
- In the sandbox (:mod:`metarl.sandbox`) it is importable by an environment module as ``metarl_graders``:
  the runner loads this file (bound read-only at ``/sandbox/metarl_graders.py`` under bubblewrap) before
  the audit hook, so the probe and the local trainer's reward session run the module with it.
- On a Runpod pod, each compiled environment package ships this file as ``metarl_graders.py``
  (:func:`metarl.backends.runpod.primerl.compiler.package_files`) and its ``__init__`` makes it
  importable as ``metarl_graders`` before the agent's module is imported.

The local agent's environment module (:func:`metarl.backends.local.agent.environment_source`) takes
its components from :func:`reward_components`, so its reward is the built-in training signal.
"""

from __future__ import annotations

import re
from collections.abc import Callable

GRADERS_MODULE = "metarl_graders"
"""The name under which an environment module imports this file (in the sandbox and on the pod)."""

MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")

MAX_ANSWER_CHARS = {"addition": 3, "reversal": 6, "caesar": 4, "max_of_list": 2, "sorting": 6, "date_format": 11}
"""Longest reference answer of each family (its format check's bound)."""

UNKNOWN_FAMILY_MAX_CHARS = 100
"""The format check's bound for a family this module does not know."""

RIGHT_ALIGNED_FAMILIES = frozenset({"addition"})
"""Families whose partial credit compares strings from the right (numbers)."""

REWARD_COMPONENTS = ("correctness", "exact", "format", "length_penalty")
"""The reward components of an inner job (job.toml ``[reward.components]``), in their canonical order."""

RewardComponent = Callable[[str, str, str], float]
"""A reward component: ``(prompt, completion, answer) -> float``."""

DATE_ANSWER = re.compile(r"\d{2} (" + "|".join(MONTH_NAMES) + r") \d{4}")


def normalize_completion(completion: str) -> str:
    """The completion as graded: surrounding whitespace removed."""
    return completion.strip()


def positional_similarity(expected: str, actual: str) -> float:
    """Fraction of positions (over the longer string) where the two strings agree."""
    longest = max(len(expected), len(actual))
    if longest == 0:
        return 1.0
    matches = sum(1 for left, right in zip(expected, actual) if left == right)
    return matches / longest


def right_aligned_similarity(expected: str, actual: str) -> float:
    """Positional similarity with both strings aligned at their last character (for numbers)."""
    return positional_similarity(expected[::-1], actual[::-1])


def similarity(family: str, answer: str, text: str) -> float:
    """Partial-credit similarity in [0, 1] between the answer and a normalised completion."""
    if family in RIGHT_ALIGNED_FAMILIES:
        return right_aligned_similarity(answer, text)
    return positional_similarity(answer, text)


def is_exact(answer: str, completion: str) -> bool:
    """True when the completion is exactly the reference answer (surrounding whitespace aside)."""
    return normalize_completion(completion) == answer


def grade(family: str, answer: str, completion: str) -> float:
    """Score in [0, 1]: 1 for an exact answer, otherwise half the partial-credit similarity."""
    if is_exact(answer, completion):
        return 1.0
    return 0.5 * similarity(family, answer, normalize_completion(completion))


def is_well_formed(family: str, completion: str) -> bool:
    """True when the completion has the shape of the family's answers (the format reward)."""
    text = normalize_completion(completion)
    limit = MAX_ANSWER_CHARS.get(family, UNKNOWN_FAMILY_MAX_CHARS)
    if family in ("addition", "sorting"):
        return text.isdigit() and len(text) <= limit
    if family in ("reversal", "caesar"):
        return text.isalpha() and len(text) <= limit
    if family == "max_of_list":
        return text.isdigit() and len(text) == limit
    if family == "date_format":
        return DATE_ANSWER.fullmatch(text) is not None
    return 0 < len(text) <= limit


def length_penalty(completion: str, max_tokens: int) -> float:
    """Minus the completion's share of ``max_tokens``, counted from the text: one token per character plus the end token."""
    return -min(1.0, (len(completion) + 1) / max_tokens)


def reward_components(family: str, max_tokens: int) -> dict[str, RewardComponent]:
    """The reward component functions ``(prompt, completion, answer) -> float`` of a family, by component name."""

    def correctness(prompt: str, completion: str, answer: str) -> float:
        return grade(family, answer, completion)

    def exact(prompt: str, completion: str, answer: str) -> float:
        return 1.0 if is_exact(answer, completion) else 0.0

    def well_formed(prompt: str, completion: str, answer: str) -> float:
        return 1.0 if is_well_formed(family, completion) else 0.0

    def penalty(prompt: str, completion: str, answer: str) -> float:
        return length_penalty(completion, max_tokens)

    return dict(zip(REWARD_COMPONENTS, (correctness, exact, well_formed, penalty)))
