"""Entry point of one local inner job: `python -m metarl.backends.local.job JOB_DIR`.

Reads job.json and dataset.jsonl, trains, and writes status.json last (atomically), so a poller
sees a running process or a final status; a crash leaves its traceback in trainer.log.

When job.json has a `reward` section (:class:`metarl.probe.reward_source.EnvironmentRewardSpec`), the
rollouts are scored by the agent's environment module in the sandbox (one persistent sandboxed
process for the whole job); a module that fails (raises, returns NaN/inf or a non-number, hangs
past the step deadline, crashes) ends the job with a failed status whose `error` says which step,
which rollout and what to fix. The status also records what scoring cost (`reward`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path


def write_status(job_dir: Path, status: dict[str, object]) -> None:
    """Write status.json atomically (a poller never sees a partial file)."""
    temporary = job_dir / "status.tmp"
    temporary.write_text(json.dumps(status), encoding="utf-8")
    temporary.replace(job_dir / "status.json")


def torch_threads() -> int:
    """Intra-op threads this trainer ran with (the backend sets them per job from its concurrency)."""
    import torch

    return torch.get_num_threads()


def main(job_dir: Path) -> int:
    """Run the job in ``job_dir``; 0 when it succeeded, 1 when it failed with a recorded status."""
    from metarl.learning.data_families import GradingFamily, model_families
    from metarl.learning.families import Example
    from metarl.learning.grpo import LocalTrainConfig, train
    from metarl.learning.models import ensure_base_model
    from metarl.learning.registry import get_family
    from metarl.learning.reward_checks import RewardFunctionError
    from metarl.probe.reward_source import EnvironmentRewardSpec, RewardStats, SandboxRewardSource, failed_job_status
    from metarl.sandbox.parent import SandboxUnavailable
    from schemas.task_spec import TaskSpec

    started = time.monotonic()
    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    config = LocalTrainConfig.model_validate(job["train"])
    spec = EnvironmentRewardSpec.model_validate(job["reward"]) if job.get("reward") is not None else None
    dataset = [Example(**json.loads(line)) for line in (job_dir / "dataset.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    families = model_families(TaskSpec.model_validate(job["task"])) if "task" in job else None
    base_dir = ensure_base_model(config.base_model, job.get("model_cache_dir"), scale=float(job.get("model_scale", 1.0)), families=families)
    source = SandboxRewardSource(job_dir / spec.workspace, spec) if spec is not None else None
    stats = source.stats if source is not None else RewardStats(mode="builtin")
    steps_seen: list[int] = []
    train_started = time.monotonic()
    try:
        with source if source is not None else contextlib.nullcontext():
            outcome = train(
                config,
                dataset,
                GradingFamily(job["family"], job["grader"], int(job["max_answer_chars"])) if "grader" in job else get_family(job["family"]),
                base_dir,
                job_dir,
                after_step=lambda row, _model: steps_seen.append(row.step),
                reward_fn=source,
                reward_bounds=spec.bounds if spec is not None else None,
            )
    except RewardFunctionError as err:
        status = failed_job_status(err, len(steps_seen), time.monotonic() - train_started, source.stats if source is not None else None)
        print(f"inner job failed: {status['error']}", file=sys.stderr, flush=True)
        write_status(job_dir, status)
        return 1
    except SandboxUnavailable as err:
        message = f"the reward sandbox could not run (not the module's fault): {err}"
        print(f"inner job failed: {message}", file=sys.stderr, flush=True)
        write_status(job_dir, {"status": "failed", "error": message, "error_kind": "sandbox_unavailable", "steps": len(steps_seen)})
        return 1
    if source is not None:
        stats = source.stats
    write_status(
        job_dir,
        {
            "status": "succeeded",
            "train_seconds": outcome.wall_seconds,
            "total_seconds": time.monotonic() - started,
            "steps": outcome.steps_completed,
            "stopped_by": outcome.stopped_by,
            "reward": stats.model_dump(mode="json"),
            "torch_threads": torch_threads(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
