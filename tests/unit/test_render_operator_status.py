"""Every held-out figure of `metarl status RUN_ID` and of the live progress names the policy version it belongs to."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

from rich.console import Console

from metarl.report.terminal import held_out_text, status_tables
from metarl.store.status import newest_held_out, status_document
from metarl_cli.progress import ProgressDisplay, progress_line, train_text


def quickstart_like_status() -> dict[str, Any]:
    """Three outer steps (v0 -> v3) and held-out groups evaluated under v0, v2 and v3, as after the quickstart."""
    return status_document(
        run_row=("5d0c2f7e-1111-4222-8333-444455556666", "quickstart", "finished", 3, None, False, dt.datetime(2026, 12, 2, 18, 0, tzinfo=dt.UTC), None),
        stages={"done": 12},
        failures=[],
        costs=[("sim", True, 1.5, 10)],
        steps=[
            (1, "done", 0, 1, 2, 4, 0, {"reward_mean": 0.4, "held_out_reward_mean": 0.5}),
            (2, "done", 1, 2, 2, 4, 0, {"reward_mean": 0.5}),
            (3, "done", 2, 3, 2, 4, 0, {"reward_mean": 0.6}),
        ],
        held_out={0: 0.31, 2: 0.68, 3: 1.2024},
        rewards=(12, 0.5, 0.4, 1.0, 0.2, 0.0),
        jobs={},
        attempts=(12, 12),
        recent=[],
        depths={},
    )


def test_the_status_document_names_the_version_of_each_held_out_figure() -> None:
    status = quickstart_like_status()
    assert [(s["held_out_reward"], s["held_out_version"]) for s in status["outer_steps"]] == [(0.31, 0), (None, None), (0.68, 2)]
    assert status["held_out_latest"] == {"policy_version": 3, "reward": 1.2024}
    assert newest_held_out({}) is None


def test_the_status_tables_show_held_out_rewards_with_their_versions() -> None:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(status_tables(quickstart_like_status()))
    text = console.export_text()
    assert "1.2024 (v3)" in text  # the run's newest held-out evaluation, in the head table
    step_lines = [line for line in text.splitlines() if line.startswith("│ 3 ") or line.startswith("│ 1 ")]
    assert any("0.6800 (v2)" in line for line in step_lines) and any("0.3100 (v0)" in line for line in step_lines), text


def test_the_progress_table_and_line_name_the_held_out_version() -> None:
    snap = {
        "status": "running",
        "episodes_done": 7,
        "episodes_total": 12,
        "outer_step": 2,
        "max_outer_steps": 3,
        "reward": 0.5,
        "held_out": 1.2024,
        "held_out_version": 3,
        "cost_usd": 1.5,
        "train_running": 2,
        "train_waiting": 0,
        "slots_held_elsewhere": 0,
    }
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(ProgressDisplay("postgresql+psycopg://unused/none", "r1").render(snap))
    assert "1.202 (v3)" in console.export_text()
    assert progress_line(snap) == "[running] episodes 7/12 outer step 2/3 reward 0.500 held-out 1.202 (v3) cost $1.5000"
    assert progress_line(dict(snap, held_out=None, held_out_version=None)) == "[running] episodes 7/12 outer step 2/3 reward 0.500 cost $1.5000"
    waiting = dict(snap, held_out=None, held_out_version=None, train_running=2, train_waiting=3, slots_held_elsewhere=0)
    assert progress_line(waiting) == "[running] episodes 7/12 outer step 2/3 reward 0.500 train 2 training, 3 waiting for a slot cost $1.5000"
    assert " reward 0.013 " in progress_line(dict(snap, reward=0.013219070327718463))  # a step's mean, not its float repr
    assert " reward - " in progress_line(dict(snap, reward=None))
    behind = dict(waiting, train_running=0, slots_held_elsewhere=2)
    assert train_text(behind) == "0 training, 3 waiting for a slot (2 slots held by other runs)"
    assert train_text(dict(behind, train_waiting=0)) is None
    assert held_out_text(None, None) is None and held_out_text(0.5, None) == "0.5000"
