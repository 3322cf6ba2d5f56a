"""`metarl report`: one self-contained HTML page of a run, its PNG plots, and the numbers behind them as CSV.

Writes into one folder: `index.html`, `steps.csv` and `latency.csv` (one row per outer step), and
one PNG per plot that has data. Plots are drawn with matplotlib's Agg canvas (no pyplot, no display).
Given the rows of a `bench.versus_search` CSV (`metarl/versus_search.py`), it also draws the agent
against the searches (`versus_search.png`) and adds their summary to the page.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from metarl.report.tables import STAGES, Cell, Change, ReportData, Table, change, latency_table, series, step_table, to_csv
from metarl.versus_search import METHOD_LABELS, METHODS, SINGLE_JOB_METHODS, VersusRow, interval_text, summarize, zero_shot_lines

STEPS_CSV = "steps.csv"
LATENCY_CSV = "latency.csv"
INDEX = "index.html"


@dataclass(frozen=True)
class LinePlot:
    """A line plot of columns of the step table against the outer step."""

    file: str
    title: str
    ylabel: str
    lines: tuple[tuple[str, str], ...]  # (column, legend label)
    unit_interval: bool = False  # y from 0 to 1 (shares and rates)
    caption: str = ""
    doubling_line: bool = False  # a reference line at twice the first value of the first column


LINE_PLOTS: tuple[LinePlot, ...] = (
    LinePlot(
        "reward.png",
        "Agent reward per outer step",
        "reward",
        (("reward_mean", "mean reward of the batch"), ("held_out_reward_mean", "held-out family reward")),
        caption="Mean reward of the episodes in each outer batch, and of the held-out family's episodes sampled with the step's starting policy.",
    ),
    LinePlot(
        "improvement.png",
        "Raw hidden-eval improvement of the inner jobs",
        "trained - base score",
        (("raw_improvement_mean", "mean over the batch"),),
        caption="Hidden-eval score of the trained checkpoint minus that of its base model, mean over the batch's inner jobs.",
        doubling_line=True,
    ),
    LinePlot(
        "large_model.png",
        "Share of jobs choosing the larger model",
        "share of jobs",
        (("large_model_share", "larger model"),),
        unit_interval=True,
    ),
    LinePlot(
        "explicit_hparams.png",
        "Share of hyperparameters set explicitly",
        "share",
        (("explicit_hparam_share", "explicit hyperparameters"),),
        unit_interval=True,
    ),
    LinePlot(
        "first_try_pass.png",
        "First-try validation pass rate",
        "pass rate",
        (("first_try_pass_rate", "probe passed on the first attempt"),),
        unit_interval=True,
    ),
)
COST_PNG = "cost.png"
LATENCY_PNG = "latency.png"
VERSUS_PNG = "versus_search.png"


def write_report(data: ReportData, out_dir: Path, versus_rows: Sequence[VersusRow] = ()) -> Path:
    """Write the report of one run into out_dir (created if needed); returns the path of index.html.

    ``versus_rows``: the rows of a versus-search CSV to draw beside the run's plots (none: no such section)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = step_table(data.steps)
    latency = latency_table(data.steps, data.durations)
    _write_text(out_dir / STEPS_CSV, to_csv(steps))
    _write_text(out_dir / LATENCY_CSV, to_csv(latency))
    drawn: dict[str, bool] = {}
    for plot in LINE_PLOTS:
        drawn[plot.file] = _keep_or_remove(out_dir / plot.file, draw_line_plot(out_dir / plot.file, steps, plot))
    drawn[COST_PNG] = _keep_or_remove(out_dir / COST_PNG, draw_cost_plot(out_dir / COST_PNG, steps))
    drawn[LATENCY_PNG] = _keep_or_remove(out_dir / LATENCY_PNG, draw_latency_plot(out_dir / LATENCY_PNG, latency))
    drawn[VERSUS_PNG] = _keep_or_remove(out_dir / VERSUS_PNG, bool(versus_rows) and draw_versus_search_plot(out_dir / VERSUS_PNG, versus_rows))
    index = out_dir / INDEX
    _write_text(index, render_html(data, steps, latency, drawn, versus_rows))
    return index


