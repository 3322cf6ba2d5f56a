"""`metarl status` without a run id: the runs table shows every id whole, whatever the terminal width."""

from __future__ import annotations

import io
import uuid

from rich.console import Console

from metarl.render import runs_table


def test_the_runs_table_never_cuts_an_id() -> None:
    rows = [
        {
            "id": str(uuid.uuid4()),
            "name": "a-rather-long-run-name-" * 2,
            "status": status,
            "policy_version": 123,
            "cost_usd": 12345.678901,
            "created_at": "2026-12-04T08:15:42.123456+00:00",
        }
        for status in ("running", "finished", "stopping")
    ]
    for width in (60, 80, 120):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(runs_table(rows))
        text = console.export_text()
        lines = text.splitlines()
        for row in rows:
            assert any(row["id"] in line for line in lines), (width, row["id"], "\n".join(lines))
        assert max(len(line) for line in lines) <= width
    assert "2026-12-04 08:15" in text  # at 120 columns nothing wraps
