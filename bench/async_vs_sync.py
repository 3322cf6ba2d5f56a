"""Async against sync at the reference's scale, on a SIMULATED cloud (discrete events, simulated time).

    python -m bench.async_vs_sync [--scale 1.0] [--seed 0] [--no-sensitivity]

16 GPU pods (2x A40 each), 54 outer steps of 4 groups x 8 episodes (1,728 episodes, ~1,750 inner
jobs with the stale-group replacements), heavy-tailed lognormal job durations, 20% of submitted
jobs invalid. Three schedules of the same workload (the same episode gets the same draws under each):

* **async** (ours): `window.in_flight` episodes in flight, a batch whenever `groups_per_batch`
  complete groups within `max_steps_off_policy` versions are ready, stale groups dropped, and the
  probe sending invalid jobs back to the agent before they reach a pod;
* **sync**: one batch at a time, opened when the previous outer update is done, and the outer
  update waits for the batch's slowest job (the probe on as well: the fair baseline);
* **sync-no-probe**: the same without the probe (invalid jobs fail on a pod).

Every scheduling decision is our code (see bench/_sim_des.py): transitions, the real probe on the sim
agent's job.toml text, filter_stale, plan_batch, groups_to_open. Nothing is trained; the cloud,
its durations and prices are simulated inputs. `--scale` shrinks the number of outer steps (pods and
batch shape stay), and the output says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from bench._sim_des import CloudSettings, Metrics, PolicySettings, Simulation, record_digest, summarize
from metarl.backends.sim.config import SimDuration
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parent.parent
REFERENCE_STEPS = 54
TARGET_BUSY = 0.95
TARGET_SPEEDUP = 1.8
PRICE_SOURCE = "SimTrainBackend.usd_per_hour default in metarl/backends/sim/config.py (one 2x A40 pod); the reference run gives only ~$0.13-0.30 per inner job"


class Outcome(BaseModel):
    """The headline numbers against the targets."""

    model_config = ConfigDict(extra="forbid")

    speedup: float = Field(ge=0.0, description="async outer steps per hour / sync outer steps per hour")
    busy_ok: bool = Field(description="async pod busy fraction >= 95%")
    speedup_ok: bool = Field(description="speedup >= 1.8")
    probe_ok: bool = Field(description="no pod time on jobs the probe should have stopped (async)")


def scaled_steps(scale: float, reference_steps: int = REFERENCE_STEPS) -> int:
    """Outer steps at a scale (at least 2, so there is a steady state to speak of)."""
    if not 0.0 < scale <= 1.0:
        raise ValueError("--scale must be in (0, 1]")
    return max(2, round(reference_steps * scale))


def outcome(async_metrics: Metrics, sync_metrics: Metrics) -> Outcome:
    """Compare the async run with the sync baseline against the targets."""
    speedup = async_metrics.steps_per_hour / sync_metrics.steps_per_hour
    return Outcome(
        speedup=speedup,
        busy_ok=async_metrics.busy_fraction >= TARGET_BUSY,
        speedup_ok=speedup >= TARGET_SPEEDUP,
        probe_ok=async_metrics.invalid_gpu_s == 0.0,
    )


def load_tasks(folder: Path = REPO / "tasks_specs") -> dict[str, TaskSpec]:
    """The shipped task families (held-out ones are not trained on and open no groups here)."""
    from schemas.base import load_toml_model

    return {path.stem: load_toml_model(TaskSpec, path) for path in sorted(folder.glob("*.toml"))}


def real_probe():  # type: ignore[no-untyped-def]
    """Our probe on job.toml text (memoised: the same text and task always get the same verdict)."""
    from metarl.probe.job import probe_job_text

    cache: dict[tuple[str, str], bool] = {}

    def probe(text: str, task: TaskSpec) -> bool:
        key = (text, task.id)
        if key not in cache:
            cache[key] = probe_job_text(text, task).passed
        return cache[key]

    return probe


def simulate(cloud: CloudSettings, policy: PolicySettings, tasks: dict[str, TaskSpec], probe) -> tuple[Metrics, str]:  # type: ignore[no-untyped-def]
    """One simulated run: its metrics and the digest of its records."""
    record = Simulation(cloud, policy, tasks, probe).run()
    return summarize(record, cloud.usd_per_pod_hour), record_digest(record)


def fmt_duration(duration: SimDuration) -> str:
    """`median 12.0 min, sigma 0.7, max 240 min`."""
    return f"median {duration.median_s / 60:.1f} min, sigma {duration.sigma}, max {duration.max_s / 60:.0f} min"


def main_table(rows: list[tuple[PolicySettings, Metrics, str]]) -> list[str]:
    """One column per schedule, one row per metric."""
    names = [p.mode if p.mode != "async" else f"async W={p.in_flight} k={p.max_steps_off_policy}" for p, _, _ in rows]
    width = max(22, *(len(n) + 2 for n in names))
    metrics = [m for _, m, _ in rows]

    def line(label: str, values: list[str]) -> str:
        return f"{label:<44}" + "".join(f"{v:>{width}}" for v in values)

    return [
        line("", names),
        line("simulated hours to the last outer step", [f"{m.makespan_h:.1f}" for m in metrics]),
        line("outer steps per simulated hour", [f"{m.steps_per_hour:.3f}" for m in metrics]),
        line("pod busy fraction", [f"{100 * m.busy_fraction:.1f}%" for m in metrics]),
        line("  of it on groups later dropped as stale", [f"{100 * (m.busy_fraction - m.useful_fraction):.1f}%" for m in metrics]),
        line("episodes / jobs on a pod / succeeded", [f"{m.episodes}/{m.jobs_on_gpu}/{m.jobs_succeeded}" for m in metrics]),
        line("$ pods, whole run (16 held, warm pool)", [f"{m.pool_usd:.0f}" for m in metrics]),
        line("$ per successful job (warm pool)", [f"{m.usd_per_successful_job:.3f}" for m in metrics]),
        line("$ per successful job (billed per job only)", [f"{m.busy_usd_per_successful_job:.3f}" for m in metrics]),
        line("$ per successful job used in an update (warm)", [f"{m.usd_per_used_job:.3f} ({m.jobs_used})" for m in metrics]),
        line("$ burned on jobs failing after a pod", [f"{m.failed_gpu_usd:.1f}" for m in metrics]),
        line("  of it: invalid jobs the probe should stop", [f"{m.invalid_gpu_usd:.1f} ({m.invalid_jobs_on_gpu} jobs)" for m in metrics]),
        line("probe rejections / episodes at retry cap", [f"{m.probe_rejections}/{m.unvalidated}" for m in metrics]),
        line("stale groups dropped ($ of pod time on them)", [f"{m.dropped_groups} ({m.dropped_gpu_usd:.1f})" for m in metrics]),
        line("staleness of batched groups, mean / max", [f"{m.mean_staleness:.2f}/{m.max_staleness}" for m in metrics]),
        line("run digest (seeded: same digest every time)", [d for _, _, d in rows]),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the three schedules (and the sensitivity tables), print the report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the reference's 54 outer steps (pods and batch shape stay)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-flight", type=int, default=32, help="async window.in_flight")
    parser.add_argument("--max-steps-off-policy", type=int, default=2, help="outer.max_steps_off_policy (the run config default is 2)")
    parser.add_argument("--no-sensitivity", action="store_true", help="skip the window/staleness and job-duration tables")
    args = parser.parse_args(argv)
    try:
        steps = scaled_steps(args.scale)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    cloud = CloudSettings(outer_steps=steps, seed=args.seed)
    tasks = load_tasks()
    probe = real_probe()
    policies = [
        PolicySettings(mode="async", in_flight=args.in_flight, max_steps_off_policy=args.max_steps_off_policy),
        PolicySettings(mode="sync"),
        PolicySettings(mode="sync-no-probe"),
    ]
    rows = [(policy, *simulate(cloud, policy, tasks, probe)) for policy in policies]
    result = outcome(rows[0][1], rows[1][1])
    trainable = [t for t, spec in tasks.items() if not spec.held_out]
    scale_note = "reference scale" if steps == REFERENCE_STEPS else f"SCALED DOWN by --scale {args.scale}: {steps} of {REFERENCE_STEPS} outer steps"
    lines = [
        "Async against sync on a SIMULATED cloud (discrete-event simulation in simulated time; nothing is trained)",
        f"date {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}  host {platform.node()}  cores {os.cpu_count()}  seed {args.seed}",
        f"{scale_note}; {cloud.pods} pods; {cloud.groups_per_batch} groups x {cloud.group_size} episodes per outer step; tasks {', '.join(trainable)}",
        f"inner job: lognormal {fmt_duration(cloud.train)}; GPU failure rate {cloud.gpu_failure_rate:.0%} (fails at its end, as the sim backend does)",
        f"agent attempt {fmt_duration(cloud.agent)} (unlimited); probe {fmt_duration(cloud.probe)} ({cloud.probe_workers} workers); "
        f"eval {fmt_duration(cloud.eval)} ({cloud.eval_workers} workers, own GPUs, not priced)",
        f"outer update {fmt_duration(cloud.outer)}; {cloud.invalid_rate:.0%} of submitted jobs invalid, at most {cloud.max_probe_attempts} submissions per episode; "
        f"an invalid job on a pod burns {fmt_duration(cloud.invalid_on_gpu)} then fails",
        f"price ${cloud.usd_per_pod_hour:.2f} per pod-hour (2x A40) from the {PRICE_SOURCE}",
        "",
        *main_table(rows),
        "",
        f"targets: async pod busy >= {TARGET_BUSY:.0%}: {100 * rows[0][1].busy_fraction:.1f}% {'MET' if result.busy_ok else 'MISSED'}; "
        f"async/sync outer-step rate >= {TARGET_SPEEDUP}x: {result.speedup:.2f}x {'MET' if result.speedup_ok else 'MISSED'}; "
        f"GPU time on jobs the probe should have stopped = 0: {rows[0][1].invalid_gpu_s:.0f} s {'MET' if result.probe_ok else 'MISSED'}",
    ]
    if not args.no_sensitivity:
        lines += ["", "sensitivity, async window and staleness bound (outer steps per hour; busy; stale groups dropped):"]
        header = f"{'':<12}" + "".join(f"{'k=' + str(k):>26}" for k in (1, 2, 3))
        lines.append(header)
        for window in (24, 32, 48, 64):
            cells = []
            for k in (1, 2, 3):
                metrics, _ = simulate(cloud, PolicySettings(mode="async", in_flight=window, max_steps_off_policy=k), tasks, probe)
                cells.append(f"{metrics.steps_per_hour:.3f}; {100 * metrics.busy_fraction:.1f}%; {metrics.dropped_groups}")
            lines.append(f"{'W=' + str(window):<12}" + "".join(f"{c:>26}" for c in cells))
        lines += ["", f"sensitivity, job-duration tail (async W={args.in_flight} k={args.max_steps_off_policy} against sync):"]
        lines.append(f"{'sigma':<8}{'sync steps/h':>14}{'sync busy':>11}{'async steps/h':>15}{'async busy':>12}{'speedup':>9}{'dropped':>9}")
        for sigma in (0.5, 0.7, 1.0):
            varied = cloud.model_copy(update={"train": SimDuration(median_s=cloud.train.median_s, sigma=sigma, max_s=cloud.train.max_s)})
            a, _ = simulate(varied, policies[0], tasks, probe)
            s, _ = simulate(varied, policies[1], tasks, probe)
            lines.append(
                f"{sigma:<8}{s.steps_per_hour:>14.3f}{100 * s.busy_fraction:>10.1f}%{a.steps_per_hour:>15.3f}{100 * a.busy_fraction:>11.1f}%"
                f"{a.steps_per_hour / s.steps_per_hour:>8.2f}x{a.dropped_groups:>9}"
            )
    lines += ["", f"({time.perf_counter() - started:.0f} s of wall time)"]
    print("\n".join(lines))
    return 0 if (result.busy_ok and result.speedup_ok and result.probe_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
