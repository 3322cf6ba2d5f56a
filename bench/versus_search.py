"""Does the trained agent beat a tuner? Best hidden-eval score so far against inner jobs spent, on the local backends.

    python -m bench.versus_search --policy PATH                          # the full plan: 3 hours on 2 cores at worst (arithmetic below)
    python -m bench.versus_search --policy PATH --families addition      # one family of it (14-21 minutes measured)
    python -m bench.versus_search --merge .metarl/versus-search/full-*/versus_search-full.csv   # the runs of one plan as one table
    python -m bench.versus_search --quick                                # 3-7 minutes: checks the machinery, numbers labelled QUICK

For every task of the run config (`--config`, default `examples/local.toml`: its held-out family
first, then its training families; `--families` picks task ids of it or task spec files), each
method spends inner jobs one after another at the run's own job budget (the largest training-time
cap of its tasks, 60 s for `examples/local.toml`; `--train-seconds` compares at another), and after
each job the best score so far is recorded (`metarl/versus_search.py`: never below the floor, the
small base model's own score; a job the probe rejects, or one that fails, is spent and adds no
score, and the summary counts each method's jobs lost to rejections). Methods:

- trained agent: a policy state saved by an `examples/local.toml` run (`--policy PATH`, e.g.
  `<artifacts>/policy/<run>/v00040-<attempt>.pt`), with its provenance (run id, commit, seed,
  outer version) from `PATH.provenance.json` beside it, else from the path and `--policy-commit`,
  `--policy-seed`. No policy given: the method is reported MISSING, never stood in for. Shipped states of
  the current job language: `bench/results/local-meta-rl-2026-12-07-partition-seed2/v00012-3a68e5455907.pt` (the
  benchmark partition on the shipped base models, BENCHMARKS.md),
  `bench/results/local-meta-rl-2026-12-07-partition-seed0/v00018-d37025640df4.pt`,
  `bench/results/local-meta-rl-2026-12-06-seed2/v00023-ac87bfe67b8d.pt` and
  `bench/results/local-meta-rl-2026-12-06-seed1/v00040-355c39ce2b39.pt`, each with its provenance.
- untrained agent: the policy a run starts from (`LocalPolicy` with the run config's init seed and
  prior). Both agents sample as in the run (its temperature, `sample_seed`, the job's seed in
  job.toml); after a rejection the next job is the episode's next attempt, conditioned on the
  probe's feedback, up to `retries.max_probe_attempts`.
- random search: one uniform choice per slot of the job language (`metarl/policy/job_language.py`:
  the model, the seven hyperparameters with their `default` token, each reward component absent or
  one of the weights, the dataset size and difficulty), so every job the agent can write, and only
  those, can be drawn.
- Optuna TPE (`optuna.samplers.TPESampler`, seeded, ask/tell) over the same slots as categorical
  distributions; a rejected or failed job is told 0.0. TPE's default of 10 random start-up trials
  would make all its jobs random, so it starts modelling after 3.
- sensible preset (`metarl/learning/presets.py`, the small model's) as one job.

Every job goes through the same probe (`probe_job_text` with the local trainer's compile check)
and, when it passes, is trained and scored exactly as in a run: `LocalTrain.launch` (a trainer
process, `python -m metarl.backends.local.job`, one torch thread), polled, then
`LocalEval.score_trained` on the task's hidden eval. The searches select on the hidden-eval score
itself (an optimistic tuner: one in practice would select on a validation split). The local
backends are not billed (`metarl/dry_run.py`), so cost_usd is 0 and the CPU seconds are the cost.

Budget of the full plan (2 cores, two jobs at once): 6 families x 3 seeds x (4 searching methods x
4 jobs + 1 sensible job) = 306 jobs at worst (a rejected job costs milliseconds). A passing job is
its 60 s of training (`time_budget_s`) plus at most about 9 s of trainer start, model load and save,
and scoring 200 hidden-eval items (6-8.5 s measured on a shared 2-core AMD EPYC, local-l the
slower): 153 rounds of two jobs x 69 s = 176 min, plus about 5 minutes of base-model builds and
floors: about 3 hours at worst (93 minutes measured, BENCHMARKS.md), so run it a family at a time
(`--families`, 14-21 minutes each measured) and merge the CSVs. At `--train-seconds 20`: 153 x 29 s = 74 min.
`--quick`: 2 families (date_format, addition) x 2 seeds x (4 x 4 + 1) = 68 jobs at worst of 3 s on
base models pretrained at scale 0.04, scored on 48 items, 8-11 s each with start-up: 34 rounds x
11 s = 6 min, plus about 40 s of builds: 7 minutes at worst (3.1 min measured without a trained
policy). `worst_case_wall_s` holds this arithmetic; the bench prints it first.

Output (in `--out`, every file name and the CSV's mode column saying quick or full):
`versus_search-<mode>.csv` (one row per method, family, seed and job: score, best so far, CPU and
wall seconds, cost, probe outcome), `versus_search-<mode>.png`, `summary-<mode>.txt` (the table
and the zero-shot lines) and `meta-<mode>.json` (plan, machine, date, commit, the hidden-eval partition's
fingerprint, the base models' builds and weight digests, provenance; `--merge` refuses parts whose differ). The run then reads its CSV back and checks its shape (rows per method, family and seed, monotone best
so far, ordered CI bounds, the plot written) and exits 1 when something is off.
`metarl report RUN_ID --versus-search CSV` draws the CSV beside a run's plots.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bench._provenance import git_commit, machine
from bench._versus_jobs import InnerJobRequest, InnerJobResult, base_model_records, base_score, build_base_model, run_inner_job, worker_setup
from bench._versus_methods import AgentProposer, Proposer, RandomProposer, SensibleProposer, TpeProposer
from bench._versus_output import merge_main, write_outputs
from metarl.backends.local.train import local_compile_problems
from metarl.learning.eval_secret import EvalSecretMissing, add_artifacts_argument, install_tool_eval_secret, installed_fingerprint
from metarl.probe.job import ProbeVerdict, probe_job_text
from metarl.versus_search import (
    BUDGETS,
    METHOD_LABELS,
    SINGLE_JOB_METHODS,
    Method,
    Mode,
    VersusRow,
    read_versus_csv,
    shape_problems,
)
from schemas.base import ConfigError, FieldProblem
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "examples" / "local.toml"
DEFAULT_TRAINING_FAMILIES = ("addition", "sorting")
QUICK_TRAINING_FAMILIES = ("addition",)
SEARCHING_METHODS: tuple[Method, ...] = ("trained_agent", "untrained_agent", "random_search", "optuna_tpe")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROVENANCE_SUFFIX = ".provenance.json"

JOB_OVERHEAD_S = 9.0
"""Seconds of a passing job beyond its training budget at full scale: trainer start, model load and save, 200 hidden-eval items (local-l)."""
QUICK_JOB_OVERHEAD_S = 8.0
"""The same for `--quick` (scale 0.04 models, 48 items)."""
SETUP_S = {"full": 300.0, "quick": 40.0}
"""Base-model builds on first use and the floors' scoring, before the first job."""
TARGET_WALL_S = {"full": 90 * 60.0, "quick": 10 * 60.0}


