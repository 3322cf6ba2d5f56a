"""Benchmark local inner jobs: hidden-eval score of each base model before and after GRPO.

For every (base model, family) it prints the base score, the score after the sensible config,
the score after a deliberately bad config (learning rate far too high), and wall seconds.

    python -m bench.inner_jobs [--families addition,sorting] [--models local-s,local-l] [--quick]
    python -m bench.inner_jobs --families examples/families/increment/increment.toml --models local-s

A ``--families`` entry is a registered family's name or the path of a task spec file (a family
defined by files, see examples/families/); base models are built for the built-in families plus
every family named.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from metarl.learning.data_families import family_for
from metarl.learning.eval_secret import add_artifacts_argument, install_eval_secret
from metarl.learning.families import TaskFamily, generate_dataset
from metarl.learning.grpo import LocalTrainConfig, train
from metarl.learning.models import BASE_MODELS, build_info, enabled_families, ensure_base_model
from metarl.learning.presets import bad_config, sensible_config
from metarl.learning.registry import FAMILIES, get_family
from metarl.learning.scoring import EvalScore, score_checkpoint
from metarl.runconfig import load_task_spec
from schemas.base import ConfigError

TRAIN_ITEMS = 1000
QUICK_MAX_STEPS = 60
IMPROVEMENT_TARGET = 0.20


class JobResult(BaseModel):
    """Outcome of one trained config on one family."""

    score: EvalScore = Field(description="Hidden-eval score of the trained checkpoint.")
    steps: int = Field(ge=0, description="Steps run.")
    wall_s: float = Field(ge=0.0, description="Training wall seconds (load and save included).")


class BenchRow(BaseModel):
    """One (base model, family) line of the table."""

    model: str = Field(description="Local base model name.")
    family: str = Field(description="Task family name.")
    base: EvalScore = Field(description="Hidden-eval score of the untrained base model.")
    sensible: JobResult = Field(description="Result of the sensible config.")
    bad: JobResult = Field(description="Result of the bad config.")


def run_job(config: LocalTrainConfig, family: TaskFamily, base_dir: Path, eval_n: int, seed: int) -> JobResult:
    """Train one config on a fresh training set and score the checkpoint on the hidden eval."""
    dataset = generate_dataset(family, TRAIN_ITEMS, seed=seed, difficulty=(0.0, 1.0))
    out_dir = Path(tempfile.mkdtemp(prefix="metarl-bench-"))
    try:
        started = time.monotonic()
        outcome = train(config, dataset, family, base_dir, out_dir)
        wall = time.monotonic() - started
        score = score_checkpoint(outcome.checkpoint_dir, family, family.hidden_eval(eval_n))
    finally:
        shutil.rmtree(out_dir)
    return JobResult(score=score, steps=outcome.steps_completed, wall_s=round(wall, 1))


def bench_row(model: str, family: TaskFamily, base_dir: Path, eval_n: int, quick: bool, seed: int) -> BenchRow:
    """Base score plus one sensible and one bad job for a (model, family) pair."""
    base = score_checkpoint(base_dir, family, family.hidden_eval(eval_n))
    sensible = sensible_config(model, family, seed=seed)
    bad = bad_config(model, family, seed=seed)
    if quick:
        sensible = sensible.model_copy(update={"max_steps": QUICK_MAX_STEPS})
        bad = bad.model_copy(update={"max_steps": QUICK_MAX_STEPS})
    return BenchRow(
        model=model,
        family=family.name,
        base=base,
        sensible=run_job(sensible, family, base_dir, eval_n, seed),
        bad=run_job(bad, family, base_dir, eval_n, seed),
    )


def format_row(row: BenchRow) -> str:
    """One table line."""
    gain = row.sensible.score.mean - row.base.mean
    bad_gain = row.bad.score.mean - row.base.mean
    return (
        f"{row.model:8s} {row.family:12s} {row.base.mean:6.3f} "
        f"{row.sensible.score.mean:8.3f} {gain:+7.3f} {row.bad.score.mean:6.3f} {bad_gain:+7.3f} "
        f"{row.sensible.steps:6d} {row.sensible.wall_s:8.1f} {row.bad.wall_s:7.1f}"
    )


TABLE_HEADER = f"{'model':8s} {'family':12s} {'base':>6s} {'sensible':>8s} {'gain':>7s} {'bad':>6s} {'bad-gain':>7s} {'steps':>6s} {'wall_s':>8s} {'bad_s':>7s}"


def summarize(rows: list[BenchRow]) -> list[str]:
    """Per-model count of families meeting the improvement target, and larger-vs-smaller comparison."""
    lines = []
    models = sorted({row.model for row in rows})
    for model in models:
        mine = [row for row in rows if row.model == model]
        hits = sum(row.sensible.score.mean - row.base.mean >= IMPROVEMENT_TARGET for row in mine)
        bad_worse = sum(row.bad.score.mean < row.sensible.score.mean for row in mine)
        slowest = max(row.sensible.wall_s for row in mine)
        lines.append(
            f"{model}: gain >= {IMPROVEMENT_TARGET:.2f} on {hits}/{len(mine)} families; bad config worse on "
            f"{bad_worse}/{len(mine)}; slowest sensible job {slowest:.1f} s"
        )
    if {"local-s", "local-l"} <= set(models):
        small = {row.family: row.sensible.score.mean for row in rows if row.model == "local-s"}
        large = {row.family: row.sensible.score.mean for row in rows if row.model == "local-l"}
        shared = sorted(set(small) & set(large))
        higher = sum(large[family] > small[family] for family in shared)
        lines.append(f"local-l ends higher than local-s on {higher}/{len(shared)} families")
    return lines


def resolve_family(entry: str) -> TaskFamily:
    """The family of one ``--families`` entry: a task spec file (``*.toml``, checked with its data) or a registered name."""
    if entry.endswith(".toml") or Path(entry).is_file():
        return family_for(load_task_spec(Path(entry)))
    return get_family(entry)


def resolve_families(text: str) -> list[TaskFamily]:
    """The families of a comma-separated ``--families`` value, in order (ConfigError for a bad spec, KeyError for an unknown name)."""
    return [resolve_family(entry.strip()) for entry in text.split(",") if entry.strip()]


def pretraining_families(families: list[TaskFamily]) -> dict[str, TaskFamily]:
    """The families the bench's base models are built for: the enabled ones plus every family benchmarked."""
    return {**enabled_families(), **{family.name: family for family in families}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated family names or task spec files (default: every registered family)")
    parser.add_argument("--models", default=None, help="comma-separated base models (default: local-s,local-l; with --quick local-s)")
    parser.add_argument("--quick", action="store_true", help=f"local-s only, {QUICK_MAX_STEPS} steps, 100 eval items")
    parser.add_argument("--eval-n", type=int, default=None, help="hidden-eval items per family (default 200; with --quick 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of datasets and training")
    parser.add_argument("--cache-dir", default=None, help="base-model cache (default $METARL_CACHE_DIR, else ~/.cache/metarl/models)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    add_artifacts_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    install_eval_secret(args.artifacts)
    try:
        families = resolve_families(args.families)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    default_models = "local-s" if args.quick else ",".join(BASE_MODELS)
    models = [name.strip() for name in (args.models or default_models).split(",") if name.strip()]
    eval_n = args.eval_n or (100 if args.quick else 200)
    rows: list[BenchRow] = []
    for model in models:
        started = time.monotonic()
        base_dir = ensure_base_model(model, args.cache_dir, families=pretraining_families(families))
        info = build_info(base_dir)
        print(
            f"# {model}: {info['parameters']:,} parameters, built in {info['build_seconds']} s (ready after {time.monotonic() - started:.1f} s), {base_dir}",
            flush=True,
        )
    print(TABLE_HEADER, flush=True)
    for model in models:
        base_dir = ensure_base_model(model, args.cache_dir, families=pretraining_families(families))
        for family in families:
            row = bench_row(model, family, base_dir, eval_n, args.quick, args.seed)
            rows.append(row)
            print(format_row(row), flush=True)
    for line in summarize(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps([row.model_dump() for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
