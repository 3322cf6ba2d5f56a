"""Which families a task's base model is built for, and what the local policy sees of a new family."""

from __future__ import annotations

from pathlib import Path

from metarl.backends.local.config import LocalEvalBackend
from metarl.backends.local.train import LocalEval
from metarl.learning.data_families import model_families
from metarl.learning.registry import FAMILIES
from metarl.policy.job_language import TOKEN_ID, context_for_task
from metarl.policy.task_features import task_features, task_grader_kind
from metarl.runconfig import load_task_spec

REPO = Path(__file__).resolve().parents[2]
CAPITALS = REPO / "tests" / "fixtures" / "families" / "capitals" / "capitals.toml"
ADDITION = REPO / "tasks_specs" / "addition.toml"


def test_a_built_in_task_keeps_the_built_in_family_set() -> None:
    assert sorted(model_families(load_task_spec(ADDITION))) == sorted(FAMILIES)


def test_a_new_family_joins_the_built_in_ones() -> None:
    families = model_families(load_task_spec(CAPITALS))
    assert sorted(families) == sorted([*FAMILIES, "capitals"])


def test_a_new_familys_base_model_has_its_own_build() -> None:
    config = LocalEvalBackend(type="local")
    built_in = LocalEval.base_model_identity(config, "local-s", load_task_spec(ADDITION))
    also_built_in = LocalEval.base_model_identity(config, "local-s", load_task_spec(REPO / "tasks_specs" / "sorting.toml"))
    new = LocalEval.base_model_identity(config, "local-s", load_task_spec(CAPITALS))
    assert built_in.build == also_built_in.build
    assert new.build != built_in.build and new.build.startswith("local-s-")


def test_the_policy_sees_the_specs_grader_kind_and_examples_of_a_data_defined_family() -> None:
    capitals = load_task_spec(CAPITALS)
    features = task_features(capitals)
    assert features != task_features(load_task_spec(ADDITION))
    assert features.answer_type == "letters"
    tokens = context_for_task(capitals, 1, ())
    assert all(0 <= token < len(TOKEN_ID) for token in tokens) and len(tokens) == len(context_for_task(load_task_spec(ADDITION), 1, ()))


def test_the_policy_sees_the_declared_difficulty_range_and_the_registered_familys_grader_kind() -> None:
    addition = load_task_spec(ADDITION)
    narrow = addition.model_copy(update={"data": addition.data.model_copy(update={"difficulty_range": (0.0, 0.25)})})
    assert (task_features(narrow).difficulty_low, task_features(narrow).difficulty_high) == (0, 1)
    assert (task_features(addition).difficulty_low, task_features(addition).difficulty_high) == (0, 4)
    assert task_grader_kind(addition) == "right_aligned_digits"
    assert task_grader_kind(load_task_spec(REPO / "tasks_specs" / "sorting.toml")) == "positional"
    assert task_grader_kind(load_task_spec(CAPITALS)) == load_task_spec(CAPITALS).grader.kind  # type: ignore[union-attr]
