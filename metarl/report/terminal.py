"""Terminal rendering of status and progress (rich tables)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich import box
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


def start_set_text(start: dict[str, Any]) -> str:
    """The start set's mean reward and how many of its episodes it covers."""
    mean = "-" if start["reward_mean"] is None else f"{start['reward_mean']:.3f}"
    return f"{mean} ({start['rewarded']}/{start['episodes']})"


def status_tables(status: dict[str, Any]) -> Group:
    run = status["run"]
    newest = status.get("held_out_latest")
    start = status.get("start_set") or {"episodes": 0}
    head = _table(
        f"run {run['id']}",
        ["name", "status", "policy version", "start set", "held-out", "cost $", "message"],
        [
            [
                run["name"],
                run["status"],
                run["policy_version"],
                start_set_text(start) if start["episodes"] else None,
                held_out_text(newest["reward"], newest["policy_version"]) if newest else None,
                f"{status['cost_usd_total']:.4f}",
                run["message"],
            ]
        ],
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
                held_out_text(s["held_out_reward"], s.get("held_out_version")),
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
    """The run list in 80 columns: each run's short id (`short_id`, a prefix `metarl status` accepts) and status whole; the name wraps."""
    table = Table(title="runs", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    ids = [r.get("short_id", r["id"]) for r in runs]
    table.add_column("id", no_wrap=True, min_width=max(map(len, ids), default=2))
    table.add_column("name", overflow="fold", min_width=8)
    table.add_column("status", no_wrap=True, min_width=max([len(r["status"]) for r in runs], default=6))
    table.add_column("version", no_wrap=True, justify="right")
    table.add_column("cost $", no_wrap=True, justify="right")
    table.add_column("created (UTC)", min_width=10)
    for short_id, r in zip(ids, runs, strict=True):
        table.add_row(short_id, r["name"], r["status"], str(r["policy_version"]), f"{r['cost_usd']:.4f}", _minute(r["created_at"]))
    return table


def held_out_text(reward: float | None, version: int | None, digits: int = 4) -> str | None:
    """A held-out mean reward and the policy version it was sampled under, as `0.6800 (v2)`; None when there is none (pure)."""
    if reward is None:
        return None
    return f"{reward:.{digits}f}" + ("" if version is None else f" (v{version})")


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
