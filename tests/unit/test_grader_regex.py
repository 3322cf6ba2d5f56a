"""Issue 40, item 7: graders' regular expressions run in linear time. `regex_extract` with
`pattern = "^(a+)+$"` took 15 s on a 29-character answer, and the same grader scores model output on
every rollout; now RE2 runs it in metarl's processes and a pure-Python Pike VM (metarl.graders.LinearPattern)
where google-re2 cannot be imported (the sandbox, a pod image without it). A pattern RE2 cannot compile
(backreferences, lookaround) is refused when the spec is loaded, naming the field and the fix."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import re2

from metarl import graders
from metarl.graders import LinearPattern, PatternError, compiled_pattern
from schemas.base import ConfigError, validate_model
from schemas.task_spec import TaskSpec

EVIL = {"kind": "regex_extract", "pattern": "^(a+)+$", "inner": {"kind": "exact"}}
ANSWER_29 = "a" * 28 + "!"
GRADERS_FILE = Path(graders.__file__)


def test_the_issue_pattern_grades_a_29_character_answer_at_once() -> None:
    started = time.perf_counter()
    assert graders.grade(EVIL, ANSWER_29, ANSWER_29) == 0.0
    assert not graders.is_well_formed(EVIL, ANSWER_29)
    assert graders.grade(EVIL, "a" * 28, "a" * 28) == 1.0
    assert time.perf_counter() - started < 1.0


def test_the_fallback_engine_is_linear_too() -> None:
    started = time.perf_counter()
    pattern = LinearPattern("^(a+)+$")
    assert pattern.search("a" * 5000 + "!") is None
    assert pattern.search("a" * 29).group(1) == "a" * 29  # type: ignore[union-attr]
    assert time.perf_counter() - started < 5.0


def test_graders_on_a_bare_interpreter_use_the_fallback_and_stay_fast() -> None:
    """As in the sandbox (python -I -S: no site-packages, so no re2) and on a pod image without google-re2."""
    code = (
        f"ns = {{'__name__': 'metarl_graders'}}; exec(compile(open({str(GRADERS_FILE)!r}).read(), 'g', 'exec'), ns)\n"
        "import time; started = time.perf_counter()\n"
        f"grader = {EVIL!r}\n"
        f"print(ns['_re2'] is None, ns['grade'](grader, {ANSWER_29!r}, {ANSWER_29!r}), ns['grade'](grader, 'aaa', 'aaa'), round(time.perf_counter() - started, 3))"
    )
    run = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    fallback, evil, good, seconds = run.stdout.split()
    assert (fallback, evil, good) == ("True", "0.0", "1.0") and float(seconds) < 2.0, run.stdout


def spec_with_grader(grader_toml: str) -> dict:
    import tomllib

    text = (Path(__file__).resolve().parents[1] / "fixtures" / "families" / "capitals" / "capitals.toml").read_text()
    head = text[: text.index("[grader]")]
    return tomllib.loads(head + grader_toml)


@pytest.mark.parametrize(
    ("grader_toml", "field"),
    [
        ('[grader]\nkind = "regex_extract"\npattern = "(\\\\w)\\\\1"\ninner = { kind = "exact" }\n', "grader.pattern"),
        ('[grader]\nkind = "regex_extract"\npattern = "(?<=answer: )\\\\w+"\ninner = { kind = "exact" }\n', "grader.pattern"),
        ('[grader]\nkind = "exact"\nformat_pattern = "(?!x)\\\\w+"\n', "grader.format_pattern"),
        ('[grader]\nkind = "regex_extract"\npattern = "(\\\\w+)"\ninner = { kind = "exact", format_pattern = "a++" }\n', "grader.inner.format_pattern"),
        ('[grader]\nkind = "exact"\nformat_pattern = "[[:alpha:]]+"\n', "grader.format_pattern"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_at_spec_load(grader_toml: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_model(TaskSpec, spec_with_grader(grader_toml), "spec.toml")
    problems = {problem.field: problem for problem in info.value.problems}
    assert field in problems, info.value.render()
    assert "RE2" in problems[field].message or "read differently" in problems[field].message
    assert "RE2" in problems[field].fix or "{0,n}" in problems[field].fix


def test_a_pattern_neither_engine_takes_is_a_pattern_error() -> None:
    with pytest.raises(PatternError):
        LinearPattern("(a)\\1")
    with pytest.raises(PatternError):
        compiled_pattern("(?=a)")


@pytest.mark.parametrize(
    ("pattern", "text", "groups"),
    [
        (r"answer:\s*(-?\d+)", "so the answer: -42.", ["answer: -42", "-42"]),
        (r"(?i)final answer is (\w+)", "The FINAL ANSWER is Paris!", ["FINAL ANSWER is Paris", "Paris"]),
        (r"\\boxed\{([^}]*)\}", r"thus \boxed{17} and \boxed{3}", [r"\boxed{17}", "17"]),
        (r"^(\d+)$", "12\n", None),  # RE2: $ is the end of the text (re would match before the newline)
        (r"(?m)^(\d+)$", "x\n12\n", ["12", "12"]),
        (r"(a|ab)(c|bcd)(d*)", "abcd", ["abcd", "a", "bcd", ""]),
        (r"(a*)+", "b", ["", ""]),
        (r"(a+?)(b*)", "aab", ["a", "a", ""]),
        (r"\d+", "٣٤ 12", ["12"]),  # \d is ASCII
        (r"(?s)a.b", "a\nb", ["a\nb"]),
        (r"a.b", "a\nb", None),
        (r"\bcat\b", "concat cat", ["cat"]),
        (r"(x)?y", "y", ["y", None]),
        (r"(?P<n>\d{2,3}?)", "12345", ["12", "12"]),
    ],
)
def test_both_engines_agree_on_grader_like_patterns(pattern: str, text: str, groups: list[str | None] | None) -> None:
    for engine in (re2.compile(pattern), LinearPattern(pattern)):
        match = engine.search(text)
        found = None if match is None else [match.group(index) for index in range(engine.groups + 1)]
        assert found == groups, (engine, found)


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = ["a", "b", ".", r"\d", r"\w", r"\s", "[ab]", "[^a]", "[a-c0-2]", "x", " ", r"\."]
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice(atoms)
    if roll < 0.5:
        return random_pattern(rng, depth + 1) + random_pattern(rng, depth + 1)
    if roll < 0.6:
        return "(" + random_pattern(rng, depth + 1) + "|" + random_pattern(rng, depth + 1) + ")"
    if roll < 0.75:
        return "(?:" + random_pattern(rng, depth + 1) + ")" + rng.choice(["*", "+", "?", "*?", "+?", "??", "{2}", "{1,3}", "{0,2}?"])
    if roll < 0.85:
        return "(" + random_pattern(rng, depth + 1) + ")" + rng.choice(["*", "+", "?", ""])
    if roll < 0.92:
        return rng.choice(["^", r"\b", r"\B"]) + random_pattern(rng, depth + 1) + rng.choice(["$", r"\b", ""])
    return rng.choice(["(?i)", "(?s)", "(?m)"]) + random_pattern(rng, depth + 1)


def test_the_fallback_finds_the_same_matches_as_re2_on_random_patterns() -> None:
    """The whole match and fullmatch agree. (Groups inside a repeated group that can match the empty string and
    holds a lazy quantifier may be captured from another iteration: RE2, re and the Pike VM each differ there.)"""
    rng = random.Random(40)
    options = re2.Options()
    options.log_errors = False
    checked = 0
    for _ in range(1500):
        pattern = random_pattern(rng)
        try:
            fast, linear = re2.compile(pattern, options), LinearPattern(pattern)
        except (re2.error, PatternError):  # a spec refuses these (schemas/graders.py takes only what both parse)
            continue
        for _ in range(6):
            text = "".join(rng.choice("abcAB1x .\n_") for _ in range(rng.randint(0, 12)))
            expected, found = fast.search(text), linear.search(text)
            assert (expected is None) == (found is None), (pattern, text)
            if expected is not None and found is not None:
                assert expected.group(0) == found.group(0), (pattern, text)
            assert (fast.fullmatch(text) is None) == (linear.fullmatch(text) is None), (pattern, text)
            checked += 1
    assert checked > 3000
