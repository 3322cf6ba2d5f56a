"""Each built-in grader kind of metarl/graders.py with its options (schemas/graders.py validates them)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from metarl import graders
from schemas.graders import GraderSpec

SPEC: TypeAdapter[Any] = TypeAdapter(GraderSpec)


def grader(**options: Any) -> dict[str, Any]:
    return SPEC.validate_python(options).model_dump()


def test_exact_match_with_and_without_case() -> None:
    strict, folded = grader(kind="exact"), grader(kind="exact", case_sensitive=False)
    assert graders.grade(strict, "Paris", " Paris\n") == 1.0 and graders.grade(strict, "Paris", "paris") == 0.0
    assert graders.grade(folded, "Paris", "PARIS") == 1.0 and graders.grade(folded, "Paris", "Pari") == 0.0


def test_numeric_with_tolerances() -> None:
    absolute, relative = grader(kind="numeric", tolerance=0.5), grader(kind="numeric", relative_tolerance=0.1)
    assert graders.grade(absolute, "3.0", "3.4") == 1.0 and graders.grade(absolute, "3", "2.4") < 1.0
    assert graders.grade(relative, "100", "109") == 1.0 and graders.grade(relative, "100", "120") == pytest.approx(0.5 * 0.8)
    assert graders.grade(absolute, "3", "three") == 0.0 and not graders.is_well_formed(absolute, "three") and graders.is_well_formed(absolute, "-1e3")


def test_positional_and_right_aligned_partial_credit() -> None:
    positional = grader(kind="positional", partial_credit=1.0)
    digits = grader(kind="right_aligned_digits", max_chars=3)
    assert graders.grade(positional, "abcd", "abxd") == 0.75
    assert graders.grade(digits, "123", "23") == pytest.approx(0.5 * 2 / 3)
    assert graders.is_well_formed(digits, "123") and not graders.is_well_formed(digits, "1234") and not graders.is_well_formed(digits, "1a")


def test_unordered_set_and_sorted_list() -> None:
    unordered, ordered = grader(kind="unordered_set", separator=";"), grader(kind="sorted_list")
    assert graders.grade(unordered, "a;b;c", "c; a;b") == 1.0 and graders.grade(unordered, "a;b;c", "a;b;d") == pytest.approx(0.5 * 2 / 4)
    assert graders.grade(ordered, "3,1,2", "1,2,3") == 1.0 and graders.grade(ordered, "3,1,2", "1,3,2") == pytest.approx(0.5 / 3)


def test_one_of_n_choices() -> None:
    choice = grader(kind="choice", choices=["yes", "no", "maybe"])
    assert graders.grade(choice, "yes", "YES") == 1.0 and graders.grade(choice, "yes", "no") == 0.0
    assert graders.is_well_formed(choice, "Maybe") and not graders.is_well_formed(choice, "perhaps")


def test_regex_extraction_before_grading() -> None:
    extract = grader(kind="regex_extract", pattern=r"answer:\s*(-?\d+)", group=1, inner={"kind": "numeric", "tolerance": 0})
    assert graders.grade(extract, "42", "I think... answer: 42.") == 1.0
    assert graders.grade(extract, "42", "answer: 40") == pytest.approx(0.5 * (1 - 2 / 42))
    assert graders.grade(extract, "42", "42") == 0.0 and not graders.is_well_formed(extract, "no answer")
    components = graders.reward_components("anything", 16, extract)
    assert components["correctness"]("p", "answer: 42", "42") == 1.0 and components["format"]("p", "answer: 7", "42") == 1.0


@pytest.mark.parametrize(
    ("options", "where"),
    [
        ({"kind": "numeric", "tolerance": -1}, "tolerance"),
        ({"kind": "positional", "partial_credit": 1.5}, "partial_credit"),
        ({"kind": "choice", "choices": ["only"]}, "choices"),
        ({"kind": "regex_extract", "pattern": "(", "inner": {"kind": "exact"}}, "pattern"),
        ({"kind": "regex_extract", "pattern": "a(b)", "group": 2, "inner": {"kind": "exact"}}, "group 2"),
        ({"kind": "exact", "format_pattern": "["}, "format_pattern"),
        ({"kind": "fuzzy"}, "kind"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as raised:
        SPEC.validate_python(options)
    assert where in str(raised.value) or where == "kind"


def test_the_six_families_graders_are_valid_specs() -> None:
    for name, mapping in graders.BUILTIN_GRADERS.items():
        assert {key: value for key, value in grader(**mapping).items() if key in mapping} == mapping, name
