"""`metarl status` without a run id: the runs table shows short ids that resolve, and fits 80 columns without breaking words."""

from __future__ import annotations

import io
import re
import uuid

import pytest
from rich.console import Console

from metarl.report.terminal import runs_table
from metarl.store.status import unique_prefix

STATUSES = ("running", "stopping", "stopped", "finished", "failed", "interrupted", "paused")
NAMES = ("a-rather-long-run-name-without-any-spaces-at-all-" * 2, "quickstart on the sim backends, second attempt after the fix", "q")


def rendered(rows: list[dict[str, object]], width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(runs_table(rows))
    return console.export_text().splitlines()


def listing(short_id_length: int = 8, cost_usd: float = 12345.678901, version: int = 123) -> list[dict[str, object]]:
    rows = []
    for index, status in enumerate(STATUSES):
        run_id = str(uuid.uuid4())
        rows.append(
            {
                "id": run_id,
                "short_id": run_id[:short_id_length],
                "name": NAMES[index % len(NAMES)],
                "status": status,
                "policy_version": version,
                "cost_usd": cost_usd,
                "created_at": "2026-12-04T08:15:42.123456+00:00",
            }
        )
    return rows


@pytest.mark.parametrize(
    "rows",
    [listing(), listing(short_id_length=13, cost_usd=1234567.891234, version=12345), listing(cost_usd=0.0042, version=0)],
    ids=["big-costs", "long-short-ids-huge-costs", "small"],
)
def test_at_80_columns_ids_statuses_and_dates_stay_whole(rows: list[dict[str, object]]) -> None:
    lines = rendered(rows, 80)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80, text
    for row in rows:
        (line,) = [line for line in lines if str(row["short_id"]) in line]
        assert re.search(rf"\s{row['status']}\s", line), text  # the status word whole, on the run's first line
        assert "2026-12-04" in line, text
        assert str(row["id"]) not in text  # the full id is in `--json`
    assert "…" not in text


def test_typical_rows_take_one_line_each_at_80_columns() -> None:
    rows = [dict(row, name="sim quickstart", cost_usd=3.25) for row in listing()]
    lines = rendered(rows, 80)
    assert len(lines) == 3 + len(rows), "\n".join(lines)  # title, header, rule, one line per run
    assert "2026-12-04 08:15" in lines[3]


def test_a_listing_without_short_ids_shows_the_whole_id() -> None:
    rows = [{k: v for k, v in row.items() if k != "short_id"} for row in listing()[:1]]
    assert any(str(rows[0]["id"]) in line for line in rendered(rows, 120))


@pytest.mark.parametrize(
    ("run_id", "neighbours", "short"),
    [
        ("3f2a9c41-0b7e-4d2a-9f10-5e6c7d8e9f00", (None, None), "3f2a9c41"),
        ("3f2a9c41-0b7e-4d2a-9f10-5e6c7d8e9f00", ("3f2a9c40-ffff-4fff-8fff-ffffffffffff", "3f2b0000-0000-4000-8000-000000000000"), "3f2a9c41"),
        ("3f2a9c41-0b7e-4d2a-9f10-5e6c7d8e9f00", ("3f2a9c41-0b00-4000-8000-000000000000", None), "3f2a9c41-0b7"),
        ("3f2a9c41-0b7e-4d2a-9f10-5e6c7d8e9f00", (None, "3F2A9C41-0B7E-4D2A-9F10-5E6C7D8E9F01"), "3f2a9c41-0b7e-4d2a-9f10-5e6c7d8e9f00"),
        ("short", (None, None), "short"),
    ],
)
def test_the_short_id_is_one_character_longer_than_what_a_neighbour_shares(run_id: str, neighbours: tuple[str | None, str | None], short: str) -> None:
    assert unique_prefix(run_id, neighbours) == short