def _write_text(path: Path, text: str) -> None:
    """Write a file whole: to a temporary name first, then renamed over the old one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _keep_or_remove(path: Path, drawn: bool) -> bool:
    """A plot not drawn this time must not leave an older PNG of the same name behind."""
    if not drawn:
        path.unlink(missing_ok=True)
    return drawn


def _figure(width: float = 7.0, height: float = 3.6) -> Figure:
    """A figure on matplotlib's Agg canvas (no pyplot state, no display)."""
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _step_axis(ax: Axes) -> None:
    """Outer steps on the x axis, integer ticks, a light grid."""
    ax.set_xlabel("outer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def draw_line_plot(path: Path, steps: Table, plot: LinePlot) -> bool:
    """Draw one line plot as PNG; False (and nothing written) when none of its columns has a value."""
    lines = [(label, *series(steps, column)) for column, label in plot.lines]
    if not any(xs for _, xs, _ in lines):
        return False
    fig = _figure()
    ax = fig.add_subplot()
    for label, xs, ys in lines:
        if xs:
            ax.plot(xs, ys, marker="o", label=label)
    if plot.doubling_line:
        found = change(steps, plot.lines[0][0])
        ax.axhline(0.0, color="grey", linewidth=0.8)
        if found.first is not None and found.first > 0:
            ax.axhline(2 * found.first, color="grey", linestyle=":", label=f"2 x step {found.first_step}")
    if plot.unit_interval:
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(plot.title)
    ax.set_ylabel(plot.ylabel)
    _step_axis(ax)
    ax.legend(loc="best", fontsize="small")
    fig.savefig(path, format="png")
    return True


def draw_cost_plot(path: Path, steps: Table) -> bool:
    """Dollars per outer step (bars) and cumulative (line), side by side; False when no step has a cost."""
    xs, per_step = series(steps, "cost_usd_step")
    cx, cumulative = series(steps, "cost_usd_total")
    if not xs and not cx:
        return False
    fig = _figure(9.0, 3.6)
    left, right = fig.subplots(1, 2)
    left.bar(xs, per_step, color="tab:blue")
    left.set_title("Cost per outer step")
    left.set_ylabel("USD")
    right.plot(cx, cumulative, marker="o", color="tab:orange")
    right.set_title("Cumulative cost")
    right.set_ylabel("USD")
    for ax in (left, right):
        _step_axis(ax)
    fig.savefig(path, format="png")
    return True


def draw_latency_plot(path: Path, latency: Table) -> bool:
    """Median and p90 seconds of each stage per outer step, one panel per stage; False when no claim finished."""
    if not any(series(latency, f"{stage}_median_s")[0] for stage in STAGES):
        return False
    fig = _figure(9.0, 6.0)
    axes = fig.subplots(2, 2, sharex=True)
    for ax, stage in zip(axes.flat, STAGES):
        mx, median = series(latency, f"{stage}_median_s")
        px, p90 = series(latency, f"{stage}_p90_s")
        if mx:
            ax.plot(mx, median, marker="o", label="median")
            ax.plot(px, p90, marker="^", linestyle="--", label="p90")
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no finished claims", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{stage} stage")
        ax.set_ylabel("seconds")
        _step_axis(ax)
    for ax in axes[0]:
        ax.set_xlabel("")
    fig.savefig(path, format="png")
    return True


def draw_versus_search_plot(path: Path, rows: Sequence[VersusRow]) -> bool:
    """Best score so far against inner jobs spent, a line per method and a panel per family (held-out first); False when no point."""
    points = summarize(rows)
    if not points:
        return False
    held_out = {point.family: point.held_out for point in points}
    families = sorted(held_out, key=lambda family: (not held_out[family], family))
    budgets = sorted({point.budget for point in points})
    fig = _figure(0.5 + 4.2 * len(families), 4.2)
    axes = fig.subplots(1, len(families), squeeze=False)[0]
    for ax, family in zip(axes, families):
        mine = [point for point in points if point.family == family]
        for method in METHODS:
            line = [point for point in mine if point.method == method]
            if not line:
                continue
            xs = [point.budget for point in line]
            ys = [point.best.mean for point in line]
            lows = [point.best.low if point.best.low is not None else point.best.mean for point in line]
            highs = [point.best.high if point.best.high is not None else point.best.mean for point in line]
            if method in SINGLE_JOB_METHODS:
                errors = [[y - low for y, low in zip(ys, lows)], [high - y for y, high in zip(ys, highs)]]
                ax.errorbar(xs, ys, yerr=errors, fmt="s", capsize=4, color="black", label=METHOD_LABELS[method])
                continue
            drawn = ax.plot(xs, ys, marker="o", label=METHOD_LABELS[method])
            ax.fill_between(xs, lows, highs, alpha=0.15, color=drawn[0].get_color())
        ax.axhline(mine[0].floor, color="grey", linestyle=":", linewidth=1.0, label="floor: small base model")
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(budget) for budget in budgets])
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{family} (held out)" if held_out[family] else family)
        ax.set_xlabel("inner jobs spent")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("best hidden-eval score so far")
    axes[0].legend(loc="best", fontsize="small")
    title = "Best score so far against inner jobs spent (mean and 95% t-interval over seeds, clipped to [0, 1])"
    if any(row.mode == "quick" for row in rows):
        title = f"QUICK RUN (short jobs; not comparable to a full run)\n{title}"
    missing = [METHOD_LABELS[method] for method in METHODS if method not in {row.method for row in rows}]
    if missing:
        title += f"\nnot in the CSV: {', '.join(missing)}"
    fig.suptitle(title, fontsize="medium")
    fig.savefig(path, format="png")
    return True


