"""Stand-in for the pod side of docker/inner.Dockerfile: the process a fake Runpod pod runs.

It follows the backend's protocol (metarl/backends/runpod_train.py): it watches
`pods/<its name>/assignment.json` under METARL_RUNPOD_ROOT, and for each new assignment it "trains"
in the assignment's result folder exactly as `metarl.pod_runner` reports: FAKE_TRAIN_STEPS steps of
FAKE_STEP_S seconds, each appended to metrics/metrics.jsonl and announced in status.json (a
`Heartbeat`), then weights under weights/step_N/ and exit.json (an `ExitReport`); then it waits for
the next job (the warm pool's reuse).
It trains nothing: it exists so that progress, heartbeats, hangs and preemptions in tests are real
processes doing real file I/O. It ends by itself after FAKE_POD_MAX_S seconds, so nothing outlives
a test for long.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from metarl.backends.runpod_train import POD_NAME_ENV, POD_ROOT_ENV, PodAssignment
from metarl.pod_runner import ExitReport, Heartbeat, decode_env_value
from metarl.primerl.pin import PRIME_RL_TAG


def write_json(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def read_assignment(path: Path) -> PodAssignment | None:
    try:
        return PodAssignment.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None


def beat(attempt: Path, sequence: int, started: float, step: int | None, steps: int) -> None:
    now = time.time()
    heartbeat = Heartbeat(
        state="running", sequence=sequence, prime_rl_tag=PRIME_RL_TAG, started_at=started, updated_at=now, step=step, max_steps=steps,
        metric_rows=step or 0, last_progress_at=now if step is not None else None, message="fake training",
    )
    write_json(attempt / "status.json", heartbeat.model_dump_json())


def train(attempt: Path, steps: int, step_s: float) -> None:
    started = time.time()
    beat(attempt, 0, started, None, steps)
    (attempt / "metrics").mkdir(parents=True, exist_ok=True)
    with open(attempt / "metrics" / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(1, steps + 1):
            time.sleep(step_s)
            metrics.write(json.dumps({"step": step, "reward": round(step / steps, 3)}) + "\n")
            metrics.flush()
            beat(attempt, step, started, step, steps)
    weights = attempt / "weights" / f"step_{steps}"
    weights.mkdir(parents=True, exist_ok=True)
    (weights / "config.json").write_text(json.dumps({"fake": True, "steps": steps}), encoding="utf-8")
    finished = time.time()
    report = ExitReport(
        succeeded=True, reason="completed", exit_code=0, steps=steps, max_steps=steps, weights_step=steps, weights_url=str(weights),
        training_finished_logged=True, prime_rl_tag=PRIME_RL_TAG, started_at=started, finished_at=finished, duration_s=round(finished - started, 3),
        uploaded=[f"weights/step_{steps}/config.json", "metrics/metrics.jsonl"], message="fake training finished",
    )
    write_json(attempt / "exit.json", report.model_dump_json())


def main() -> None:
    root = Path(decode_env_value(os.environ[POD_ROOT_ENV]))
    name = decode_env_value(os.environ[POD_NAME_ENV])
    steps = int(os.environ.get("FAKE_TRAIN_STEPS", "8"))
    step_s = float(os.environ.get("FAKE_STEP_S", "0.25"))
    deadline = time.monotonic() + float(os.environ.get("FAKE_POD_MAX_S", "300"))
    done_seq = 0
    assignment_path = root / "pods" / name / "assignment.json"
    print(f"pod runner {name} ({os.environ.get('RUNPOD_POD_ID')}) up", flush=True)
    while time.monotonic() < deadline:
        assignment = read_assignment(assignment_path)
        if assignment is not None and assignment.job_name and assignment.result_url and assignment.seq > done_seq:
            print(f"job {assignment.job_name} (seq {assignment.seq})", flush=True)
            train(Path(assignment.result_url), steps, step_s)
            done_seq = assignment.seq
            continue
        time.sleep(0.1)


if __name__ == "__main__":
    main()
