"""What `bench.versus_search` writes (CSV, plot, meta, summary) and how it merges the runs of one plan, split by family, into one table."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench._provenance import git_commit
from metarl.versus_search import (
    METHOD_LABELS,
    Mode,
    VersusRow,
    acceptance_lines,
    merge_versus_parts,
    read_versus_csv,
    rejections_line,
    rows_to_csv,
    shape_problems,
    summarize,
    summary_table,
    zero_shot_lines,
)
from schemas.base import ConfigError, FieldProblem


def write_outputs(
    out: Path, mode: Mode, rows: Sequence[VersusRow], meta: Mapping[str, Any], header: Sequence[str], notes: Sequence[str] = (), footer: Sequence[str] = ()
) -> tuple[Path, Path]:
    """Write a bench table's CSV, plot, meta JSON and summary (table, zero-shot lines of its held-out families, `notes`,
    rejections, acceptance lines, `footer`) into `out`, print the summary; the CSV's and the plot's paths."""
    from metarl.report.html import draw_versus_search_plot

    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / f"versus_search-{mode}.csv", out / f"versus_search-{mode}.png"
    csv_path.write_text(rows_to_csv(rows), encoding="utf-8")
    draw_versus_search_plot(png_path, list(rows))
    (out / f"meta-{mode}.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    points = summarize(rows)
    lines = [*header, *summary_table(points)]
    for family in dict.fromkeys(row.family for row in rows if row.held_out):
        lines += zero_shot_lines(points, family)
    lines += [*notes, rejections_line(rows), *acceptance_lines(points), *footer]
    (out / f"summary-{mode}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return csv_path, png_path


PLAN_KEYS_TO_MATCH = ("mode", "seeds", "jobs", "train_seconds", "eval_items", "model_scale")
"""What the bench runs merged into one table must share (their families differ)."""


META_KEYS_TO_MATCH = {
    "eval_partition": (
        "another hidden-eval partition (other hidden items)",
        "merge runs made with the same METARL_EVAL_SECRET (BENCHMARKS.md names the benchmark's)",
    ),
    "base_models": (
        "other base-model weights (a build can differ between CPUs)",
        "install the shipped base models first on every machine (`python -m bench.base_models install`, BENCHMARKS.md) and rerun the odd part",
    ),
    "trained_agent": ("another trained policy", "merge runs of one --policy"),
}
"""Meta entries the merged runs must share: what a difference means, and the fix."""


def merge_plan_problems(metas: Sequence[tuple[str, dict[str, Any]]]) -> list[FieldProblem]:
    """Where the plans, or the meta entries of `META_KEYS_TO_MATCH`, of the runs to merge differ from the first one's, a problem naming the file and the key."""
    problems = []
    first_source, first = metas[0]
    for source, meta in metas[1:]:
        for key in PLAN_KEYS_TO_MATCH:
            if meta["plan"].get(key) != first["plan"].get(key):
                problems.append(
                    FieldProblem(
                        field=f"{source}: plan.{key}",
                        message=f"{meta['plan'].get(key)!r} here, {first['plan'].get(key)!r} in {first_source}",
                        fix="merge runs of one plan (rerun the odd one with the same --seeds, --jobs and --train-seconds)",
                    )
                )
        for key, (meaning, fix) in META_KEYS_TO_MATCH.items():
            if meta.get(key) != first.get(key):
                problems.append(
                    FieldProblem(
                        field=f"{source}: {key}",
                        message=f"{meaning}: {json.dumps(meta.get(key))} here, {json.dumps(first.get(key))} in {first_source}",
                        fix=fix,
                    )
                )
    return problems


def read_part_meta(csv_path: Path, mode: str) -> dict[str, Any]:
    """The `meta-<mode>.json` the bench wrote beside a CSV (ConfigError naming the file when it is missing or unreadable)."""
    path = csv_path.with_name(f"meta-{mode}.json")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(
            str(csv_path), [FieldProblem(field=str(path), message=f"cannot read the run's plan: {err}", fix="keep the bench's meta file beside its CSV")]
        ) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("plan"), dict):
        raise ConfigError(str(csv_path), [FieldProblem(field=str(path), message="no plan in it", fix="keep the meta file the bench wrote")])
    return meta


def part_label(path: Path) -> str:
    """How a merged table names one of its parts: the path from the current folder when under it, else its folder and file name
    (a part written under /tmp is named by the run's folder, not by where it happened to lie)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return f"{path.parent.name}/{path.name}"


def merge_main(paths: Sequence[Path], out: Path | None) -> int:
    """Merge the CSVs of bench runs of one plan into one CSV, plot and summary (with the acceptance lines); 0 when the result has its shape."""
    try:
        parts = [(str(path), read_versus_csv(path)) for path in paths]
        metas = [(source, read_part_meta(Path(source), rows[0].mode)) for source, rows in parts]
        problems = merge_plan_problems(metas)
        if problems:
            raise ConfigError("--merge", problems)
        rows = merge_versus_parts(parts)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    mode, plan = rows[0].mode, metas[0][1]["plan"]
    out = out or Path(".metarl") / "versus-search" / f"{mode}-merged"
    labels = [part_label(Path(source)) for source, _rows in parts]
    meta = {
        "mode": mode,
        "merged_from": [{"csv": label, **part} for label, (_source, part) in zip(labels, metas)],
        "commit": git_commit(),
        "eval_partition": metas[0][1].get("eval_partition"),
        "base_models": metas[0][1].get("base_models"),
    }
    header = [f"# versus search, {mode} run, merged from {len(parts)} CSVs: {', '.join(labels)}"]
    csv_path, png_path = write_outputs(out, mode, rows, meta, header)
    families = list(dict.fromkeys(row.family for row in rows))
    methods = [method for method in METHOD_LABELS if any(row.method == method for row in rows)]
    shape = shape_problems(rows, methods, families, list(range(int(plan["seeds"]))), int(plan["jobs"]), mode)
    for problem in shape:
        print(f"output check: {problem}", file=sys.stderr)
    print(f"# merged output {'FAILED its shape check' if shape else 'checked'}: {csv_path}, {png_path}, {out / f'summary-{mode}.txt'}", flush=True)
    return 1 if shape else 0
