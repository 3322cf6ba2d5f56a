"""The example data-defined family (examples/families/increment): valid, reproducible from its script, learnable text."""

from __future__ import annotations

import json
import string
from pathlib import Path

from metarl.learning.data_families import family_for
from metarl.runconfig import load_task_spec
from metarl_cli.tasks_command import check_folder
from scripts.make_example_family import main as make_example_family

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "examples" / "families" / "increment"
OLD_TOKENIZER_CHARACTERS = set(string.ascii_lowercase + string.digits + " +-=,:>/?.[]()")


def test_the_example_family_passes_tasks_check_and_grades_its_answers() -> None:
    valid, errors = check_folder(FOLDER)
    assert valid == ["increment"] and not errors
    family = family_for(load_task_spec(FOLDER / "increment.toml"))
    hidden = family.hidden_eval(200)
    assert len(hidden) == 200 and not {item.prompt for item in hidden} & {item.prompt for item in family.pool}  # type: ignore[attr-defined]
    item = hidden[0]
    assert family.grade(item, item.answer) == 1.0 and family.grade(item, "x") == 0.0
    assert 0.0 < family.grade(item, "9" + item.answer[1:] if item.answer[0] != "9" else "8" + item.answer[1:]) < 1.0


def test_the_shipped_data_is_what_the_script_writes(tmp_path: Path) -> None:
    assert make_example_family(["--out", str(tmp_path)]) == 0
    for name in ("train.jsonl", "hidden.jsonl"):
        assert (tmp_path / name).read_bytes() == (FOLDER / "data" / name).read_bytes(), f"{name}: rerun scripts/make_example_family.py"
    rows = [json.loads(line) for name in ("train.jsonl", "hidden.jsonl") for line in (FOLDER / "data" / name).read_text().splitlines()]
    assert all(set(row["prompt"] + row["answer"]) <= OLD_TOKENIZER_CHARACTERS for row in rows)