class BenchPlan(BaseModel):
    """What one bench run does: which families, how many seeds and jobs, and how big each inner job is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = Field(description="quick or full (labels every output)")
    families: list[str] = Field(min_length=1, max_length=16, description="Task ids of the run config to compare on")
    seeds: int = Field(ge=1, le=100, description="Seeds per method (bench seeds 0..seeds-1)")
    jobs: int = Field(ge=1, le=64, description="Inner jobs each searching method spends per family and seed")
    train_seconds: float = Field(gt=0.0, le=3600.0, description="Training-time budget of one inner job (the task's max_train_seconds here)")
    eval_items: int | None = Field(default=None, ge=8, le=100_000, description="Hidden-eval items per score (None: the task spec's)")
    model_scale: float = Field(gt=0.0, le=10.0, description="Pretraining scale of the local base models")
    workers: int = Field(ge=1, le=64, description="Inner jobs at once (one torch thread each)")


def default_plan(mode: Mode, held_out: Sequence[str], training: Sequence[str] = DEFAULT_TRAINING_FAMILIES, train_seconds: float = 60.0) -> BenchPlan:
    """The full plan (the run config's held-out and training families, at the tasks' own training-time cap) or the quick one."""
    if mode == "quick":
        return BenchPlan(
            mode="quick", families=[*held_out, *QUICK_TRAINING_FAMILIES], seeds=2, jobs=4, train_seconds=3.0, eval_items=48, model_scale=0.04, workers=2
        )
    return BenchPlan(mode="full", families=[*held_out, *training], seeds=3, jobs=4, train_seconds=train_seconds, model_scale=1.0, workers=2)


def worst_case_jobs(searching_methods: int, families: int, seeds: int, jobs: int) -> int:
    """Inner jobs when every job passes the probe: each searching method's jobs plus one sensible job, per family and seed."""
    return families * seeds * (searching_methods * jobs + 1)


