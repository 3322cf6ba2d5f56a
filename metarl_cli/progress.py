"""Live progress of a run: episodes done, outer step, reward, cost (rich on a terminal, lines otherwise)."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from metarl.report.terminal import held_out_text
from metarl.store import read_progress
from orchestrator.loop import TickReport

LIVE_REFRESH_S = 0.5
"""Seconds between refreshes of the table on a terminal."""
LINE_EVERY_S = 5.0
"""Seconds between progress lines when stderr is not a terminal (a log file, a service's journal)."""


def display_due(now: float, last_shown: float | None, live: bool, finished: bool) -> bool:
    """Whether to read the run and show it now (pure): the table every LIVE_REFRESH_S, a line every LINE_EVERY_S and at the end."""
    if last_shown is None:
        return True
    if live:
        return now - last_shown >= LIVE_REFRESH_S
    return finished or now - last_shown >= LINE_EVERY_S


def train_text(snap: dict[str, Any]) -> str | None:
    """The train backend's slots as shown (pure), only while some episode waits for one: how many of the run's jobs run,
    how many episodes wait, and how many slots other runs' jobs hold (a run waiting behind another run says so)."""
    if not snap["train_waiting"]:
        return None
    elsewhere = snap["slots_held_elsewhere"]
    held = f" ({elsewhere} slot{'s' if elsewhere != 1 else ''} held by other runs)" if elsewhere else ""
    return f"{snap['train_running']} training, {snap['train_waiting']} waiting for a slot{held}"


def reward_text(reward: float | None) -> str:
    """The last outer step's mean reward as shown (pure): three decimals, or "-" before the first step."""
    return "-" if reward is None else f"{reward:.3f}"


def progress_line(snap: dict[str, Any]) -> str:
    """The progress as one log line (pure); the held-out reward, once there is one, names its policy version."""
    held_out = held_out_text(snap["held_out"], snap["held_out_version"], digits=3)
    train = train_text(snap)
    return (
        f"[{snap['status']}] episodes {snap['episodes_done']}/{snap['episodes_total']} outer step {snap['outer_step']}/{snap['max_outer_steps']} "
        f"reward {reward_text(snap['reward'])}"
        + ("" if held_out is None else f" held-out {held_out}")
        + ("" if train is None else f" train {train}")
        + f" cost ${snap['cost_usd']:.4f}"
    )


class ProgressDisplay:
    """The run's progress from the database: a table refreshed twice a second on a terminal, else a line every five seconds.

    Its reads run in the orchestrator's tick loop, so nothing is read that is not shown.
    """

    def __init__(self, database_url: str, run_id: str, enabled: bool = True):
        self.database_url = database_url
        self.run_id = run_id
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.live: Live | None = None
        self._last_shown: float | None = None

    def snapshot(self) -> dict[str, Any]:
        """The run as shown (`metarl.store.progress.read_progress`), as a dict."""
        return asdict(read_progress(self.database_url, self.run_id))

    def render(self, snap: dict[str, Any]) -> Table:
        table = Table(title=f"metarl run {self.run_id}", title_justify="left")
        for column in ("status", "episodes done", "outer step", "reward", "held-out", "train", "cost $"):
            table.add_column(column)
        table.add_row(
            snap["status"],
            f"{snap['episodes_done']}/{snap['episodes_total']}",
            f"{snap['outer_step']}/{snap['max_outer_steps']}",
            reward_text(snap["reward"]),
            held_out_text(snap["held_out"], snap["held_out_version"], digits=3) or "-",
            train_text(snap) or "-",
            f"{snap['cost_usd']:.4f}",
        )
        return table

    def update(self, report: TickReport) -> None:
        """Called after every tick: show the run when due (see display_due)."""
        now = time.monotonic()
        if not self.enabled or not display_due(now, self._last_shown, self.live is not None, report.finished):
            return
        self._last_shown = now
        snap = self.snapshot()
        if self.live is not None:
            self.live.update(self.render(snap))
        else:
            print(progress_line(snap), file=sys.stderr, flush=True)

    def print_summary(self) -> None:
        snap = self.snapshot()
        Console().print(self.render(snap))

    def __enter__(self) -> ProgressDisplay:
        if self.enabled and self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.__exit__(exc_type, exc, tb)
            self.live = None