# ---- HTML -------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 980px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
.simulated { background: #fff3cd; border: 1px solid #e0c060; padding: 0.5em 1em; }
.empty { color: #777; font-style: italic; }
figure { margin: 1em 0; } figure img { max-width: 100%; } figcaption { font-size: 0.85em; color: #555; }
"""


def esc(value: object) -> str:
    """Text (from the database or anywhere) escaped for HTML, quotes included."""
    return html.escape(str(value), quote=True)


def fmt(value: Cell, digits: int = 4) -> str:
    """A number for people: blanks as a dash, floats to `digits` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_html(data: ReportData, steps: Table, latency: Table, drawn: dict[str, bool], versus_rows: Sequence[VersusRow] = ()) -> str:
    """The report page; every text from the records is escaped, images and tables are linked relatively."""
    run = data.run
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>metarl report: {esc(run.name)} ({esc(run.id)})</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Run {esc(run.name)}</h1>",
    ]
    if data.simulated:
        parts.append(
            '<p class="simulated"><strong>SIMULATED.</strong> Some inner jobs, evaluations or charges of this run come from the simulator '
            '(<code>type = "sim"</code>): their durations, scores and prices are simulated, not measured.</p>'
        )
    parts.append(_summary(data, steps))
    empty_steps = "no outer step has finished yet" if data.steps else "the run has no outer steps yet"
    for plot in LINE_PLOTS:
        parts.append(f"<h2>{esc(plot.title)}</h2>")
        if plot.doubling_line:
            parts.append(_improvement_note(change(steps, plot.lines[0][0])))
        parts.append(_figure_html(plot.file, plot.title, plot.caption, drawn.get(plot.file, False), empty_steps))
    parts.append("<h2>Cost</h2>")
    cost_caption = "Ledger total recorded with each outer step, and its increase since the previous one."
    parts.append(_figure_html(COST_PNG, "Cost per outer step and cumulative cost", cost_caption, drawn.get(COST_PNG, False), empty_steps))
    parts.append(_costs_table(data))
    parts.append("<h2>Stage latency</h2>")
    latency_caption = "Median and p90 seconds of the finished claims of each stage, over the episodes of each outer batch."
    latency_empty = "no stage claim of a batched episode has finished yet"
    parts.append(_figure_html(LATENCY_PNG, "Stage latency per outer step", latency_caption, drawn.get(LATENCY_PNG, False), latency_empty))
    if versus_rows:
        parts.append(_versus_section(versus_rows, drawn.get(VERSUS_PNG, False)))
    parts.append("<h2>Numbers</h2>")
    parts.append(
        f'<p>As CSV: <a href="{STEPS_CSV}">{STEPS_CSV}</a> (one row per outer step), <a href="{LATENCY_CSV}">{LATENCY_CSV}</a> '
        "(per outer step and stage: finished claims, median and p90 seconds).</p>"
    )
    parts.append(html_table(steps))
    parts.append(html_table(latency))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _summary(data: ReportData, steps: Table) -> str:
    """The run header as a two-column table."""
    run = data.run
    done = sum(1 for status in steps.column("status") if status == "done")
    stages = ", ".join(f"{esc(stage)} {count}" for stage, count in data.episodes_by_stage.items() if count)
    rows = [
        ("run id", esc(run.id)),
        ("status", esc(run.status)),
        ("policy version", esc(run.policy_version)),
        ("created", esc(run.created_at)),
        ("finished", esc(run.finished_at or "-")),
        ("outer steps", f"{len(steps.rows)} ({done} done)"),
        ("episodes by stage", stages or "none"),
        ("total cost", f"${data.cost_usd_total:.4f}"),
    ]
    if run.message:
        rows.append(("message", esc(run.message)))
    body = "".join(f'<tr><th class="text">{key}</th><td class="text">{value}</td></tr>' for key, value in rows)
    return f"<table>{body}</table>"


def _versus_section(rows: Sequence[VersusRow], drawn: bool) -> str:
    """The versus-search comparison: its plot, the zero-shot lines of the held-out families and the summary table."""
    quick = any(row.mode == "quick" for row in rows)
    parts = ["<h2>Versus search</h2>"]
    if quick:
        parts.append(
            '<p class="simulated"><strong>QUICK RUN.</strong> Short jobs on scaled-down base models: it checks the bench, its numbers are not comparable to a full run.</p>'
        )
    caption = (
        "From the bench.versus_search CSV given with --versus-search: best hidden-eval score so far against inner jobs spent, "
        "mean and 95% t-interval over seeds (clipped to [0, 1]). A job the probe rejects is spent and adds no score; the floor is the small base model's score."
    )
    parts.append(_figure_html(VERSUS_PNG, "Versus search", caption, drawn, "the CSV has no points"))
    points = summarize(rows)
    for family in sorted({point.family for point in points if point.held_out}):
        parts.extend(f"<p>{esc(line)}</p>" for line in zero_shot_lines(points, family))
    head = "".join(f"<th>{name}</th>" for name in ("method", "family", "held out", "jobs", "seeds", "best so far [95% CI]", "pass rate", "CPU s", "USD"))
    body = "".join(
        f'<tr><td class="text">{esc(METHOD_LABELS[point.method])}</td><td class="text">{esc(point.family)}</td>'
        f'<td class="text">{"yes" if point.held_out else "no"}</td><td>{point.budget}</td><td>{point.best.n}</td>'
        f'<td class="text">{esc(interval_text(point.best))}</td><td>{point.pass_rate:.2f}</td><td>{point.cpu_s:.1f}</td><td>{point.cost_usd:.2f}</td></tr>'
        for point in points
    )
    parts.append(f"<table><tr>{head}</tr>{body}</table>")
    return "\n".join(parts)


def _improvement_note(found: Change) -> str:
    """First and last mean raw improvement and their ratio, in words."""
    if found.first is None or found.last is None:
        return '<p class="empty">No inner job has a hidden-eval improvement yet.</p>'
    ratio = "undefined (the first value is not positive)" if found.ratio is None else f"{found.ratio:.3g}"
    return f"<p>Mean raw improvement: {fmt(found.first)} at step {found.first_step}, {fmt(found.last)} at step {found.last_step}; last / first = {ratio}.</p>"


def _figure_html(file: str, alt: str, caption: str, drawn: bool, empty: str) -> str:
    """An image with its caption, or a note saying why there is no plot."""
    if not drawn:
        return f'<p class="empty">No plot: {esc(empty)}.</p>'
    return f'<figure><img src="{esc(file)}" alt="{esc(alt)}"><figcaption>{esc(caption)}</figcaption></figure>'


def _costs_table(data: ReportData) -> str:
    """Ledger totals per source and kind."""
    if not data.costs:
        return '<p class="empty">No charges recorded.</p>'
    rows = "".join(
        f'<tr><td class="text">{esc(line.source)}</td><td class="text">{"simulated" if line.simulated else "real"}</td>'
        f"<td>{line.entries}</td><td>{line.usd:.4f}</td></tr>"
        for line in sorted(data.costs, key=lambda c: (c.source, c.simulated))
    )
    return f'<table><tr><th class="text">source</th><th class="text">kind</th><th>charges</th><th>USD</th></tr>{rows}</table>'


def html_table(table: Table) -> str:
    """A table as HTML, every cell escaped."""
    if not table.rows:
        return '<p class="empty">No rows.</p>'
    head = "".join(f"<th>{esc(name)}</th>" for name in table.columns)
    body = "".join("<tr>" + "".join(_cell(value) for value in row) + "</tr>" for row in table.rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Cell) -> str:
    """One escaped table cell; text left-aligned."""
    css = ' class="text"' if isinstance(value, str) else ""
    return f"<td{css}>{esc(fmt(value))}</td>"