def worst_case_wall_s(plan: BenchPlan, searching_methods: int, overhead_s: float, setup_s: float) -> float:
    """Wall seconds when every job passes: rounds of `workers` jobs, each its training budget plus the overhead, after the setup."""
    jobs = worst_case_jobs(searching_methods, len(plan.families), plan.seeds, plan.jobs)
    return setup_s + math.ceil(jobs / plan.workers) * (plan.train_seconds + overhead_s)


# --- the trained policy and its provenance ----------------------------------------------------------


class PolicyProvenance(BaseModel):
    """Where a trained policy state comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(min_length=1, max_length=64, description="Run that trained it")
    commit: str = Field(min_length=4, max_length=64, description="Commit the run ran at")
    seed: int = Field(ge=0, le=2**31 - 1, description="The run's seed ([run] seed)")
    outer_version: int = Field(ge=0, le=10**9, description="Policy version (outer steps taken)")
    config: str = Field(default="examples/local.toml", max_length=4096, description="Run config of that run")
    note: str = Field(default="", max_length=2000, description="Anything else worth knowing")


POLICY_FILE = re.compile(r"v(\d{5,})(?:-[0-9a-f]+)?\.pt")


def path_provenance(state: Path) -> tuple[str | None, int | None]:
    """Run id and outer version from a state saved at `<artifacts>/policy/<run>/vNNNNN[-<attempt>].pt`; (None, None) elsewhere."""
    match = POLICY_FILE.fullmatch(state.name)
    if match is None or state.parent.parent.name != "policy":
        return None, None
    return state.parent.name, int(match.group(1))


def resolve_provenance(state: Path, commit: str | None, seed: int | None) -> PolicyProvenance:
    """The provenance of a trained state: `STATE.provenance.json` beside it, else its path plus the given commit and seed (ConfigError naming what is missing)."""
    sidecar = state.with_name(state.name + PROVENANCE_SUFFIX)
    if sidecar.is_file():
        try:
            return PolicyProvenance.model_validate_json(sidecar.read_text(encoding="utf-8"))
        except ValidationError as err:
            problems = [FieldProblem(field=".".join(map(str, e["loc"])) or "(file)", message=e["msg"], fix="fix the provenance file") for e in err.errors()]
            raise ConfigError(str(sidecar), problems) from None
    run_id, version = path_provenance(state)
    missing = [
        FieldProblem(field=flag, message=f"{what} of the policy is unknown", fix=f"give {flag}, or write {sidecar.name} beside the state")
        for flag, what, value in (("--policy-commit", "the commit", commit), ("--policy-seed", "the run seed", seed))
        if value is None
    ]
    if run_id is None or version is None:
        missing.append(
            FieldProblem(field="--policy", message="not at <artifacts>/policy/<run>/vNNNNN[-attempt].pt", fix=f"write {sidecar.name} beside the state")
        )
    if missing:
        raise ConfigError(str(state), missing)
    assert run_id is not None and version is not None and commit is not None and seed is not None
    provenance = PolicyProvenance(run_id=run_id, commit=commit, seed=seed, outer_version=version)
    sidecar.write_text(provenance.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return provenance


# --- the bench loop --------------------------------------------------------------------------------


@dataclass
class FamilyRun:
    """One family of the comparison: its spec as the agent sees it, the copy jobs train on, and its floor."""

    name: str
    spec: TaskSpec
    task: TaskSpec
    held_out: bool
    floor: float = 0.0


@dataclass
class Stream:
    """One method's sequence of jobs on one family and seed."""

    method: Method
    family: FamilyRun
    seed: int
    proposer: Proposer
    jobs: int
    rows: list[VersusRow] = field(default_factory=list)
    in_flight: bool = False

    @property
    def best(self) -> float:
        return self.rows[-1].best_so_far if self.rows else self.family.floor

    @property
    def ready(self) -> bool:
        return not self.in_flight and len(self.rows) < self.jobs


