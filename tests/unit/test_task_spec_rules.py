"""Task specs that cannot work are refused at load, each with one clear error naming the file, the field and the fix."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from metarl.learning.registry import FAMILIES
from metarl.runconfig import load_run
from metarl.workspace import render_task_md
from schemas.base import ConfigError, FieldProblem, load_toml_model
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "tasks_specs"


def spec_dict(task_id: str = "addition") -> dict:
    return tomllib.loads((SPECS / f"{task_id}.toml").read_text())


def write_spec(folder: Path, data: dict) -> Path:
    path = folder / f"{data['id']}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def only_problem(path: Path) -> tuple[ConfigError, FieldProblem]:
    """The one problem of a spec the schema refuses (`metarl.runconfig.load_task_spec` reads specs with the same schema)."""
    with pytest.raises(ConfigError) as info:
        load_toml_model(TaskSpec, path)
    assert len(info.value.problems) == 1, info.value.render()
    return info.value, info.value.problems[0]


def test_shipped_specs_load_and_name_known_families() -> None:
    from metarl.runconfig import load_task_spec

    for path in sorted(SPECS.glob("*.toml")):
        assert load_task_spec(path).family in FAMILIES


def test_unknown_family_names_the_file_the_field_and_the_families(tmp_path: Path) -> None:
    data = spec_dict()
    data["family"] = "digit_sum"
    path = write_spec(tmp_path, data)
    load_toml_model(TaskSpec, path)  # the schema alone cannot know the families
    from metarl.runconfig import load_task_spec

    with pytest.raises(ConfigError) as info:
        load_task_spec(path)
    error, (problem,) = info.value, info.value.problems
    assert error.source == str(path) and problem.field == "family" and "'digit_sum'" in problem.message
    assert problem.fix == "use one of " + ", ".join(sorted(FAMILIES))


def test_unknown_family_fails_the_run_config_load(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    data = spec_dict()
    data["family"] = "digit_sum"
    path = write_spec(tmp_path / "specs", data)
    run = tomllib.loads((REPO / "examples" / "sim.toml").read_text())
    run["run"]["tasks"], run["run"]["task_specs_dir"] = ["addition"], "specs"
    (tmp_path / "run.toml").write_text(tomli_w.dumps(run))
    with pytest.raises(ConfigError) as info:
        load_run(tmp_path / "run.toml")
    assert info.value.source == str(path) and [p.field for p in info.value.problems] == ["family"]


def test_min_dataset_size_above_max_is_refused(tmp_path: Path) -> None:
    data = spec_dict()
    data["data"] = {"min_dataset_size": 5000, "max_dataset_size": 100}
    _, problem = only_problem(write_spec(tmp_path, data))
    assert problem.field == "data.max_dataset_size" and "below min_dataset_size 5000" in problem.message
    assert problem.fix == "make min_dataset_size at most max_dataset_size"
    data["data"] = {"min_dataset_size": 100, "max_dataset_size": 100}
    assert load_toml_model(TaskSpec, write_spec(tmp_path, data)).data.max_dataset_size == 100


@pytest.mark.parametrize(("table", "key", "value"), [("data", "generator", "addition")])
def test_removed_fields_are_refused(tmp_path: Path, table: str, key: str, value: object) -> None:
    data = spec_dict()
    data.setdefault(table, {})[key] = value
    _, problem = only_problem(write_spec(tmp_path, data))
    assert problem.field == f"{table}.{key}" and "remove this key" in problem.fix


@pytest.mark.parametrize(
    ("grader", "field", "fix"), [({"kind": "family"}, "grader", "set `kind` to one of"), ({"partial_credit": 0.5}, "grader", "add a `kind` key")]
)
def test_a_grader_without_a_known_kind_is_refused(tmp_path: Path, grader: dict, field: str, fix: str) -> None:
    data = spec_dict()
    data["grader"] = grader
    _, problem = only_problem(write_spec(tmp_path, data))
    assert problem.field == field and problem.fix.startswith(fix)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("title", "Add \x1b]0;pwned\x07 numbers"),
        ("title", "Add\nnumbers"),
        ("title", "Add \u202enumbers"),
        ("description", "Add two numbers.\x1b[2J"),
        ("description", "Add\x00two"),
        ("example_prompt", "add 1+2=\x1b[31m"),
        ("example_answer", "3\r"),
    ],
)
def test_control_characters_in_public_text_are_refused(tmp_path: Path, field: str, value: str) -> None:
    data = spec_dict()
    data["public"][field] = value
    _, problem = only_problem(write_spec(tmp_path, data))
    assert problem.field == f"public.{field}" and ("U+00" in problem.message or "U+202E" in problem.message) and "control characters" in problem.fix


def test_control_characters_in_a_model_name_are_refused(tmp_path: Path) -> None:
    data = spec_dict()
    data["budget"]["allowed_models"] = ["Qwen/Qwen3-0.6B", "Qwen/\x1b[2JQwen3-1.7B"]
    _, problem = only_problem(write_spec(tmp_path, data))
    assert problem.field == "budget" and "allowed_models entry 1 contains U+001B" in problem.message


def test_a_description_keeps_newlines_and_tabs_and_task_md_has_no_removed_field_text(tmp_path: Path) -> None:
    data = spec_dict()
    data["public"]["description"] = "Add two numbers.\n\tExample: add 1+2= gives 3.\nÜnïcödé is fine."
    spec = load_toml_model(TaskSpec, write_spec(tmp_path, data))
    text = render_task_md(spec)
    assert "\tExample" in text and "Ünïcödé" in text
    assert "partial credit" not in text and "exactly right" in text
    assert all(ch.isprintable() or ch in "\n\t" for ch in text)


@pytest.mark.parametrize("bounds", [[0.6, 0.2], [-0.1, 0.5], [0.0, 1.5], [0.5], 0.5])
def test_a_difficulty_range_out_of_order_or_outside_the_unit_interval_names_the_field(tmp_path: Path, bounds: object) -> None:
    data = spec_dict()
    data["data"]["difficulty_range"] = bounds
    error, problem = only_problem(write_spec(tmp_path, data))
    assert problem.field == "data.difficulty_range"
    assert ("0 <= low <= high <= 1" in problem.message or "two numbers [low, high]" in problem.message) and str(tmp_path) in error.render()


def test_the_declared_difficulty_range_reaches_task_md(tmp_path: Path) -> None:
    data = spec_dict()
    data["data"]["difficulty_range"] = [0.0, 0.5]
    task = load_toml_model(TaskSpec, write_spec(tmp_path, data))
    assert task.data.difficulty_range == (0.0, 0.5)
    assert "between 0 and 0.5" in render_task_md(task)
