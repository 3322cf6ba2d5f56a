"""The versus-search table: the agent's jobs against a search over the same job space, at equal numbers of inner jobs.

`bench/versus_search.py` writes one CSV row per method, family, seed and inner job; `metarl report
RUN_ID --versus-search CSV` reads it back (:func:`read_versus_csv`, which names the row and column
of a bad cell) and draws it beside the run's own plots (`metarl/report/html.py`). Everything here is
pure: rows in, numbers out.

Best-so-far after k jobs is the highest hidden-eval score among the passing jobs so far, and never
below the floor (the small base model's own score, as if no job had run): a job the probe rejects,
or one that fails, is spent and adds no score.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.base import ConfigError, FieldProblem

Method = Literal["trained_agent", "untrained_agent", "random_search", "optuna_tpe", "sensible_preset"]
METHODS: tuple[Method, ...] = ("trained_agent", "untrained_agent", "random_search", "optuna_tpe", "sensible_preset")
METHOD_LABELS: dict[str, str] = {
    "trained_agent": "trained agent",
    "untrained_agent": "untrained agent",
    "random_search": "random search",
    "optuna_tpe": "Optuna TPE",
    "sensible_preset": "sensible preset",
}
SINGLE_JOB_METHODS: frozenset[str] = frozenset({"sensible_preset"})
"""Methods that spend exactly one job (a fixed config, one point on the plot)."""

BUDGETS: tuple[int, ...] = (1, 2, 4, 8)
"""Inner jobs spent at which the methods are compared."""

Outcome = Literal["passed", "rejected", "failed"]
Mode = Literal["quick", "full"]
FAMILY_PATTERN = r"^[a-z][a-z0-9_\-]{0,63}$"


class VersusRow(BaseModel):
    """One inner job of one method on one family and seed, with the best score so far after it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = Field(description="quick (a short check of the machinery, numbers not comparable) or full")
    method: Method = Field(description="Who wrote the job")
    family: str = Field(pattern=FAMILY_PATTERN, description="Task family")
    held_out: bool = Field(description="Whether the family is held out from the agent's training")
    seed: int = Field(ge=0, le=2**31 - 1, description="Bench seed of this method's sequence of jobs")
    job_index: int = Field(ge=1, le=10_000, description="Jobs spent so far, this one included")
    outcome: Outcome = Field(description="passed (trained and scored), rejected (by the probe) or failed (in training)")
    rejected_fields: str = Field(default="", max_length=2000, description="Fields the probe named, ';'-separated (rejected jobs only)")
    model: str = Field(default="", max_length=200, description="Base model the job names (empty when it did not parse)")
    score: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False, description="Hidden-eval score of the trained checkpoint")
    base_score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="The floor: the small base model's hidden-eval score")
    best_so_far: float = Field(ge=0.0, le=1.0, allow_inf_nan=False, description="Highest of the floor and the scores of the jobs so far")
    steps: int | None = Field(default=None, ge=0, le=10**7, description="GRPO steps the job ran (passed and failed jobs)")
    cpu_s: float = Field(ge=0.0, le=10**7, allow_inf_nan=False, description="CPU seconds of the job: training and scoring (the probe only, when rejected)")
    wall_s: float = Field(ge=0.0, le=10**7, allow_inf_nan=False, description="Wall seconds of the job")
    cost_usd: float = Field(ge=0.0, le=10**6, allow_inf_nan=False, description="Charge of the job in USD (local backends: not billed, 0)")
    job: str = Field(default="", max_length=4000, description="The job's settings, `key=value` separated by spaces")

    @model_validator(mode="after")
    def _consistent(self) -> VersusRow:
        if (self.score is not None) != (self.outcome == "passed"):
            raise ValueError("score is set exactly when the outcome is passed")
        if self.best_so_far < self.base_score or (self.score is not None and self.best_so_far < self.score):
            raise ValueError("best_so_far is below the floor or this job's score")
        return self


CSV_COLUMNS: tuple[str, ...] = tuple(VersusRow.model_fields)
NULLABLE_COLUMNS = frozenset({"score", "steps"})
"""Columns whose blank cell means None."""