ORDER = {method: index for index, method in enumerate(("optuna_tpe", "trained_agent", "untrained_agent", "random_search", "sensible_preset"))}
"""Ties in the scheduler go to Optuna first: its jobs are the only ones that wait on the previous job's score."""


def job_description(job_toml: str) -> str:
    """The job's settings as `section.key=value` pairs (the reward table's components too)."""
    pairs: list[str] = []

    def walk(prefix: str, table: Mapping[str, Any]) -> None:
        for key, value in table.items():
            if isinstance(value, Mapping):
                walk(f"{prefix}{key}.", value)
            else:
                pairs.append(f"{prefix}{key}={value}")

    walk("", tomllib.loads(job_toml))
    return " ".join(pairs)


class Bench:
    """Runs the streams on a pool of worker processes, at most `plan.workers` trained jobs at once."""

    def __init__(self, plan: BenchPlan, streams: list[Stream], jobs_dir: Path, cache_dir: str | None, total: int):
        self.plan, self.streams, self.jobs_dir, self.cache_dir, self.total = plan, streams, jobs_dir, cache_dir, total
        self.started = time.monotonic()
        self.recorded = 0

    def record(self, stream: Stream, job_toml: str, verdict: ProbeVerdict, result: InnerJobResult | None, probe_cpu: float, probe_wall: float) -> None:
        """Append the job's row to its stream, tell its method, and print one progress line."""
        outcome = "rejected" if result is None else result.outcome
        score = result.score if result is not None else None
        row = VersusRow(
            mode=self.plan.mode,
            method=stream.method,
            family=stream.family.name,
            held_out=stream.family.held_out,
            seed=stream.seed,
            job_index=len(stream.rows) + 1,
            outcome=outcome,
            rejected_fields=";".join(sorted({problem.field for problem in verdict.errors}))[:2000],
            model=verdict.job.model.name if verdict.job is not None else "",
            score=score,
            base_score=stream.family.floor,
            best_so_far=max(stream.best, score) if score is not None else stream.best,
            steps=result.steps if result is not None else None,
            cpu_s=round(probe_cpu + (result.cpu_s if result is not None else 0.0), 3),
            wall_s=round(probe_wall + (result.wall_s if result is not None else 0.0), 3),
            cost_usd=0.0,
            job=job_description(job_toml)[:4000],
        )
        stream.rows.append(row)
        stream.proposer.observe(verdict, score)
        self.recorded += 1
        elapsed = time.monotonic() - self.started
        what = f"{outcome} {score:.3f}" if score is not None else outcome + (f" ({row.rejected_fields})" if row.rejected_fields else "")
        if result is not None and result.error:
            what += f": {result.error[:300]}"
        print(
            f"[{self.recorded:4d}, {elapsed / 60:5.1f} min] {self.plan.mode} {stream.method:15} {stream.family.name:12} seed {stream.seed} "
            f"job {row.job_index}: {what}; best {row.best_so_far:.3f}; {row.wall_s:.1f} s",
            flush=True,
        )

    def next_job(self, stream: Stream) -> tuple[str, ProbeVerdict] | None:
        """The stream's next job that passes the probe, recording the rejected ones on the way; None when the stream is done."""
        while len(stream.rows) < stream.jobs:
            probe_started, probe_cpu = time.monotonic(), time.process_time()
            job_toml = stream.proposer.propose(len(stream.rows) + 1)
            verdict = probe_job_text(job_toml, stream.family.task, (local_compile_problems,))
            if verdict.passed:
                return job_toml, verdict
            self.record(stream, job_toml, verdict, None, time.process_time() - probe_cpu, time.monotonic() - probe_started)
        return None

    def run(self, pool: ProcessPoolExecutor) -> None:
        running: dict[Future[InnerJobResult], tuple[Stream, str, ProbeVerdict]] = {}
        while True:
            while len(running) < self.plan.workers:
                ready = [stream for stream in self.streams if stream.ready]
                if not ready:
                    break
                stream = min(ready, key=lambda s: (len(s.rows), ORDER[s.method], s.family.name, s.seed))
                found = self.next_job(stream)
                if found is None:
                    continue
                job_toml, verdict = found
                request = InnerJobRequest(
                    job_toml=job_toml,
                    task=stream.family.task,
                    name=f"{stream.method}-{stream.family.name}-{stream.seed}-{len(stream.rows) + 1}".replace("_", "-"),
                    jobs_dir=str(self.jobs_dir),
                    model_scale=self.plan.model_scale,
                    cache_dir=self.cache_dir,
                    workers=self.plan.workers,
                )
                running[pool.submit(run_inner_job, request)] = (stream, job_toml, verdict)
                stream.in_flight = True
            if not running:
                return
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                stream, job_toml, verdict = running.pop(future)
                stream.in_flight = False
                self.record(stream, job_toml, verdict, future.result(), 0.0, 0.0)


