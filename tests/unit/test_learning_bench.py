"""bench.inner_jobs: option parsing, table rows and the summary (no training)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.inner_jobs import BenchRow, JobResult, format_row, parse_args, resolve_families, summarize
from metarl.learning.data_families import DataFamily
from metarl.learning.presets import BAD_LEARNING_RATE, bad_config, sensible_config
from metarl.learning.registry import get_family
from metarl.learning.scoring import EvalScore
from schemas.base import ConfigError

EXAMPLE_SPEC = Path(__file__).resolve().parents[2] / "examples" / "families" / "increment" / "increment.toml"


def score(mean: float) -> EvalScore:
    return EvalScore(mean=mean, ci_low=max(0.0, mean - 0.05), ci_high=min(1.0, mean + 0.05), n=200, pass_k=1, partial_mean=mean)


def row(model: str, family: str, base: float, sensible: float, bad: float) -> BenchRow:
    return BenchRow(
        model=model,
        family=family,
        base=score(base),
        sensible=JobResult(score=score(sensible), steps=150, wall_s=30.0),
        bad=JobResult(score=score(bad), steps=50, wall_s=8.0),
    )


def test_parse_args_defaults_and_quick() -> None:
    args = parse_args([])
    assert args.models is None and not args.quick and args.seed == 0
    quick = parse_args(["--quick", "--families", "addition,sorting", "--models", "local-s"])
    assert quick.quick and quick.families == "addition,sorting" and quick.models == "local-s"


def test_format_row_shows_gains() -> None:
    line = format_row(row("local-s", "addition", 0.1, 0.4, 0.0))
    assert "local-s" in line and "addition" in line and "+0.300" in line and "-0.100" in line


def test_summary_counts_targets_and_compares_models() -> None:
    rows = [
        row("local-s", "addition", 0.1, 0.4, 0.0),
        row("local-s", "sorting", 0.1, 0.2, 0.0),
        row("local-l", "addition", 0.2, 0.6, 0.0),
        row("local-l", "sorting", 0.2, 0.15, 0.0),
    ]
    lines = summarize(rows)
    assert any(line.startswith("local-s: gain >= 0.20 on 1/2") for line in lines)
    assert lines[-1] == "local-l ends higher than local-s on 1/2 families"


def test_presets_differ_in_the_intended_knobs() -> None:
    family = get_family("caesar")
    small, large = sensible_config("Qwen/Qwen3-0.6B", family), sensible_config("local-l", family)
    assert small.base_model == "local-s" and large.base_model == "local-l"
    assert large.learning_rate < small.learning_rate and large.time_budget_s > small.time_budget_s
    assert small.max_tokens == family.max_answer_chars + 1
    bad = bad_config("local-s", family)
    assert bad.learning_rate == BAD_LEARNING_RATE and bad.group_size == small.group_size


def test_families_are_named_or_given_as_spec_files(tmp_path: Path) -> None:
    named, from_file = resolve_families(f"addition, {EXAMPLE_SPEC}")
    assert named is get_family("addition")
    assert isinstance(from_file, DataFamily) and from_file.name == "increment" and from_file.grader["kind"] == "right_aligned_digits"
    broken = tmp_path / "increment.toml"
    broken.write_text(EXAMPLE_SPEC.read_text())  # its data files are not beside it
    with pytest.raises(ConfigError) as raised:
        resolve_families(str(broken))
    assert {problem.field for problem in raised.value.problems} == {"items.pool", "hidden_eval.path"}
    with pytest.raises(KeyError):
        resolve_families("no_such_family")