def csv_cell(value: object) -> str:
    """A value as a CSV cell: blank for None, booleans as true/false, floats as written by repr."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def rows_to_csv(rows: Iterable[VersusRow]) -> str:
    """The CSV text of rows, header first."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow([csv_cell(getattr(row, column)) for column in CSV_COLUMNS])
    return buffer.getvalue()


def parse_versus_csv(text: str, source: str) -> list[VersusRow]:
    """Rows of a versus-search CSV; ConfigError naming the row (1 = first data row), its line and the column of each problem."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise ConfigError(source, [FieldProblem(field="header", message="the file is empty", fix="give the CSV that bench.versus_search wrote")])
    missing = [column for column in CSV_COLUMNS if column not in header]
    extra = [column for column in header if column not in CSV_COLUMNS]
    if missing or extra:
        header_problems = [
            FieldProblem(field=f"column {name}", message="missing from the header", fix="write the CSV with bench.versus_search") for name in missing
        ]
        header_problems += [
            FieldProblem(field=f"column {name}", message="not a versus-search column", fix=f"use the columns {', '.join(CSV_COLUMNS)}") for name in extra
        ]
        raise ConfigError(source, header_problems)
    rows: list[VersusRow] = []
    problems: list[FieldProblem] = []
    for number, cells in enumerate(reader, start=1):
        where = f"row {number} (line {reader.line_num})"
        if len(cells) != len(header):
            problems.append(FieldProblem(field=where, message=f"{len(cells)} cells under {len(header)} columns", fix="one cell per column"))
            continue
        raw = {column: (None if cell == "" and column in NULLABLE_COLUMNS else cell) for column, cell in zip(header, cells)}
        try:
            rows.append(VersusRow.model_validate(raw))
        except ValidationError as err:
            for error in err.errors():
                column = str(error["loc"][0]) if error["loc"] else "(row)"
                problems.append(FieldProblem(field=f"{where}, column {column}", message=error["msg"], fix="fix the cell or write the CSV again"))
    problems += consistency_problems(rows)
    if problems:
        raise ConfigError(source, problems[:50])
    if not rows:
        raise ConfigError(source, [FieldProblem(field="rows", message="the CSV has a header and no rows", fix="give a CSV of a finished bench run")])
    return rows


def read_versus_csv(path: Path) -> list[VersusRow]:
    """Rows of a versus-search CSV file (ConfigError for an unreadable or bad file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(
            str(path), [FieldProblem(field="file", message=f"cannot read it: {err}", fix="give the CSV that bench.versus_search wrote")]
        ) from None
    return parse_versus_csv(text, str(path))


def consistency_problems(rows: Sequence[VersusRow]) -> list[FieldProblem]:
    """Problems across rows: one mode for the file, each (method, family, seed, job) once, best-so-far never falling."""
    problems: list[FieldProblem] = []
    seen: dict[tuple[str, str, int, int], int] = {}
    modes = {rows[0].mode} if rows else set()
    for number, row in enumerate(rows, start=1):
        if row.mode not in modes:
            problems.append(FieldProblem(field=f"row {number}, column mode", message=f"{row.mode} in a {rows[0].mode} file", fix="one bench run per file"))
        key = (row.method, row.family, row.seed, row.job_index)
        if key in seen:
            problems.append(
                FieldProblem(
                    field=f"row {number}, column job_index", message=f"the same job as row {seen[key]}", fix="one row per method, family, seed and job"
                )
            )
        seen.setdefault(key, number)
    for (method, family, seed), series in sequences(rows).items():
        for before, after in zip(series, series[1:]):
            if after.best_so_far < before.best_so_far:
                number = seen[(method, family, seed, after.job_index)]
                problems.append(
                    FieldProblem(field=f"row {number}, column best_so_far", message="falls below the previous job's", fix="best-so-far never falls")
                )
    return problems


def sequences(rows: Iterable[VersusRow]) -> dict[tuple[str, str, int], list[VersusRow]]:
    """Each (method, family, seed)'s rows in job order."""
    out: dict[tuple[str, str, int], list[VersusRow]] = defaultdict(list)
    for row in rows:
        out[(row.method, row.family, row.seed)].append(row)
    return {key: sorted(series, key=lambda row: row.job_index) for key, series in out.items()}


def best_so_far(floor: float, scores: Sequence[float | None]) -> list[float]:
    """After each job, the highest of the floor and the scores so far (None: a job that added no score)."""
    out: list[float] = []
    best = floor
    for score in scores:
        if score is not None:
            best = max(best, score)
        out.append(best)
    return out


T_975: tuple[float, ...] = (
    12.706205,
    4.302653,
    3.182446,
    2.776445,
    2.570582,
    2.446912,
    2.364624,
    2.306004,
    2.262157,
    2.228139,
    2.200985,
    2.178813,
    2.160369,
    2.144787,
    2.131450,
    2.119905,
    2.109816,
    2.100922,
    2.093024,
    2.085963,
    2.079614,
    2.073873,
    2.068658,
    2.063899,
    2.059539,
    2.055529,
    2.051831,
    2.048407,
    2.045230,
    2.042272,
)
"""Student's t quantile 0.975 for 1 to 30 degrees of freedom."""


def t_critical_95(df: int) -> float:
    """The two-sided 95% critical value of Student's t with ``df`` degrees of freedom (Cornish-Fisher expansion beyond 30)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2) + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)


class MeanInterval(BaseModel):
    """A mean over seeds and its 95% t-interval (no interval from one value)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=1, le=10**6, description="Values averaged")
    mean: float = Field(allow_inf_nan=False, description="Their mean")
    low: float | None = Field(default=None, allow_inf_nan=False, description="Lower end of the 95% interval (None for one value)")
    high: float | None = Field(default=None, allow_inf_nan=False, description="Upper end of the 95% interval (None for one value)")


