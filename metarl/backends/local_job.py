"""Entry point of one local inner job: `python -m metarl.backends.local_job JOB_DIR`.

Reads job.json and dataset.jsonl, trains, and writes status.json last (atomically), so a poller
sees a running process or a final status; a crash leaves its traceback in trainer.log.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def write_status(job_dir: Path, status: dict[str, object]) -> None:
    temporary = job_dir / "status.tmp"
    temporary.write_text(json.dumps(status), encoding="utf-8")
    temporary.replace(job_dir / "status.json")


def main(job_dir: Path) -> int:
    from metarl.learning.families import Example, get_family
    from metarl.learning.grpo import LocalTrainConfig, train
    from metarl.learning.models import ensure_base_model

    started = time.monotonic()
    job = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
    config = LocalTrainConfig.model_validate(job["train"])
    dataset = [Example(**json.loads(line)) for line in (job_dir / "dataset.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    base_dir = ensure_base_model(config.base_model, job.get("model_cache_dir"), scale=float(job.get("model_scale", 1.0)))
    outcome = train(config, dataset, get_family(job["family"]), base_dir, job_dir)
    write_status(
        job_dir,
        {
            "status": "succeeded",
            "train_seconds": outcome.wall_seconds,
            "total_seconds": time.monotonic() - started,
            "steps": outcome.steps_completed,
            "stopped_by": outcome.stopped_by,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
