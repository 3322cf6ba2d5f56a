"""Where a task's family features come from: the one place that reads a task spec and its family for the local policy.

``task_features`` takes the description from the spec's ``[public]`` table and example items from
the family's generator (a fixed seed) plus the spec's public example; a family with no generator
here still gets features from its public example alone.
"""

from __future__ import annotations

import random

from metarl.learning.families import get_family
from metarl.policy.family_features import DEFAULT_GRADER_KIND, FamilyFeatures, family_features
from schemas.task_spec import TaskSpec

FEATURE_SAMPLE_ITEMS = 32
"""Items drawn from the family's generator to measure its answers and prompts."""

FEATURE_SAMPLE_SEED = "policy-family-features"


def task_examples(task: TaskSpec, n: int = FEATURE_SAMPLE_ITEMS) -> list[tuple[str, str]]:
    """(prompt, answer) items of the task: ``n`` from its family's generator, difficulties spread over [0, 1], then its public example."""
    examples: list[tuple[str, str]] = []
    try:
        family = get_family(task.family)
    except KeyError:
        family = None
    if family is not None:
        rng = random.Random(f"{FEATURE_SAMPLE_SEED}\x1f{family.name}")
        for index in range(n):
            example = family.generate(rng, index / max(1, n - 1))
            examples.append((example.prompt, example.answer))
    if task.public.example_prompt and task.public.example_answer:
        examples.append((task.public.example_prompt, task.public.example_answer))
    return examples


def task_features(task: TaskSpec, grader_kind: str = DEFAULT_GRADER_KIND, difficulty_range: tuple[float, float] = (0.0, 1.0)) -> FamilyFeatures:
    """The features the local policy sees for ``task`` (grader kind and declared difficulty range as the spec gives them)."""
    return family_features(task.public.description, grader_kind, difficulty_range, task_examples(task))
