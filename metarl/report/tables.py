"""The run report's numbers: pure functions from outer-step records to the tables it plots and writes as CSV.

Nothing here touches the database or the disk; `metarl/store/report_data.py` loads the records and
`metarl/report/html.py` draws and writes them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

STAGES: tuple[str, ...] = ("agent", "probe", "train", "eval")
StageName = Literal["agent", "probe", "train", "eval"]

# Keys of `outer_steps.metrics` (metarl/store/step_metrics.py; `backend_` ones from the outer backend's update) that the
# report shows, in column order. backend_entropy_mean: the local policy's entropy per job token (metarl/outer_update.py).
STEP_METRICS: tuple[str, ...] = (
    "reward_mean",
    "held_out_reward_mean",
    "raw_improvement_mean",
    "large_model_share",
    "explicit_hparam_share",
    "first_try_pass_rate",
    "cost_usd_total",
    "backend_entropy_mean",
)
STEP_COLUMNS: tuple[str, ...] = ("step", "status", "episodes", "policy_version", *STEP_METRICS, "cost_usd_step")
LATENCY_COLUMNS: tuple[str, ...] = ("step", *(f"{stage}_{what}" for stage in STAGES for what in ("n", "median_s", "p90_s")))

Cell = float | int | str | None


class StepRecord(BaseModel):
    """One outer step as the report needs it: number, status, batch size, new policy version and its metrics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=0, le=10**9, description="Outer step number (1, 2, ...)")
    status: str = Field(min_length=1, max_length=16, description="pending, running, done or failed")
    n_episodes: int = Field(ge=0, le=10**9, description="Episodes in the step's batch")
    policy_version_after: int | None = Field(default=None, ge=0, le=10**9, description="Policy version the step produced; none until done")
    metrics: dict[str, float | None] = Field(default_factory=dict, description="The step's metrics, as picked by pick_metrics")


class StageDuration(BaseModel):
    """Seconds one finished stage claim took, and the outer step whose batch holds its episode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int = Field(ge=0, le=10**9, description="Outer step of the episode's group")
    stage: StageName = Field(description="Stage of the claim")
    seconds: float = Field(ge=0.0, allow_inf_nan=False, description="Claimed to finished, in seconds")


class RunInfo(BaseModel):
    """The header of a report: which run, in what state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=64, description="Run id")
    name: str = Field(min_length=1, max_length=256, description="Run name from its config")
    status: str = Field(min_length=1, max_length=16, description="Run status")
    policy_version: int = Field(ge=0, le=10**9, description="Current policy version")
    created_at: str = Field(min_length=1, max_length=64, description="ISO time the run was created")
    finished_at: str | None = Field(default=None, max_length=64, description="ISO time the run finished, if it did")
    message: str | None = Field(default=None, max_length=10_000, description="Status message of the run")


class CostLine(BaseModel):
    """Dollars of one ledger source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(min_length=1, max_length=64, description="Ledger source (train, eval, agent, outer, ...)")
    simulated: bool = Field(description="Charges of a simulator")
    usd: float = Field(allow_inf_nan=False, description="Sum of the charges (a credit may make it negative)")
    entries: int = Field(ge=0, description="Number of charges")


class ReportData(BaseModel):
    """Everything a report shows, loaded from the records of one run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run: RunInfo = Field(description="Run header")
    simulated: bool = Field(description="Whether any inner job, evaluation or charge of the run came from a simulator")
    artifacts_root: str | None = Field(default=None, max_length=4096, description="Artifact root of the run config")
    episodes_by_stage: dict[str, int] = Field(default_factory=dict, description="Episodes per current stage")
    costs: list[CostLine] = Field(default_factory=list, description="Ledger totals per source")
    cost_usd_total: float = Field(default=0.0, allow_inf_nan=False, description="Ledger total of the run")
    steps: list[StepRecord] = Field(default_factory=list, description="Outer steps, any order")
    durations: list[StageDuration] = Field(default_factory=list, description="Finished stage claims of batched episodes")