def mean_ci(values: Sequence[float]) -> MeanInterval:
    """Mean and 95% Student-t confidence interval of the values (ValueError when there are none)."""
    if not values:
        raise ValueError("no values to average")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return MeanInterval(n=1, mean=mean)
    half = t_critical_95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return MeanInterval(n=len(values), mean=mean, low=mean - half, high=mean + half)


def clipped(interval: MeanInterval, lowest: float, highest: float) -> MeanInterval:
    """The interval cut to the range the values can take (a t-interval of scores in [0, 1] may reach past it)."""
    if interval.low is None or interval.high is None:
        return interval
    return interval.model_copy(update={"low": max(lowest, interval.low), "high": min(highest, interval.high)})


class SummaryPoint(BaseModel):
    """One (method, family, jobs spent) point: best-so-far over the seeds, and what those jobs cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Method = Field(description="Who wrote the jobs")
    family: str = Field(pattern=FAMILY_PATTERN, description="Task family")
    held_out: bool = Field(description="Whether the family is held out from the agent's training")
    budget: int = Field(ge=1, le=10_000, description="Inner jobs spent")
    best: MeanInterval = Field(description="Best-so-far after `budget` jobs, over the seeds (the interval clipped to [0, 1])")
    floor: float = Field(ge=0.0, le=1.0, description="The floor (small base model's score), mean over the seeds")
    pass_rate: float = Field(ge=0.0, le=1.0, description="Share of the jobs spent that passed the probe and trained")
    cpu_s: float = Field(ge=0.0, description="CPU seconds of the jobs spent, mean over the seeds")
    cost_usd: float = Field(ge=0.0, description="USD of the jobs spent, mean over the seeds")


def summarize(rows: Sequence[VersusRow], budgets: Sequence[int] = BUDGETS) -> list[SummaryPoint]:
    """A point per (method, family, budget) that every seed of the pair has reached, in method order."""
    by_pair: dict[tuple[str, str], list[list[VersusRow]]] = defaultdict(list)
    for (method, family, _seed), series in sequences(rows).items():
        by_pair[(method, family)].append(series)
    points: list[SummaryPoint] = []
    for method_name, family in sorted(by_pair, key=lambda pair: (METHODS.index(pair[0]), pair[1])):
        seeds = by_pair[(method_name, family)]
        reached = min(len(series) for series in seeds)
        for budget in budgets:
            if budget > reached:
                continue
            spent = [series[:budget] for series in seeds]
            points.append(
                SummaryPoint(
                    method=seeds[0][0].method,
                    family=family,
                    held_out=seeds[0][0].held_out,
                    budget=budget,
                    best=clipped(mean_ci([jobs[-1].best_so_far for jobs in spent]), 0.0, 1.0),
                    floor=statistics.fmean(jobs[0].base_score for jobs in spent),
                    pass_rate=sum(row.outcome == "passed" for jobs in spent for row in jobs) / (budget * len(spent)),
                    cpu_s=statistics.fmean(sum(row.cpu_s for row in jobs) for jobs in spent),
                    cost_usd=statistics.fmean(sum(row.cost_usd for row in jobs) for jobs in spent),
                )
            )
    return points


def rejections_line(rows: Sequence[VersusRow]) -> str:
    """How many of the jobs each method spent the probe rejected, over every family and seed: `method r/n`, in method order."""
    spent: dict[str, list[int]] = {}
    for row in rows:
        counts = spent.setdefault(row.method, [0, 0])
        counts[0] += row.outcome == "rejected"
        counts[1] += 1
    parts = [f"{METHOD_LABELS[method]} {spent[method][0]}/{spent[method][1]}" for method in METHODS if method in spent]
    return "jobs lost to probe rejections: " + ("; ".join(parts) if parts else "no jobs")


def interval_text(interval: MeanInterval) -> str:
    """`0.512 [0.401, 0.623]`, or the mean alone for one value."""
    if interval.low is None or interval.high is None:
        return f"{interval.mean:.3f} (one seed)"
    return f"{interval.mean:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def summary_table(points: Sequence[SummaryPoint]) -> list[str]:
    """The summary as aligned text lines, header first."""
    lines = [f"{'method':16} {'family':12} {'held-out':8} {'jobs':>4} {'seeds':>5} {'best so far, mean [95% CI]':>28} {'pass':>5} {'cpu s':>8} {'usd':>6}"]
    for point in points:
        lines.append(
            f"{METHOD_LABELS[point.method]:16} {point.family:12} {'yes' if point.held_out else 'no':8} {point.budget:4d} {point.best.n:5d} "
            f"{interval_text(point.best):>28} {point.pass_rate:5.2f} {point.cpu_s:8.1f} {point.cost_usd:6.2f}"
        )
    return lines


def zero_shot_lines(points: Sequence[SummaryPoint], family: str) -> list[str]:
    """The agent's first job on a (held-out) family against Optuna TPE's best of 1, 2, 4 and 8 jobs, in words."""
    found: dict[tuple[str, int], SummaryPoint] = {(point.method, point.budget): point for point in points if point.family == family}
    tpe = [found[("optuna_tpe", budget)] for budget in BUDGETS if ("optuna_tpe", budget) in found]
    tpe_text = "; ".join(f"best of {point.budget}: {interval_text(point.best)}" for point in tpe) or "no Optuna TPE jobs"
    lines = []
    for method in ("trained_agent", "untrained_agent"):
        first = found.get((method, 1))
        label = METHOD_LABELS[method]
        if first is None:
            lines.append(
                f"zero-shot on {family}: {label}: MISSING (not run: no policy given)"
                if method == "trained_agent"
                else f"zero-shot on {family}: {label}: not run"
            )
            continue
        matched = next((point.budget for point in tpe if point.best.mean >= first.best.mean), None)
        verdict = (
            f"Optuna TPE matches it in {matched} job(s)" if matched is not None else f"Optuna TPE does not match it within {tpe[-1].budget if tpe else 0} jobs"
        )
        lines.append(f"zero-shot on {family}: {label}'s first job {interval_text(first.best)}; Optuna TPE {tpe_text}; {verdict} (means)")
    return lines


def shape_problems(rows: Sequence[VersusRow], methods: Sequence[str], families: Sequence[str], seeds: Sequence[int], jobs: int, mode: Mode) -> list[str]:
    """What is wrong with a bench run's rows against its plan: rows per method/family/seed, job order, monotone best-so-far, ordered CIs."""
    problems: list[str] = []
    series = sequences(rows)
    expected = {(method, family, seed) for method in methods for family in families for seed in seeds}
    for key in sorted(set(series) - expected):
        problems.append(f"unexpected rows for {key}")
    for method, family, seed in sorted(expected):
        found = series.get((method, family, seed), [])
        want = 1 if method in SINGLE_JOB_METHODS else jobs
        if [row.job_index for row in found] != list(range(1, want + 1)):
            problems.append(f"{method}/{family}/seed {seed}: jobs {[row.job_index for row in found]}, expected 1..{want}")
        values = [row.best_so_far for row in found]
        if any(after < before for before, after in zip(values, values[1:])):
            problems.append(f"{method}/{family}/seed {seed}: best-so-far falls: {values}")
    if any(row.mode != mode for row in rows):
        problems.append(f"rows not labelled {mode}")
    for point in summarize(rows):
        low, high = point.best.low, point.best.high
        if len(seeds) > 1 and (low is None or high is None or not low <= point.best.mean <= high):
            problems.append(f"{point.method}/{point.family}/{point.budget} jobs: CI bounds out of order: {low}, {point.best.mean}, {high}")
    return problems