# --- setup, output and checks ----------------------------------------------------------------------


def bench_task(spec: TaskSpec, plan: BenchPlan) -> TaskSpec:
    """The task jobs train and score on: the spec with the bench's training budget (and eval size, when the plan sets one)."""
    update: dict[str, Any] = {"budget": spec.budget.model_copy(update={"max_train_seconds": plan.train_seconds})}
    if plan.eval_items is not None:
        update["hidden_eval"] = spec.hidden_eval.model_copy(update={"n_items": plan.eval_items})
    return spec.model_copy(update=update)


def check_output(csv_path: Path, png_path: Path, plan: BenchPlan, methods: Sequence[Method]) -> list[str]:
    """What is wrong with the written output: the CSV read back (columns, rows, best so far, CIs) and the plot."""
    try:
        rows = read_versus_csv(csv_path)
    except ConfigError as err:
        return [str(err)]
    problems = shape_problems(rows, methods, plan.families, list(range(plan.seeds)), plan.jobs, plan.mode)
    if not png_path.is_file() or png_path.read_bytes()[:8] != PNG_MAGIC:
        problems.append(f"{png_path}: no PNG plot")
    return problems


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short check of the machinery (numbers labelled QUICK)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="run config whose tasks, agent and held-out family to use")
    parser.add_argument(
        "--families",
        default=None,
        help="comma-separated task ids of the config or task spec files (*.toml, e.g. examples/families/increment/increment.toml) "
        "(default: every task of the config, held-out ones first; quick: the held-out ones, then addition)",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="CSV",
        help="merge the CSVs of several bench runs of one plan (e.g. one per --families) into one table, plot and summary in --out; runs nothing",
    )
    parser.add_argument("--seeds", type=int, default=None, help="seeds per method (default 3; quick 2)")
    parser.add_argument("--jobs", type=int, default=None, help="inner jobs per method, family and seed (default 4)")
    parser.add_argument(
        "--train-seconds",
        type=float,
        default=None,
        help="training budget of one inner job (default: the run's own, its tasks' cap on its train backend; quick 3)",
    )
    parser.add_argument("--workers", type=int, default=None, help="inner jobs at once (default 2)")
    parser.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="trained policy state, a .pt an examples/local.toml run saved; none: MISSING",
    )
    parser.add_argument("--policy-commit", default=None, help="commit of the run that trained --policy (when no provenance file is beside it)")
    parser.add_argument("--policy-seed", type=int, default=None, help="seed of that run (when no provenance file is beside it)")
    parser.add_argument("--cache-dir", default=None, help="base-model cache (default $METARL_CACHE_DIR, else ~/.cache/metarl/models)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default .metarl/versus-search/<mode>, <mode>-<families> with --families, <mode>-merged with --merge)",
    )
    add_artifacts_argument(parser)
    return parser.parse_args(argv)


