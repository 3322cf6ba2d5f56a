"""Merging versus-search runs split by family (`bench.versus_search --merge`) and the acceptance lines of the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench._versus_output import merge_plan_problems
from bench.versus_search import main
from metarl.versus_search import VersusRow, acceptance_lines, merge_versus_parts, read_versus_csv, rows_to_csv, summarize
from schemas.base import ConfigError
from tests.unit.test_versus_search import series_rows

PLAN = {"mode": "full", "families": ["x"], "seeds": 2, "jobs": 4, "train_seconds": 60.0, "eval_items": None, "model_scale": 1.0, "workers": 2}
POLICY = {"run_id": "r", "commit": "c", "seed": 1, "outer_version": 20}


def family_rows(family: str, trained: list[float | None], tpe: list[float | None], preset: float, held_out: bool = False, seeds: int = 2) -> list[VersusRow]:
    rows: list[VersusRow] = []
    for seed in range(seeds):
        rows += series_rows("trained_agent", family, seed, trained, held_out=held_out)
        rows += series_rows("optuna_tpe", family, seed, tpe, held_out=held_out)
        rows += series_rows("sensible_preset", family, seed, [preset], held_out=held_out)
    return rows


def write_part(folder: Path, rows: list[VersusRow], plan: dict | None = None, policy: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "versus_search-full.csv").write_text(rows_to_csv(rows), encoding="utf-8")
    meta = {"mode": "full", "plan": {**PLAN, **(plan or {})}, "trained_agent": policy or POLICY}
    (folder / "meta-full.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder / "versus_search-full.csv"


def test_acceptance_lines_compare_the_first_job_with_the_preset_and_the_best_of_four_with_tpe() -> None:
    rows = family_rows("date_format", [0.9, 0.5, 0.5, 0.5], [None, 0.3, 0.6, 0.95], 0.8, held_out=True)
    rows += family_rows("addition", [0.3, 0.7, 0.2, 0.2], [0.4, 0.4, 0.5, 0.6], 0.35)
    lines = acceptance_lines(summarize(rows))
    assert lines[0].startswith("date_format: trained agent's first job 0.900 >= sensible preset 0.800; its best of 4 0.900 <= Optuna TPE's 0.950")
    assert lines[1].startswith("addition: trained agent's first job 0.300 < sensible preset 0.350; its best of 4 0.700 > Optuna TPE's 0.600")
    assert lines[-1] == "over 2 families: first job at or above the sensible preset on 1; best of 4 above Optuna TPE's on 1"


def test_acceptance_lines_name_a_family_that_cannot_be_compared() -> None:
    rows = series_rows("optuna_tpe", "sorting", 0, [0.4, 0.5, 0.6, 0.7]) + series_rows("sensible_preset", "sorting", 0, [0.5])
    lines = acceptance_lines(summarize(rows))
    assert lines[0].startswith("sorting: not compared")
    assert lines[-1].startswith("over 0 families")


def test_merged_parts_keep_every_row_and_refuse_a_family_benched_twice() -> None:
    first = family_rows("addition", [0.3, 0.4, 0.5, 0.6], [0.2, 0.3, 0.4, 0.5], 0.3)
    second = family_rows("sorting", [0.3, 0.4, 0.5, 0.6], [0.2, 0.3, 0.4, 0.5], 0.3)
    assert len(merge_versus_parts([("a.csv", first), ("b.csv", second)])) == len(first) + len(second)
    with pytest.raises(ConfigError) as err:
        merge_versus_parts([("a.csv", first), ("c.csv", first)])
    assert "family addition is also in a.csv" in str(err.value)
    quick = [row.model_copy(update={"mode": "quick"}) for row in second]
    with pytest.raises(ConfigError, match="a quick run, and a.csv is a full run"):
        merge_versus_parts([("a.csv", first), ("q.csv", quick)])


def test_plans_that_differ_are_named_by_file_and_key() -> None:
    problems = merge_plan_problems(
        [("a.csv", {"plan": PLAN, "trained_agent": POLICY}), ("b.csv", {"plan": {**PLAN, "train_seconds": 20.0}, "trained_agent": {**POLICY, "seed": 2}})]
    )
    assert [problem.field for problem in problems] == ["b.csv: plan.train_seconds", "b.csv: trained_agent"]
    assert "20.0 here, 60.0 in a.csv" in problems[0].message


def test_parts_on_another_hidden_eval_partition_are_refused() -> None:
    problems = merge_plan_problems(
        [
            ("a.csv", {"plan": PLAN, "trained_agent": POLICY, "eval_partition": "0123456789ab"}),
            ("b.csv", {"plan": PLAN, "trained_agent": POLICY, "eval_partition": "ba9876543210"}),
        ]
    )
    assert [problem.field for problem in problems] == ["b.csv: eval_partition"]
    assert "METARL_EVAL_SECRET" in problems[0].fix and '"0123456789ab" in a.csv' in problems[0].message
    unrecorded = merge_plan_problems(
        [("a.csv", {"plan": PLAN, "trained_agent": POLICY, "eval_partition": "0123456789ab"}), ("old.csv", {"plan": PLAN, "trained_agent": POLICY})]
    )
    assert [problem.field for problem in unrecorded] == ["old.csv: eval_partition"]


def test_parts_on_other_base_model_weights_are_refused_with_the_install_command() -> None:
    bases = {"local-s": {"build": "local-s-k", "weights": "aaaa", "kept_step": 340}}
    other = {"local-s": {"build": "local-s-k", "weights": "bbbb", "kept_step": 550}}
    problems = merge_plan_problems(
        [
            ("a.csv", {"plan": PLAN, "trained_agent": POLICY, "eval_partition": "p", "base_models": bases}),
            ("b.csv", {"plan": PLAN, "trained_agent": POLICY, "eval_partition": "p", "base_models": other}),
            ("c.csv", {"plan": PLAN, "trained_agent": POLICY, "eval_partition": "p", "base_models": dict(bases)}),
        ]
    )
    assert [problem.field for problem in problems] == ["b.csv: base_models"]
    assert '"bbbb"' in problems[0].message and "bench.base_models install" in problems[0].fix


def test_merge_writes_one_table_with_its_summary_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_part(tmp_path / "a", family_rows("date_format", [0.9, 0.5, 0.5, 0.5], [0.3, 0.3, 0.6, 0.7], 0.8, held_out=True))
    b = write_part(tmp_path / "b", family_rows("addition", [0.5, 0.5, 0.5, 0.5], [0.2, 0.3, 0.4, 0.6], 0.4))
    out = tmp_path / "merged"
    assert main(["--merge", str(a), str(b), "--out", str(out)]) == 0
    rows = read_versus_csv(out / "versus_search-full.csv")
    assert {row.family for row in rows} == {"date_format", "addition"} and len(rows) == 2 * 2 * 9
    summary = (out / "summary-full.txt").read_text(encoding="utf-8")
    assert "over 2 families: first job at or above the sensible preset on 2; best of 4 above Optuna TPE's on 1" in summary
    assert "zero-shot on date_format" in summary
    assert (out / "versus_search-full.png").read_bytes()[:4] == b"\x89PNG"
    merged_from = json.loads((out / "meta-full.json").read_text(encoding="utf-8"))["merged_from"]
    assert [part["csv"] for part in merged_from] == [f"{a.parent.name}/{a.name}", f"{b.parent.name}/{b.name}"]  # tmp_path is outside the cwd
    assert "merged output checked" in capsys.readouterr().out


def test_merge_refuses_runs_of_another_plan_or_without_their_meta(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_part(tmp_path / "a", family_rows("addition", [0.5] * 4, [0.4] * 4, 0.4))
    b = write_part(tmp_path / "b", family_rows("sorting", [0.5] * 4, [0.4] * 4, 0.4), plan={"jobs": 8})
    assert main(["--merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 2
    assert "plan.jobs" in capsys.readouterr().err
    (tmp_path / "b" / "meta-full.json").unlink()
    assert main(["--merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 2
    assert "keep the bench's meta file beside its CSV" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
