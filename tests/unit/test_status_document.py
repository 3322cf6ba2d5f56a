"""The pure parts of `metarl status RUN_ID`: the status document from query rows, and the libpq form of a database URL."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from metarl.store.migration_head import libpq_uri
from metarl.store.status import status_document


@pytest.mark.parametrize(
    ("url", "uri"),
    [
        ("postgresql+psycopg://postgres@127.0.0.1:5432/test", "postgresql://postgres@127.0.0.1:5432/test"),
        ("postgresql://u:p%40ss@db:6543/runs?sslmode=require", "postgresql://u:p%40ss@db:6543/runs?sslmode=require"),
        ("postgres://u@h/d", "postgresql://u@h/d"),
    ],
)
def test_libpq_uri_drops_the_driver_and_keeps_the_rest(url: str, uri: str) -> None:
    assert libpq_uri(url) == uri


def test_status_document_orders_stages_fills_zeros_and_prefers_the_recorded_held_out_reward() -> None:
    created = dt.datetime(2026, 12, 2, 18, 0, tzinfo=dt.UTC)
    document = status_document(
        run_row=("r1", "demo", "running", 3, None, False, created, None),
        stages={"done": 5, "agent": 2},
        failures=[(9, "failed", "inner job failed: oom")],
        costs=[("sim", True, Decimal("1.25"), 4), ("runpod", False, None, 0)],
        steps=[(1, "done", 0, 1, 2, 8, 0, {"reward_mean": 0.4, "held_out_reward_mean": 0.1, "cost_usd_total": 2.0}), (2, "running", 1, None, 2, 8, 1, None)],
        held_out={0: 0.35},
        rewards=(5, 0.41234, 0.3, 1.0, 0.2, None),
        jobs={"succeeded": 4},
        attempts=(7, 5),
        recent=[(12, "addition", "done", 3, 0.5, 0.5, 1.0, 0.0, 0.0)],
        depths={"agent": 1, "probe": None},
    )
    assert list(document["episodes_by_stage"]) == ["agent", "probe", "train", "eval", "done", "failed"]
    assert document["episodes_by_stage"] == {"agent": 2, "probe": 0, "train": 0, "eval": 0, "done": 5, "failed": 0}
    assert document["inner_jobs"]["succeeded"] == 4 and document["inner_jobs"]["lost"] == 0
    assert document["run"]["created_at"] == "2026-12-02T18:00:00+00:00" and document["run"]["finished_at"] is None
    assert document["cost_usd_total"] == 1.25 and document["costs"][1] == {"source": "runpod", "simulated": False, "usd": 0.0, "entries": 0}
    assert document["rewards"]["total_mean"] == 0.4123 and document["rewards"]["speed_mean"] is None
    assert document["probe_attempts"] == {"total": 7, "passed": 5}
    first, second = document["outer_steps"]
    assert first["held_out_reward"] == 0.35  # evaluated later than the step: the records win over the stored metric
    assert second["held_out_reward"] is None and second["reward_mean"] is None and second["version"] is None
    assert document["failures"] == [{"episode": 9, "stage": "failed", "error": "inner job failed: oom"}]
