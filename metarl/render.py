"""Terminal rendering of status and progress (rich tables)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Console, Group
from rich.table import Table

MAX_STEP_ROWS = 30
"""Outer steps shown in the status table (the newest); a long run has hundreds, and drawing them took a second."""


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*["" if value is None else str(value) for value in row])
    return table


def status_tables(status: dict[str, Any]) -> Group:
    run = status["run"]
    head = _table(
        f"run {run['id']}",
        ["name", "status", "policy version", "cost $", "message"],
        [[run["name"], run["status"], run["policy_version"], f"{status['cost_usd_total']:.4f}", run["message"]]],
    )
    stages = _table("episodes per stage", list(status["episodes_by_stage"]), [list(status["episodes_by_stage"].values())])
    queues = _table("queue depths", list(status["queue_depths"]), [list(status["queue_depths"].values())])
    jobs = _table("inner jobs", list(status["inner_jobs"]), [list(status["inner_jobs"].values())])
    rewards = status["rewards"]
    reward = _table(
        "reward components (mean over scored episodes)",
        ["episodes", "total", "job", "validation", "efficiency", "speed", "probe attempts", "passed"],
        [
            [
                rewards["episodes"],
                rewards["total_mean"],
                rewards["job_mean"],
                rewards["validation_mean"],
                rewards["efficiency_mean"],
                rewards["speed_mean"],
                status["probe_attempts"]["total"],
                status["probe_attempts"]["passed"],
            ]
        ],
    )
    recent = _table(
        "recent episodes",
        ["episode", "task", "stage", "version", "reward", "job", "validation", "efficiency", "speed"],
        [
            [e["episode"], e["task"], e["stage"], e["policy_version"], e["reward"], e["job"], e["validation"], e["efficiency"], e["speed"]]
            for e in status["recent_episodes"]
        ],
    )
    shown = status["outer_steps"][-MAX_STEP_ROWS:]
    hidden = len(status["outer_steps"]) - len(shown)
    steps = _table(
        "reward by outer step" + (f" (last {len(shown)} of {len(status['outer_steps'])}; --json lists all)" if hidden else ""),
        ["step", "status", "version", "groups", "episodes", "dropped stale", "reward", "held-out reward", "cost $"],
        [
            [
                s["step"],
                s["status"],
                s["version"],
                s["groups"],
                s["episodes"],
                s["dropped_stale"],
                _r(s["reward_mean"]),
                _r(s["held_out_reward"]),
                _r(s["cost_usd"]),
            ]
            for s in shown
        ],
    )
    costs = _table(
        "costs", ["source", "simulated", "usd", "entries"], [[c["source"], c["simulated"], f"{c['usd']:.4f}", c["entries"]] for c in status["costs"]]
    )
    failures = _table("recent failures", ["episode", "stage", "error"], [[f["episode"], f["stage"], (f["error"] or "")[:120]] for f in status["failures"]])
    return Group(head, stages, queues, jobs, reward, steps, recent, costs, failures)


def runs_table(runs: list[dict[str, Any]]) -> Table:
    """The run list; the id column never shrinks (it is what a user copies): the other columns wrap instead."""
    table = Table(title="runs", title_justify="left")
    table.add_column("id", no_wrap=True, min_width=max([len(r["id"]) for r in runs], default=2))
    for column in ("name", "status", "version", "cost $", "created (UTC)"):
        table.add_column(column, overflow="fold")
    for r in runs:
        table.add_row(r["id"], r["name"], r["status"], str(r["policy_version"]), f"{r['cost_usd']:.4f}", _minute(r["created_at"]))
    return table


def _minute(iso_time: str) -> str:
    """An ISO timestamp as `YYYY-MM-DD HH:MM` in UTC (the listing's JSON keeps the full one)."""
    moment = dt.datetime.fromisoformat(iso_time)
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M")


def _r(value: Any) -> Any:
    return None if value is None else round(float(value), 4)


def print_status(status: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(status_tables(status))
