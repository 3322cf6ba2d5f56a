"""Stand-in for the pod side of docker/inner.Dockerfile: the process a fake Runpod pod runs.

It follows the backend's protocol (metarl/backends/runpod/train.py): it watches
`pods/<its name>/assignment.json` under METARL_RUNPOD_ROOT, and for each new assignment it "trains"
in the assignment's result folder exactly as `metarl.backends.runpod.pod.runner` reports: FAKE_TRAIN_STEPS steps of
FAKE_STEP_S seconds, each appended to metrics/metrics.jsonl and announced in status.json (a
`Heartbeat`), then weights under weights/step_N/ and exit.json (an `ExitReport`); then it waits for
the next job (the warm pool's reuse).
It trains nothing: it exists so that progress, heartbeats, hangs and preemptions in tests are real
processes doing real file I/O. It ends by itself after FAKE_POD_MAX_S seconds, so nothing outlives
a test for long.

A job whose name ends with FAKE_POD_NO_SIGNAL_SUFFIX ends as the runner reports a job without a
learning signal that saved no weights (`no_signal`, `trained_is_base`); one whose name ends with
FAKE_POD_TAMPERED_SUFFIX cannot check its scoring stack, so its eval fails.

With FAKE_POD_MODEL (a Hugging Face model folder, e.g. a local stand-in) its "trained" weights are a
copy of that model, and an assignment with `eval_on_pod` is followed, after exit.json, by the real
pod side of the on-pod eval (`metarl.backends.runpod.pod.eval_server.EvalServer`, generating with the torch engine of
`metarl/backends/runpod/pod/scoring.py`; the job's base model is FAKE_POD_MODEL too). With FAKE_POD_TIMELINE (a
folder) it appends what it saw of its job's storage to `<folder>/<pod name>.jsonl`: at every
training step whether `eval/request.json` was there, when exit.json was written, when it read the
request and when it uploaded the result.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from metarl.backends.runpod.pod.confinement import child_environment
from metarl.backends.runpod.pod.eval_server import REQUEST_FILE, EvalServer, EvalSettings
from metarl.backends.runpod.pod.pin import PRIME_RL_TAG
from metarl.backends.runpod.pod.protocol import ExitReport, Heartbeat, PodAssignment, decode_env_value
from metarl.backends.runpod.pod.storage import Storage
from metarl.backends.runpod.pod.supervisor import POD_NAME_ENV, POD_ROOT_ENV


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
        state="running",
        sequence=sequence,
        prime_rl_tag=PRIME_RL_TAG,
        started_at=started,
        updated_at=now,
        step=step,
        max_steps=steps,
        metric_rows=step or 0,
        last_progress_at=now if step is not None else None,
        message="fake training",
    )
    write_json(attempt / "status.json", heartbeat.model_dump_json())


class Timeline:
    """Appends what the pod saw to FAKE_POD_TIMELINE/<pod name>.jsonl (nothing without it)."""

    def __init__(self, name: str):
        folder = os.environ.get("FAKE_POD_TIMELINE")
        self.path = Path(folder) / f"{name}.jsonl" if folder else None

    def note(self, event: str, job: str, **fields: object) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"t": time.time(), "event": event, "job": job, **fields}) + "\n")


def train(attempt: Path, steps: int, step_s: float, job: str, timeline: Timeline, eval_on_pod: bool) -> Path | None:
    started = time.time()
    beat(attempt, 0, started, None, steps)
    (attempt / "metrics").mkdir(parents=True, exist_ok=True)
    with open(attempt / "metrics" / "metrics.jsonl", "a", encoding="utf-8") as metrics:
        for step in range(1, steps + 1):
            time.sleep(step_s)
            metrics.write(json.dumps({"step": step, "reward": round(step / steps, 3)}) + "\n")
            metrics.flush()
            beat(attempt, step, started, step, steps)
            timeline.note("step", job, step=step, request_present=(attempt / REQUEST_FILE).exists())
    weights = attempt / "weights" / f"step_{steps}"
    no_signal = bool(os.environ.get("FAKE_POD_NO_SIGNAL_SUFFIX")) and job.endswith(os.environ["FAKE_POD_NO_SIGNAL_SUFFIX"])
    model = os.environ.get("FAKE_POD_MODEL")
    if no_signal:
        pass  # as metarl.backends.runpod.pod.runner reports a job whose orchestrator found no learning signal before any weights were saved
    elif model:
        shutil.copytree(model, weights, dirs_exist_ok=True)
    else:
        weights.mkdir(parents=True, exist_ok=True)
        (weights / "config.json").write_text(json.dumps({"fake": True, "steps": steps}), encoding="utf-8")
    finished = time.time()
    report = ExitReport(
        succeeded=True,
        reason="no_signal" if no_signal else "completed",
        exit_code=1 if no_signal else 0,
        steps=steps,
        max_steps=steps,
        weights_step=None if no_signal else steps,
        weights_url=None if no_signal else str(weights),
        training_finished_logged=not no_signal,
        prime_rl_tag=PRIME_RL_TAG,
        started_at=started,
        finished_at=finished,
        duration_s=round(finished - started, 3),
        uploaded=["metrics/metrics.jsonl"] if no_signal else [f"weights/step_{steps}/config.json", "metrics/metrics.jsonl"],
        message="fake: no learning signal" if no_signal else "fake training finished",
        agent_stopped=True,
        eval_on_pod=eval_on_pod,
        trained_is_base=no_signal,
    )
    timeline.note("training_ended", job, request_present=(attempt / REQUEST_FILE).exists())
    write_json(attempt / "exit.json", report.model_dump_json())
    timeline.note("exit_written", job)
    return None if no_signal else weights


def serve_eval(root: Path, name: str, assignment: PodAssignment, weights: Path | None, timeline: Timeline) -> None:
    """The real pod side of the on-pod eval, scoring with the torch engine on the CPU."""
    assert assignment.job_name is not None and assignment.result_url is not None
    job = json.loads((root / "jobs" / assignment.job_name / "job.json").read_text(encoding="utf-8"))
    model = os.environ["FAKE_POD_MODEL"]
    tampered = bool(os.environ.get("FAKE_POD_TAMPERED_SUFFIX")) and assignment.job_name.endswith(os.environ["FAKE_POD_TAMPERED_SUFFIX"])
    settings = EvalSettings(
        python_command=[sys.executable],
        engine="torch",
        poll_s=0.1,
        wait_s=120,
        timeout_s=300,
        model_aliases={job["job"]["model"]["name"]: model},
        stack_manifest=str(root / "no-such-manifest.json") if tampered else None,
    )

    def still_assigned() -> bool:
        current = read_assignment(root / "pods" / name / "assignment.json")
        return current is None or (current.seq == assignment.seq and not current.terminated)

    def on_state(state: str, message: str) -> None:
        if state == "evaluating":
            timeline.note("request_read", assignment.job_name)

    environment = child_environment(os.environ, ["PATH", "HOME", "LANG", "PYTHONPATH", "TORCH_*", "OMP_*"], (), {"HF_HUB_OFFLINE": "1"})
    scratch = Path(os.environ.get("HOME", "/tmp")) / f"eval-scratch-{name}"
    server = EvalServer(Storage(assignment.result_url), settings, scratch, environment, still_assigned, on_state)
    result = server.serve(weights, job["job"]["model"]["name"])
    if result is not None:
        timeline.note("result_written", assignment.job_name, error=result.error, request_deleted=result.request_deleted)


def main() -> None:
    root = Path(decode_env_value(os.environ[POD_ROOT_ENV]))
    name = decode_env_value(os.environ[POD_NAME_ENV])
    steps = int(os.environ.get("FAKE_TRAIN_STEPS", "8"))
    step_s = float(os.environ.get("FAKE_STEP_S", "0.25"))
    deadline = time.monotonic() + float(os.environ.get("FAKE_POD_MAX_S", "300"))
    done_seq = 0
    assignment_path = root / "pods" / name / "assignment.json"
    timeline = Timeline(name)
    print(f"pod runner {name} ({os.environ.get('RUNPOD_POD_ID')}) up", flush=True)
    while time.monotonic() < deadline:
        assignment = read_assignment(assignment_path)
        if assignment is not None and assignment.job_name and assignment.result_url and assignment.seq > done_seq:
            print(f"job {assignment.job_name} (seq {assignment.seq})", flush=True)
            weights = train(Path(assignment.result_url), steps, step_s, assignment.job_name, timeline, assignment.eval_on_pod)
            if assignment.eval_on_pod:
                serve_eval(root, name, assignment, weights, timeline)
            done_seq = assignment.seq
            continue
        time.sleep(0.1)


if __name__ == "__main__":
    main()