def family_ids(families: str, specs: dict[str, TaskSpec]) -> list[str]:
    """The task ids `--families` names; an entry that is a task spec file (*.toml) is read and added to ``specs`` under its id."""
    from metarl.runconfig import load_task_spec

    ids = []
    for entry in (name.strip() for name in families.split(",")):
        if not entry:
            continue
        if entry.endswith(".toml"):
            spec = load_task_spec(Path(entry))
            if spec.id in specs and specs[spec.id] != spec:
                raise ConfigError(
                    "--families",
                    [
                        FieldProblem(
                            field="--families", message=f"{entry} has the id {spec.id!r} of a task of the run config", fix="give the file a spec id of its own"
                        )
                    ],
                )
            specs[spec.id] = spec
            entry = spec.id
        ids.append(entry)
    return ids


def run_train_seconds(config: Any, specs: Mapping[str, TaskSpec]) -> float:
    """The run's own job budget: the largest training-time cap of its tasks on its train backend (a ConfigError when none is set)."""
    return max(config.backends.train.train_seconds(specs[task_id]) for task_id in config.run.tasks)


def plan_from_args(
    args: argparse.Namespace, held_out: list[str], training: Sequence[str] = DEFAULT_TRAINING_FAMILIES, train_seconds: float = 60.0
) -> BenchPlan:
    plan = default_plan("quick" if args.quick else "full", held_out, training, train_seconds)
    update: dict[str, Any] = {}
    if args.families:
        update["families"] = [name.strip() for name in args.families.split(",") if name.strip()]
    for name in ("seeds", "jobs", "train_seconds", "workers"):
        if getattr(args, name) is not None:
            update[name] = getattr(args, name)
    return BenchPlan.model_validate({**plan.model_dump(), **update})


OPTIONAL_MODULES = {"optuna": "the Optuna TPE baseline (optuna_tpe)"}
"""Modules of the dev extra the bench imports only after its base models are built: checked before any work."""
DEV_EXTRA_FIX = "pip install -e '.[dev]'"


def missing_optional_modules(modules: Mapping[str, str] | None = None) -> list[str]:
    """One line (module, what needs it, the fix) per optional module (default :data:`OPTIONAL_MODULES`) that cannot be imported."""
    import importlib

    missing = []
    for name, use in (OPTIONAL_MODULES if modules is None else modules).items():
        try:
            importlib.import_module(name)
        except ImportError as err:
            missing.append(f"{name} cannot be imported ({err}); {use} needs it. Fix: {DEV_EXTRA_FIX}")
    return missing