def merge_versus_parts(parts: Sequence[tuple[str, Sequence[VersusRow]]]) -> list[VersusRow]:
    """The rows of several bench runs (each `(source, rows)`, e.g. one family each) as one table.

    ConfigError naming the sources when they cannot be one table: their modes differ, or a family
    appears in two of them (the same family benched twice: keep one run of it).
    """
    if not parts:
        raise ConfigError("--merge", [FieldProblem(field="--merge", message="no CSV given", fix="give the CSVs of the bench runs to merge")])
    problems: list[FieldProblem] = []
    first_source, first_rows = parts[0]
    mode = first_rows[0].mode  # read_versus_csv gives no empty part
    owner: dict[str, str] = {}
    for source, rows in parts:
        if rows[0].mode != mode:
            problems.append(FieldProblem(field=source, message=f"a {rows[0].mode} run, and {first_source} is a {mode} run", fix="merge runs of one mode"))
        for family in sorted({row.family for row in rows}):
            if family in owner and owner[family] != source:
                problems.append(
                    FieldProblem(field=source, message=f"family {family} is also in {owner[family]}", fix="merge one bench run per family; drop one of the two")
                )
            owner.setdefault(family, source)
    merged = [row for _source, rows in parts for row in rows]
    problems += consistency_problems(merged)
    if problems:
        raise ConfigError("--merge", problems[:50])
    return merged


