"""Families this repository never had, from files alone: a data-defined family (JSONL pool and hidden
eval, tests/fixtures/families/capitals) and a plugin package's family (an entry point,
tests/fixtures/families/plugin_site); the registry, validation, contamination and the compiled bundle."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from metarl import graders
from metarl.backends.local.agent import environment_source
from metarl.learning import registry
from metarl.learning.data_families import DataFamily, family_for, normalised_prompt
from metarl.learning.families import generate_dataset
from metarl.learning.registry import get_family
from metarl.runconfig import load_task_spec
from metarl_cli.tasks_command import check_folder
from schemas.base import ConfigError
from schemas.job import JobSpec
from tests.unit.test_primerl_package import chat, fake_vf, install  # noqa: F401 (fixture)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
CAPITALS = FIXTURES / "capitals" / "capitals.toml"
PLUGIN_SITE = FIXTURES / "plugin_site"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_data_defined_family_loads_from_its_files() -> None:
    spec = load_task_spec(CAPITALS)
    assert Path(spec.items.pool).is_absolute() and Path(spec.hidden_eval.path).is_absolute()  # type: ignore[union-attr, arg-type]
    family = family_for(spec)
    assert isinstance(family, DataFamily) and family.name == "capitals"
    hidden = read_jsonl(FIXTURES / "capitals" / "data" / "hidden.jsonl")
    assert [item.model_dump() for item in family.hidden_eval(spec.hidden_eval.n_items)] == hidden[: spec.hidden_eval.n_items]
    training = {item.prompt for item in generate_dataset(family, 200, seed=0, difficulty=0.5)}
    assert training <= {row["prompt"] for row in read_jsonl(FIXTURES / "capitals" / "data" / "train.jsonl")}
    assert not training & {row["prompt"] for row in hidden}
    assert family.grade(family.hidden_eval(1)[0], " VIENNA ") == 1.0 and family.grade(family.hidden_eval(1)[0], "vienne") == 0.0
    assert family.is_well_formed("paris") and not family.is_well_formed("paris 2")


def test_contamination_matches_hidden_prompts_exactly_and_normalised() -> None:
    family = family_for(load_task_spec(CAPITALS))
    assert family.is_hidden_eval_item("capital of austria?")
    assert family.is_hidden_eval_item("  Capital   OF Austria? ")
    assert not family.is_hidden_eval_item("capital of france?")
    assert normalised_prompt("Capital\tof  ＡＵＳＴＲＩＡ?") == "capitalofaustria?"


def test_tasks_check_accepts_the_shipped_specs_and_the_fixture() -> None:
    shipped, errors = check_folder(Path(__file__).resolve().parents[2] / "tasks_specs")
    assert not errors and len(shipped) == 6
    valid, errors = check_folder(CAPITALS.parent)
    assert valid == ["capitals"] and not errors


def test_every_problem_of_a_spec_and_its_data_is_reported_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "specs"
    shutil.copytree(CAPITALS.parent, folder)
    pool = folder / "data" / "train.jsonl"
    lines = pool.read_text().splitlines()
    lines[1] = '{"prompt": "capital of spain?"}'  # line 2: no answer
    lines[3] = "not json"  # line 4
    lines[5] = '{"prompt": "capital of  Austria?", "answer": "vienna"}'  # line 6: a hidden prompt, normalised
    pool.write_text("\n".join(lines) + "\n")
    (folder / "data" / "hidden.jsonl").write_text((folder / "data" / "hidden.jsonl").read_text() + '{"prompt": "capital of cuba?", "answer": "havana 1"}\n')
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as raised:
        load_task_spec(folder / "capitals.toml")
    fields = [problem.field for problem in raised.value.problems]
    assert "items.pool (data/train.jsonl line 2) answer" in fields
    assert "items.pool (data/train.jsonl line 4) (line)" in fields
    assert "items.pool (data/train.jsonl line 6) prompt" in fields
    assert "hidden_eval.path (data/hidden.jsonl line 10) prompt" in fields  # a repeated hidden prompt
    assert "hidden_eval.path (data/hidden.jsonl line 10) answer" in fields  # not a well-formed answer for the grader
    assert all(problem.fix for problem in raised.value.problems)
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before  # nothing written
    valid, errors = check_folder(folder)
    assert valid == [] and len(errors) == 1 and len(errors[0].problems) == len(fields)


def test_missing_files_unknown_generator_and_bad_grader_are_named(tmp_path: Path) -> None:
    spec = CAPITALS.read_text().replace('pool = "data/train.jsonl"', 'generator = "nope"').replace("max_chars = 20", "max_chars = 20\nmin_chars = 30")
    (tmp_path / "capitals.toml").write_text(spec.replace('path = "data/hidden.jsonl"', 'path = "missing.jsonl"'))
    with pytest.raises(ConfigError) as raised:
        load_task_spec(tmp_path / "capitals.toml")
    assert [problem.field for problem in raised.value.problems] == ["grader"] and "below min_chars" in raised.value.problems[0].message
    (tmp_path / "capitals.toml").write_text(spec.replace("\nmin_chars = 30", "").replace('path = "data/hidden.jsonl"', 'path = "missing.jsonl"'))
    with pytest.raises(ConfigError) as raised:
        load_task_spec(tmp_path / "capitals.toml")
    assert {problem.field for problem in raised.value.problems} == {"items.generator", "hidden_eval.path"}


def test_a_plugin_family_registers_through_its_entry_point(plugin_installed: None) -> None:
    family = get_family("vowel_count")
    assert type(family).__module__ == "metarl_vowels"
    assert set(registry.BUILTIN_FAMILIES) < set(registry.registered_families())
    spec = load_task_spec(PLUGIN_SITE / "vowel_count.toml")
    assert spec.grader is not None and spec.grader.kind == "plugin"  # the package's own plugin grader, with the spec's options
    from_spec = family_for(spec)
    assert isinstance(from_spec, DataFamily) and from_spec.generator is family and from_spec.grader == spec.grader.model_dump()
    hidden = from_spec.hidden_eval(spec.hidden_eval.n_items)
    assert hidden == family.hidden_eval(spec.hidden_eval.n_items)
    assert len({family.item_key(item.prompt) for item in hidden}) == spec.hidden_eval.n_items
    for item in generate_dataset(from_spec, 300, seed=1, difficulty=(0.0, 1.0)):
        assert not family.is_hidden_eval_item(item.prompt)
        assert from_spec.grade(item, item.answer) == 1.0 and family.grade(item, item.answer) == 1.0
    answer = int(hidden[0].answer)
    assert from_spec.grade(hidden[0], str((answer + 3) % 10)) == 0.0 and from_spec.grade(hidden[0], str(answer + 1)) == 0.5
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    assert from_spec.grade(hidden[0], words[answer].upper()) == 1.0 and from_spec.is_exact(hidden[0], words[answer])


def test_without_the_plugin_its_spec_names_an_unknown_family_and_grader() -> None:
    registry.refresh_registry()
    with pytest.raises(ConfigError) as raised:
        load_task_spec(PLUGIN_SITE / "vowel_count.toml")
    assert [problem.field for problem in raised.value.problems] == ["family", "grader.plugin"]


def test_a_name_registered_twice_is_refused() -> None:
    reference = registry.BUILTIN_FAMILIES["addition"]
    with pytest.raises(registry.FamilyRegistryError, match="registered by both"):
        registry.build_registry([("addition", reference, "a"), ("addition", reference, "b")])
    with pytest.raises(registry.FamilyRegistryError, match="calls itself"):
        registry.build_registry([("sums", reference, "a")])


def test_the_compiled_bundle_of_a_data_family_grades_with_its_grader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    spec = load_task_spec(CAPITALS)
    family = family_for(spec)
    weights = {"correctness": 1.0, "format": 0.5}
    job = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "reward": {"components": weights}, "dataset": {"size": 2}})
    rows = read_jsonl(FIXTURES / "capitals" / "data" / "train.jsonl")[:2]
    package = install(tmp_path, monkeypatch, job, environment_source(weights, family.name, 16, family.grader), rows)
    env = package.load_environment()
    correctness = env.rubric.funcs[0]
    rng = random.Random(0)
    for row in rows:
        for completion in (row["answer"], row["answer"].upper(), " " + row["answer"], row["answer"][:-1], "x"):
            expected = graders.grade(family.grader, row["answer"], completion)
            assert correctness(prompt=chat("user", row["prompt"]), completion=chat("assistant", completion), answer=row["answer"]) == expected
            assert expected == family.grade(family.hidden_eval(1)[0].model_copy(update={"answer": row["answer"]}), completion)
    assert rng is not None