def main(argv: list[str] | None = None) -> int:
    """Run the comparison, write and check its output; 0 when the output has the expected shape."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.merge:
        return merge_main(args.merge, args.out)
    missing = missing_optional_modules()
    if missing:
        for line in missing:
            print(f"error: {line}", file=sys.stderr)
        return 2
    try:
        install_tool_eval_secret(args.artifacts)
    except EvalSecretMissing as err:
        print(f"error: --artifacts: {err}", file=sys.stderr)
        return 2
    import torch

    from metarl.backends.local.config import LocalAgentBackend
    from metarl.policy.local_policy import LocalPolicy, PolicyConfig
    from metarl.runconfig import load_run

    torch.set_num_threads(1)
    wall_started, date_started, commit = time.monotonic(), datetime.now(UTC), git_commit()
    try:
        config, specs = load_run(args.config)
        held_out = [task_id for task_id in config.run.tasks if specs[task_id].held_out]
        training = [task_id for task_id in config.run.tasks if not specs[task_id].held_out]
        if args.families:
            args.families = ",".join(family_ids(args.families, specs))
        plan = plan_from_args(args, held_out, training, run_train_seconds(config, specs))
        unknown = [name for name in plan.families if name not in specs]
        if unknown:
            raise ConfigError(
                "--families", [FieldProblem(field="--families", message=f"{unknown} are not tasks of {args.config}", fix=f"use {config.run.tasks}")]
            )
        provenance = resolve_provenance(args.policy, args.policy_commit, args.policy_seed) if args.policy is not None else None
    except (ConfigError, ValidationError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    agent = config.backends.agent
    if not isinstance(agent, LocalAgentBackend):
        print(f"error: {args.config} does not use the local agent", file=sys.stderr)
        return 2
    trained = LocalPolicy.from_state(args.policy) if args.policy is not None else None
    untrained = LocalPolicy(PolicyConfig(init_seed=agent.init_seed, default_bias=agent.prior_default_bias))
    methods: list[Method] = [method for method in SEARCHING_METHODS if method != "trained_agent" or trained is not None] + ["sensible_preset"]
    estimate = worst_case_wall_s(plan, len(SEARCHING_METHODS), QUICK_JOB_OVERHEAD_S if plan.mode == "quick" else JOB_OVERHEAD_S, SETUP_S[plan.mode])
    total = worst_case_jobs(len(methods) - 1, len(plan.families), plan.seeds, plan.jobs)
    out = args.out or default_out(plan, bool(args.families))
    out.mkdir(parents=True, exist_ok=True)
    label = "QUICK RUN: short jobs on scaled-down base models, numbers not comparable to a full run" if plan.mode == "quick" else "full run"
    print(f"# versus search, {label}", flush=True)
    print(f"# {plan.model_dump_json()}")
    print(f"# at most {total} inner jobs; at worst about {estimate / 60:.0f} min on {plan.workers} workers (target {TARGET_WALL_S[plan.mode] / 60:.0f} min)")
    print(f"# trained agent: {provenance.model_dump_json() if provenance is not None else 'MISSING: no --policy given, the method is not run'}", flush=True)

    families = [FamilyRun(name, specs[name], bench_task(specs[name], plan), specs[name].held_out) for name in plan.families]
    jobs_dir = Path(tempfile.mkdtemp(prefix="metarl-versus-"))
    spawn = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=plan.workers, mp_context=spawn, initializer=worker_setup) as pool:
            builds = [pool.submit(build_base_model, model, families[0].task, plan.model_scale, args.cache_dir) for model in ("local-s", "local-l")]
            print(f"# base models ready ({', '.join(f'{future.result():.0f} s' for future in builds)})", flush=True)
            bases = base_model_records(families[0].task, plan.model_scale, args.cache_dir)
            print(f"# base models: {json.dumps(bases)}", flush=True)
            floors = [pool.submit(base_score, family.task, plan.model_scale, args.cache_dir) for family in families]
            for family, future in zip(families, floors):
                family.floor = future.result()
            print("# floors (local-s base scores): " + ", ".join(f"{family.name} {family.floor:.3f}" for family in families), flush=True)
            streams = make_streams(plan, families, methods, trained, untrained, agent.temperature, config.retries.max_probe_attempts)
            Bench(plan, streams, jobs_dir, args.cache_dir, total).run(pool)
    finally:
        shutil.rmtree(jobs_dir, ignore_errors=True)
    rows = [row for stream in streams for row in stream.rows]
    wall = time.monotonic() - wall_started
    meta = {
        "mode": plan.mode,
        "plan": plan.model_dump(),
        "machine": machine(),
        "started": date_started.isoformat(timespec="seconds"),
        "wall_s": round(wall, 1),
        "commit": commit,
        "eval_partition": installed_fingerprint(),
        "base_models": bases,
        "trained_agent": provenance.model_dump() if provenance is not None else "missing: no --policy given",
        "floor": "best so far starts at the local-s base model's hidden-eval score; rejected and failed jobs are spent and add no score",
        "cost": "local backends are not billed (metarl/dry_run.py): cost_usd 0, CPU seconds are the cost",
    }
    header = [
        f"# versus search, {label}",
        f"# {meta['machine']}; {meta['started']}; commit {meta['commit']}; hidden-eval partition {meta['eval_partition']}; {wall / 60:.1f} min wall",
        f"# {meta['floor']}",
    ]
    missing = (
        [] if provenance is not None else [f"trained agent: MISSING (no --policy given): {METHOD_LABELS['trained_agent']} rows are absent, not stood in for"]
    )
    budgets = ", ".join(str(budget) for budget in BUDGETS if budget <= plan.jobs)
    footer = [f"{meta['cost']}; budgets compared: {budgets} jobs ({', '.join(sorted(SINGLE_JOB_METHODS))}: one job)"]
    csv_path, png_path = write_outputs(out, plan.mode, rows, meta, header, missing, footer)
    problems = check_output(csv_path, png_path, plan, methods)
    for problem in problems:
        print(f"output check: {problem}", file=sys.stderr)
    print(f"# output {'FAILED its shape check' if problems else 'checked'}: {csv_path}, {png_path}, {out / f'summary-{plan.mode}.txt'}", flush=True)
    return 1 if problems else 0


def default_out(plan: BenchPlan, families_given: bool) -> Path:
    """`.metarl/versus-search/<mode>`, or `<mode>-<families>` when `--families` picked them (so runs split by family keep their own files)."""
    return Path(".metarl") / "versus-search" / (f"{plan.mode}-{'-'.join(plan.families)}" if families_given else plan.mode)


def make_streams(
    plan: BenchPlan, families: list[FamilyRun], methods: Sequence[Method], trained: Any, untrained: Any, temperature: float, max_attempts: int
) -> list[Stream]:
    """One stream per method, family and seed."""
    streams: list[Stream] = []
    for family in families:
        for seed in range(plan.seeds):
            for method in methods:
                proposer: Proposer
                if method == "trained_agent":
                    proposer = AgentProposer(trained, family.spec, family.name, seed, temperature, max_attempts)
                elif method == "untrained_agent":
                    proposer = AgentProposer(untrained, family.spec, family.name, seed, temperature, max_attempts)
                elif method == "random_search":
                    proposer = RandomProposer(family.task, family.name, seed)
                elif method == "optuna_tpe":
                    proposer = TpeProposer(family.task, family.name, seed)
                else:
                    proposer = SensibleProposer(family.spec, family.name, seed)
                streams.append(Stream(method, family, seed, proposer, 1 if method in SINGLE_JOB_METHODS else plan.jobs))
    return streams


if __name__ == "__main__":
    raise SystemExit(main())