def acceptance_lines(points: Sequence[SummaryPoint], budget: int = 4) -> list[str]:
    """Per family: the trained agent's first job against the sensible preset's mean, and its best of `budget` against
    Optuna TPE's (means over the seeds), then the counts over the families; a family missing a method says so."""
    found = {(point.method, point.family, point.budget): point for point in points}
    families = sorted({point.family for point in points}, key=lambda family: (not any(p.held_out for p in points if p.family == family), family))
    lines = []
    first_wins = best_wins = compared = 0
    for family in families:
        first, preset = found.get(("trained_agent", family, 1)), found.get(("sensible_preset", family, 1))
        ours, tpe = found.get(("trained_agent", family, budget)), found.get(("optuna_tpe", family, budget))
        if first is None or preset is None or ours is None or tpe is None:
            lines.append(f"{family}: not compared (trained agent, sensible preset or Optuna TPE missing at 1 or {budget} jobs)")
            continue
        compared += 1
        first_ok, best_ok = first.best.mean >= preset.best.mean, ours.best.mean > tpe.best.mean
        first_wins += first_ok
        best_wins += best_ok
        lines.append(
            f"{family}: trained agent's first job {first.best.mean:.3f} {'>=' if first_ok else '<'} sensible preset {preset.best.mean:.3f}; "
            f"its best of {budget} {ours.best.mean:.3f} {'>' if best_ok else '<='} Optuna TPE's {tpe.best.mean:.3f}"
        )
    lines.append(f"over {compared} families: first job at or above the sensible preset on {first_wins}; best of {budget} above Optuna TPE's on {best_wins}")
    return lines
