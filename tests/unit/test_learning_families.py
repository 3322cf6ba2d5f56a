"""Task families: generation, grading, registry and hidden-eval disjointness."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metarl.graders import positional_similarity, right_aligned_similarity
from metarl.learning.families import Example, generate_dataset, in_eval_partition
from metarl.learning.registry import FAMILIES, contaminated_prompts, get_family, hidden_eval_overlap, is_hidden_eval_item

FAMILY_NAMES = sorted(FAMILIES)


def test_there_are_six_families_with_descriptions() -> None:
    assert len(FAMILIES) == 6
    for name, family in FAMILIES.items():
        assert family.name == name
        assert len(family.description) > 40


def test_get_family_names_valid_choices_on_error() -> None:
    with pytest.raises(KeyError) as raised:
        get_family("nope")
    for name in FAMILY_NAMES:
        assert name in str(raised.value)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_reference_answer_grades_one_and_is_well_formed(name: str) -> None:
    family = get_family(name)
    rng = random.Random(0)
    for index in range(200):
        example = family.generate(rng, index / 199)
        assert family.grade(example, example.answer) == 1.0
        assert family.grade(example, f"  {example.answer} ") == 1.0
        assert family.is_well_formed(example.answer)
        assert len(example.answer) <= family.max_answer_chars


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_wrong_answers_grade_below_one_and_within_bounds(name: str) -> None:
    family = get_family(name)
    rng = random.Random(1)
    for _ in range(100):
        example = family.generate(rng, rng.random())
        for completion in ("", "x", example.answer + "9", example.answer[::-1] + "z", "0" * 20):
            grade = family.grade(example, completion)
            assert 0.0 <= grade < 1.0


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_generation_is_deterministic_per_seed(name: str) -> None:
    family = get_family(name)
    first = generate_dataset(family, 50, seed=7, difficulty=(0.0, 1.0))
    second = generate_dataset(family, 50, seed=7, difficulty=(0.0, 1.0))
    assert first == second
    assert first != generate_dataset(family, 50, seed=8, difficulty=(0.0, 1.0))


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_hidden_eval_is_deterministic_distinct_and_versioned(name: str) -> None:
    family = get_family(name)
    items = family.hidden_eval(200, version=1)
    assert items == family.hidden_eval(200, version=1)
    assert len({family.item_key(item.prompt) for item in items}) == 200
    assert items[:50] != family.hidden_eval(50, version=2)
    assert all(family.is_hidden_eval_item(item.prompt) for item in items)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_training_items_never_hit_the_hidden_eval(name: str) -> None:
    family = get_family(name)
    hidden_keys = {family.item_key(item.prompt) for version in (1, 2) for item in family.hidden_eval(300, version)}
    for seed in range(5):
        for example in generate_dataset(family, 2000, seed=seed, difficulty=(0.0, 1.0)):
            assert family.item_key(example.prompt) not in hidden_keys
            assert not family.is_hidden_eval_item(example.prompt)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_contamination_helper_flags_hidden_items_even_reformatted(name: str) -> None:
    family = get_family(name)
    hidden = [item.prompt for item in family.hidden_eval(20)]
    clean = [item.prompt for item in generate_dataset(family, 20, seed=3, difficulty=0.5)]
    reformatted = [prompt.upper().replace(" ", "  ") for prompt in hidden]
    assert contaminated_prompts(name, clean) == []
    assert contaminated_prompts(family, hidden + clean) == hidden
    assert all(is_hidden_eval_item(name, prompt) for prompt in reformatted)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_set_based_overlap_finds_exactly_the_drawn_eval_items(name: str) -> None:
    family = get_family(name)
    hidden = [item.prompt for item in family.hidden_eval(30)]
    clean = [item.prompt for item in generate_dataset(family, 200, seed=4, difficulty=(0.0, 1.0))]
    assert hidden_eval_overlap(family, clean + hidden, n=30) == hidden
    assert hidden_eval_overlap(name, [prompt.replace(" ", "") for prompt in hidden[:3]], n=30, version=1) == [prompt.replace(" ", "") for prompt in hidden[:3]]


def test_addition_key_is_order_insensitive() -> None:
    family = get_family("addition")
    assert family.item_key("add 12+34=") == family.item_key("add 34+12=")


def test_partition_has_expected_share() -> None:
    keys = [f"k{index}" for index in range(8000)]
    share = sum(in_eval_partition("any", key) for key in keys) / len(keys)
    assert 0.10 < share < 0.15


def test_similarity_helpers() -> None:
    assert positional_similarity("abcd", "abxd") == 0.75
    assert positional_similarity("ab", "abcd") == 0.5
    assert positional_similarity("", "") == 1.0
    assert right_aligned_similarity("123", "23") == pytest.approx(2 / 3)


def test_partial_credit_examples() -> None:
    addition = get_family("addition")
    example = Example(prompt="add 15+27=", answer="42")
    assert addition.grade(example, "42") == 1.0
    assert addition.grade(example, "32") == 0.25
    assert addition.grade(example, "x") == 0.0
    max_of_list = get_family("max_of_list")
    assert max_of_list.grade(Example(prompt="max 12,81=", answer="81"), "82") == 0.25


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(FAMILY_NAMES), completion=st.text(max_size=30))
def test_grade_is_always_in_unit_interval(name: str, completion: str) -> None:
    family = get_family(name)
    example = family.generate(random.Random(len(completion)), 0.5)
    assert 0.0 <= family.grade(example, completion) <= 1.0
