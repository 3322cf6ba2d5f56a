"""Where a task's family features come from: the one place that reads a task spec and its family for the local policy.

``task_features`` takes the description from the spec's ``[public]`` table and example items from
the family's generator (a fixed seed) plus the spec's public example; a family with no generator
here still gets features from its public example alone.
"""

from __future__ import annotations

import random

from metarl.learning.data_families import family_for
from metarl.learning.families import TaskFamily
from metarl.policy.family_features import DEFAULT_GRADER_KIND, FamilyFeatures, family_features
from schemas.task_spec import TaskSpec

FEATURE_SAMPLE_ITEMS = 32
"""Items drawn from the family's generator to measure its answers and prompts."""

FEATURE_SAMPLE_SEED = "policy-family-features"


def task_examples(task: TaskSpec, n: int = FEATURE_SAMPLE_ITEMS) -> list[tuple[str, str]]:
    """(prompt, answer) items of the task: ``n`` from its family's generator, difficulties spread over [0, 1], then its public example."""
    examples: list[tuple[str, str]] = []
    try:
        family: TaskFamily | None = family_for(task)
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


def task_grader_kind(task: TaskSpec) -> str:
    """The kind of the task's grader: the spec's ``[grader]``, else its registered family's own, else DEFAULT_GRADER_KIND."""
    if task.grader is not None:
        return task.grader.kind
    try:
        family = family_for(task)
    except KeyError:
        return DEFAULT_GRADER_KIND
    return str(family.grader.get("kind") or DEFAULT_GRADER_KIND)


def task_features(task: TaskSpec) -> FamilyFeatures:
    """The features the local policy sees for ``task``: its grader's kind, its declared difficulty range
    (``[data] difficulty_range``), its examples and its description."""
    return family_features(task.public.description, task_grader_kind(task), task.data.difficulty_range, task_examples(task))
