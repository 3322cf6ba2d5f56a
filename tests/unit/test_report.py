"""The run report without a database: tables from records, CSV text, PNG files and the escaped HTML page."""

from __future__ import annotations

import csv
import io
import math
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metarl.report.html import LINE_PLOTS, write_report
from metarl.report.tables import (
    LATENCY_COLUMNS,
    STEP_COLUMNS,
    CostLine,
    ReportData,
    RunInfo,
    StageDuration,
    StepRecord,
    change,
    default_report_dir,
    latency_table,
    pick_metrics,
    printable,
    quantile,
    series,
    step_table,
    to_csv,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics(step: int) -> dict[str, float | None]:
    """Metrics of a made-up done step: rewards rise, improvement doubles, cost grows by 0.25 + 0.05*step."""
    return {
        "reward_mean": 0.1 * step,
        "held_out_reward_mean": 0.05 * step if step % 2 == 0 else None,
        "raw_improvement_mean": 0.02 * 2 ** (step - 1),
        "large_model_share": min(1.0, 0.25 * step),
        "explicit_hparam_share": 1 / 7 * step,
        "first_try_pass_rate": 0.5,
        "cost_usd_total": sum(0.25 + 0.05 * s for s in range(1, step + 1)),
    }


def run_info(**changes: object) -> RunInfo:
    fields: dict[str, object] = {
        "id": "0f0e0d0c-0000-4000-8000-000000000001",
        "name": "unit",
        "status": "finished",
        "policy_version": 3,
        "created_at": "2026-01-01T00:00:00+00:00",
        "finished_at": None,
        "message": None,
    }
    fields.update(changes)
    return RunInfo(**fields)  # type: ignore[arg-type]


def report_data(n_steps: int = 3, **run_changes: object) -> ReportData:
    steps = [StepRecord(step=s, status="done", n_episodes=8, policy_version_after=s, metrics=pick_metrics(metrics(s))) for s in range(1, n_steps + 1)]
    durations = [
        StageDuration(step=s, stage=stage, seconds=seconds)
        for s in range(1, n_steps + 1)
        for stage, base in (("agent", 0.1), ("probe", 0.05), ("train", 2.0), ("eval", 0.3))
        for seconds in (base * s, base * s * 2, base * s * 3)
    ]
    return ReportData(
        run=run_info(**run_changes),
        simulated=True,
        artifacts_root="/tmp/artifacts",
        episodes_by_stage={"done": 20, "failed": 2},
        costs=[CostLine(source="train", simulated=True, usd=1.5, entries=20)],
        cost_usd_total=1.5,
        steps=steps,
        durations=durations,
    )


class Page(HTMLParser):
    """Collects image sources, link targets and the visible text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values["src"] or "")
        if tag == "a":
            self.links.append(values["href"] or "")
        if tag == "script":
            raise AssertionError("the report contains a script element")

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


# -- pure tables ---------------------------------------------------------------------------------


def test_pick_metrics_keeps_report_keys_and_blanks_what_is_not_a_finite_number() -> None:
    raw = {
        "reward_mean": 0.5,
        "large_model_share": 1,
        "first_try_pass_rate": True,
        "cost_usd_total": "3",
        "raw_improvement_mean": float("nan"),
        "held_out_reward_mean": float("inf"),
        "backend_loss": 0.1,
    }
    picked = pick_metrics(raw)
    assert picked["reward_mean"] == 0.5 and picked["large_model_share"] == 1.0
    assert picked["first_try_pass_rate"] is None and picked["cost_usd_total"] is None
    assert picked["raw_improvement_mean"] is None and picked["held_out_reward_mean"] is None
    assert picked["explicit_hparam_share"] is None
    assert "backend_loss" not in picked


def test_quantile_known_values() -> None:
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.9) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.9) == pytest.approx(4.6)
    with pytest.raises(ValueError):
        quantile([1.0], 1.5)


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=50), st.floats(min_value=0, max_value=1))
def test_quantile_matches_numpy(values: list[float], q: float) -> None:
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)), rel=1e-9, abs=1e-9)


def test_step_table_orders_steps_and_takes_cost_differences() -> None:
    records = [
        StepRecord(step=2, status="done", n_episodes=8, policy_version_after=2, metrics={"cost_usd_total": 1.0, "reward_mean": 0.4}),
        StepRecord(step=3, status="running", n_episodes=8, metrics={}),
        StepRecord(step=1, status="done", n_episodes=8, policy_version_after=1, metrics={"cost_usd_total": 0.25, "reward_mean": 0.2}),
        StepRecord(step=4, status="done", n_episodes=8, policy_version_after=4, metrics={"cost_usd_total": 1.5}),
    ]
    table = step_table(records)
    assert table.columns == list(STEP_COLUMNS)
    assert table.column("step") == [1, 2, 3, 4]
    assert table.column("status") == ["done", "done", "running", "done"]
    assert table.column("reward_mean") == [0.2, 0.4, None, None]
    assert table.column("cost_usd_total") == [0.25, 1.0, None, 1.5]
    assert table.column("cost_usd_step") == [0.25, 0.75, None, 0.5]
    assert table.column("policy_version") == [1, 2, None, 4]
    assert series(table, "reward_mean") == ([1, 2], [0.2, 0.4])


def test_latency_table_has_one_row_per_step_with_median_and_p90_per_stage() -> None:
    steps = [StepRecord(step=s, status="done", n_episodes=4) for s in (1, 2)]
    durations = [StageDuration(step=1, stage="train", seconds=x) for x in (1.0, 2.0, 3.0, 10.0)] + [StageDuration(step=2, stage="agent", seconds=0.5)]
    table = latency_table(steps, durations)
    assert table.columns == list(LATENCY_COLUMNS)
    first, second = table.rows
    row1 = dict(zip(table.columns, first))
    row2 = dict(zip(table.columns, second))
    assert row1["step"] == 1 and row1["train_n"] == 4
    assert row1["train_median_s"] == pytest.approx(2.5) and row1["train_p90_s"] == pytest.approx(float(np.quantile([1, 2, 3, 10], 0.9)))
    assert row1["agent_n"] == 0 and row1["agent_median_s"] is None
    assert row2["agent_median_s"] == 0.5 and row2["agent_p90_s"] == 0.5 and row2["train_n"] == 0


def test_change_reports_ratio_only_for_a_positive_start() -> None:
    table = step_table(report_data(4).steps)
    found = change(table, "raw_improvement_mean")
    assert (found.first_step, found.last_step) == (1, 4)
    assert found.ratio == pytest.approx(8.0)
    negative = step_table(
        [
            StepRecord(step=1, status="done", n_episodes=1, metrics={"raw_improvement_mean": -0.1}),
            StepRecord(step=2, status="done", n_episodes=1, metrics={"raw_improvement_mean": 0.2}),
        ]
    )
    assert change(negative, "raw_improvement_mean").ratio is None
    assert change(step_table([]), "raw_improvement_mean").first is None


def test_csv_round_trips_floats_exactly_and_blanks_as_empty() -> None:
    table = step_table(report_data(3).steps)
    rows = list(csv.reader(io.StringIO(to_csv(table))))
    assert rows[0] == list(STEP_COLUMNS)
    assert len(rows) == 4
    for written, row in zip(rows[1:], table.rows):
        for text, value in zip(written, row):
            if value is None:
                assert text == ""
            elif isinstance(value, float):
                assert float(text) == value
            else:
                assert text == str(value)


def test_default_report_dir() -> None:
    home = Path("/home/x/.metarl")
    assert default_report_dir("/data/art", home, "r1") == Path("/data/art/reports/r1")
    assert default_report_dir("file:///data/art", home, "r1") == Path("/data/art/reports/r1")
    assert default_report_dir("s3://bucket/art", home, "r1") == home / "reports" / "r1"
    assert default_report_dir(None, home, "r1") == home / "reports" / "r1"


def test_printable_escapes_terminal_controls() -> None:
    shown = printable("x\x1b]0;pwned\x07\x1b[2J")
    assert "\x1b" not in shown and "\x07" not in shown and "pwned" in shown
    assert printable("a" * 500).endswith("...")


# -- files ---------------------------------------------------------------------------------------


def test_report_files_link_valid_pngs_and_csvs_match_the_metrics(tmp_path: Path) -> None:
    data = report_data(4)
    index = write_report(data, tmp_path / "out")
    page = parse(index)
    assert len(page.images) == len(LINE_PLOTS) + 2
    for source in page.images:
        assert "/" not in source and not source.startswith("http"), source
        image = index.parent / source
        assert image.read_bytes()[:8] == PNG_MAGIC, source
        assert image.stat().st_size > 2000
    assert {"steps.csv", "latency.csv"} <= set(page.links)
    steps = read_csv(index.parent / "steps.csv")
    assert [int(row["step"]) for row in steps] == [1, 2, 3, 4]
    for row, record in zip(steps, data.steps):
        for key, value in record.metrics.items():
            assert (row[key] == "") if value is None else math.isclose(float(row[key]), value), (key, row[key], value)
    spent = [float(row["cost_usd_step"]) for row in steps]
    assert spent == pytest.approx([0.25 + 0.05 * s for s in (1, 2, 3, 4)])
    latency = read_csv(index.parent / "latency.csv")
    assert len(latency) == 4
    assert float(latency[2]["train_median_s"]) == pytest.approx(2.0 * 3 * 2)
    text = " ".join(page.text)
    assert "SIMULATED" in text
    assert "last / first = 8" in text


def test_report_escapes_text_from_the_database(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script>'
    data = report_data(2, name=hostile, status="<b>done", message='"><img src=x onerror=alert(1)> & more')
    data = data.model_copy(update={"costs": [CostLine(source="<i>gpu</i>", simulated=False, usd=1.0, entries=1)], "episodes_by_stage": {"<u>done</u>": 3}})
    index = write_report(data, tmp_path)
    source = index.read_text(encoding="utf-8")
    for raw in (hostile, "<b>done", "<img src=x", "<i>gpu</i>", "<u>done</u>"):
        assert raw not in source, raw
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in source
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt; &amp; more" in source
    page = parse(index)  # raises on a script element
    assert hostile in " ".join(page.text)
    assert all(not src.startswith("x") for src in page.images)


def test_report_of_a_run_without_outer_steps(tmp_path: Path) -> None:
    data = ReportData(run=run_info(status="running", policy_version=0), simulated=False)
    index = write_report(data, tmp_path)
    page = parse(index)
    assert page.images == []
    assert list(tmp_path.glob("*.png")) == []
    assert "the run has no outer steps yet" in " ".join(page.text)
    assert (tmp_path / "steps.csv").read_text().strip() == ",".join(STEP_COLUMNS)
    assert (tmp_path / "latency.csv").read_text().strip() == ",".join(LATENCY_COLUMNS)
    assert "SIMULATED" not in index.read_text()


def test_rewriting_a_report_removes_plots_that_lost_their_data(tmp_path: Path) -> None:
    write_report(report_data(2), tmp_path)
    assert (tmp_path / "latency.png").exists()
    write_report(report_data(2).model_copy(update={"durations": []}), tmp_path)
    assert not (tmp_path / "latency.png").exists()
    assert "latency.png" not in parse(tmp_path / "index.html").images
    assert (tmp_path / "reward.png").exists()


def test_a_versus_search_csv_is_drawn_beside_the_run_and_summarised(tmp_path: Path) -> None:
    from metarl.report.html import VERSUS_PNG
    from tests.unit.test_versus_search import bench_rows

    rows = [row.model_copy(update={"mode": "quick"}) for row in bench_rows(seeds=3, jobs=4)]
    index = write_report(report_data(2), tmp_path, rows)
    page = parse(index)
    assert VERSUS_PNG in page.images and (tmp_path / VERSUS_PNG).read_bytes()[:8] == PNG_MAGIC
    text = " ".join(page.text)
    assert "Versus search" in text and "QUICK RUN." in text
    assert "zero-shot on date_format: trained agent's first job 0.650" in text
    assert "Optuna TPE" in text and "sensible preset" in text
    write_report(report_data(2), tmp_path)
    assert not (tmp_path / VERSUS_PNG).exists(), "a report without the CSV drops the old comparison"


def test_metarl_report_refuses_a_bad_versus_search_csv_before_touching_the_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from metarl.versus_search import rows_to_csv
    from metarl_cli.main import main
    from tests.unit.test_versus_search import bench_rows

    lines = rows_to_csv(bench_rows(seeds=1)).splitlines()
    header = lines[0].split(",")
    cells = lines[3].split(",")
    cells[header.index("best_so_far")] = "-0.5"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([*lines[:3], ",".join(cells)]) + "\n")
    code = main(["report", "no-such-run", "--versus-search", str(bad), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith(f"error: {bad}: 1 problem(s)") and "row 3 (line 4), column best_so_far" in error
    assert not (tmp_path / "out").exists()