class Table(BaseModel):
    """A CSV-shaped table: column names and rows of numbers, text or blanks (None)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    columns: list[str] = Field(min_length=1, description="Column names")
    rows: list[list[Cell]] = Field(default_factory=list, description="Rows, each as long as columns")

    def column(self, name: str) -> list[Cell]:
        """The values of one column, top to bottom."""
        index = self.columns.index(name)
        return [row[index] for row in self.rows]


class Change(BaseModel):
    """First and last value of a series, and their ratio (none when the first is not positive)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first_step: int | None = Field(default=None, ge=0, description="Step of the first value")
    first: float | None = Field(default=None, allow_inf_nan=False, description="First value")
    last_step: int | None = Field(default=None, ge=0, description="Step of the last value")
    last: float | None = Field(default=None, allow_inf_nan=False, description="Last value")
    ratio: float | None = Field(default=None, allow_inf_nan=False, description="last / first, when first > 0")


def pick_metrics(raw: Mapping[str, Any]) -> dict[str, float | None]:
    """The report's keys of an `outer_steps.metrics` JSON; missing, non-numeric or non-finite values become None."""
    picked: dict[str, float | None] = {}
    for key in STEP_METRICS:
        value = raw.get(key)
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        picked[key] = number if number is not None and math.isfinite(number) else None
    return picked


def quantile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile of values by linear interpolation between order statistics (numpy's default); None if empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def step_table(steps: Sequence[StepRecord]) -> Table:
    """One row per outer step, in step order: the step's metrics and the dollars spent since the previous step."""
    rows: list[list[Cell]] = []
    previous_total = 0.0
    for record in sorted(steps, key=lambda s: s.step):
        total = record.metrics.get("cost_usd_total")
        spent = None if total is None else total - previous_total
        if total is not None:
            previous_total = total
        rows.append([record.step, record.status, record.n_episodes, record.policy_version_after, *(record.metrics.get(key) for key in STEP_METRICS), spent])
    return Table(columns=list(STEP_COLUMNS), rows=rows)


def latency_table(steps: Sequence[StepRecord], durations: Sequence[StageDuration]) -> Table:
    """One row per outer step: per stage, the number of finished claims of its batch and their median and p90 seconds."""
    seconds: dict[tuple[int, str], list[float]] = {}
    for item in durations:
        seconds.setdefault((item.step, item.stage), []).append(item.seconds)
    rows: list[list[Cell]] = []
    for number in sorted({record.step for record in steps}):
        row: list[Cell] = [number]
        for stage in STAGES:
            values = seconds.get((number, stage), [])
            row += [len(values), quantile(values, 0.5), quantile(values, 0.9)]
        rows.append(row)
    return Table(columns=list(LATENCY_COLUMNS), rows=rows)


def series(table: Table, column: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one numeric column, leaving out the blanks: what a plot draws."""
    xs: list[int] = []
    ys: list[float] = []
    for step, value in zip(table.column("step"), table.column(column)):
        if isinstance(value, (int, float)) and isinstance(step, int):
            xs.append(step)
            ys.append(float(value))
    return xs, ys


def change(table: Table, column: str) -> Change:
    """How a column moved over the run: its first and last non-blank values and last / first."""
    xs, ys = series(table, column)
    if not xs:
        return Change()
    ratio = ys[-1] / ys[0] if ys[0] > 0 else None
    return Change(first_step=xs[0], first=ys[0], last_step=xs[-1], last=ys[-1], ratio=ratio)


def format_cell(value: Cell) -> str:
    """A cell as CSV text: blanks empty, floats in their shortest round-trip form."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def to_csv(table: Table) -> str:
    """The table as CSV text with a header row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    for row in table.rows:
        writer.writerow([format_cell(value) for value in row])
    return buffer.getvalue()


def printable(text: str, limit: int = 200) -> str:
    """Text safe to echo on a terminal: control characters escaped, cut to limit characters."""
    shown = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def default_report_dir(artifacts_root: str | None, home: Path, run_id: str) -> Path:
    """`<artifacts root>/reports/<run_id>` for a local artifact root, else `<METARL_HOME>/reports/<run_id>`."""
    root: Path | None = None
    if artifacts_root:
        if artifacts_root.startswith("file://"):
            root = Path(artifacts_root[len("file://") :])
        elif "://" not in artifacts_root:
            root = Path(artifacts_root)
    return (root if root is not None else home) / "reports" / run_id
