"""Task specs that cannot work, through the real `metarl run` and `metarl run --dry-run` against real Postgres/Redis:
exit 2, the spec file, field and fix on stderr, no traceback, no table changed, no embedded service started."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import metarl_cli
from tests.integration.test_cli_bad_input import assert_config_error, run_bad, snapshot, spec, with_specs

pytestmark = pytest.mark.integration

FAMILIES = "addition, caesar, date_format, max_of_list, reversal, sorting"

# name -> (config maker, field, text that must be on stderr)
CASES: dict[str, tuple[Callable[[Path], bytes], str, str]] = {
    "unknown-family": (
        with_specs({"addition": spec("addition").replace('family = "addition"', 'family = "digit_sum"')}, ["addition"]),
        "family",
        f"unknown task family 'digit_sum'. Fix: use one of {FAMILIES}",
    ),
    "min-above-max-dataset": (
        with_specs({"addition": spec("addition").replace("max_dataset_size = 20000", "max_dataset_size = 10")}, ["addition"]),
        "data.max_dataset_size",
        "max_dataset_size 10 is below min_dataset_size 64",
    ),
    "removed-generator-field": (
        with_specs({"addition": spec("addition").replace("[data]\n", '[data]\ngenerator = "addition"\n')}, ["addition"]),
        "data.generator",
        "remove this key",
    ),
    "unknown-grader-kind": (with_specs({"addition": spec("addition") + '\n[grader]\nkind = "family"\n'}, ["addition"]), "grader", "set `kind` to one of"),
    "escape-in-title": (
        with_specs({"addition": spec("addition").replace('title = "Add two numbers"', 'title = "Add \\u001b]0;pwned\\u0007 numbers"')}, ["addition"]),
        "public.title",
        "U+001B",
    ),
    "escape-in-description": (
        with_specs({"addition": spec("addition").replace('description = "Add two', 'description = "\\u001b[2JAdd two')}, ["addition"]),
        "public.description",
        "U+001B",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_spec_refused_by_run(case: str, tmp_path: Path, service_env: dict[str, str]) -> None:
    make, field, text = CASES[case]
    config = tmp_path / "run.toml"
    config.write_bytes(make(tmp_path))
    result = run_bad(tmp_path, service_env, config)
    assert_config_error(result, field)
    assert str(tmp_path / "specs" / "addition.toml") in result.stderr and text in result.stderr, result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_spec_refused_by_dry_run(case: str, tmp_path: Path, service_env: dict[str, str]) -> None:
    make, field, text = CASES[case]
    config = tmp_path / "run.toml"
    config.write_bytes(make(tmp_path))
    before = snapshot(service_env["METARL_DATABASE_URL"])
    result = metarl_cli(["run", str(config), "--dry-run"], dict(service_env, METARL_HOME=str(tmp_path / "home")), timeout=60)
    assert_config_error(result, field)
    assert text in result.stderr and result.stdout == "", result.stderr
    assert snapshot(service_env["METARL_DATABASE_URL"]) == before
    assert not (tmp_path / "home").exists()
