"""What one poll of a Runpod job decides, as pure functions: the watchdog, the verdict on a job and on its on-pod
eval, which pods stay warm, and why the reaper terminates a pod (with the per-process schedule it keeps)."""

from __future__ import annotations

import threading
from typing import Literal

from pydantic import Field

from metarl.backends.runpod.pod.eval_server import EvalResult, Target
from metarl.backends.runpod.pod.protocol import ExitReport, Heartbeat, PodAssignment
from metarl.backends.runpod.pods import Frozen
from metarl.backends.runpod.provider import PodState


class Progress(Frozen):
    """The watchdog's view of a job after one look at its heartbeat."""

    last_step: int = Field(description="Highest step seen (-2: no heartbeat yet, -1: started, no step yet)")
    last_progress_at: float = Field(description="When it last moved")
    hung: str | None = Field(default=None, description="Why the watchdog gives up on the pod, or None")
    startup_timeout: bool = Field(default=False, description="It gives up because the job made no progress within startup_timeout_s of its start on the pod")


def heartbeat_step(beat: Heartbeat | None) -> int | None:
    """Progress from the runner's status.json: its last metrics step, -1 while it runs without one, None without a heartbeat."""
    if beat is None:
        return None
    return beat.step if beat.step is not None else -1


def watchdog(
    now: float, step: int | None, last_step: int, last_progress_at: float, assigned_at: float, startup_timeout_s: float, hang_timeout_s: float
) -> Progress:
    """Progress bookkeeping and the watchdog's decision (a pod that stops moving is hung)."""
    if step is not None and step > last_step:
        last_step, last_progress_at = step, now
        if step >= 0:
            return Progress(last_step=step, last_progress_at=now)
    if last_step < 0:
        waited = now - assigned_at
        if waited > startup_timeout_s:
            return Progress(
                last_step=last_step,
                last_progress_at=last_progress_at,
                hung=f"start-up timeout: no progress within startup_timeout_s = {startup_timeout_s:.0f}s of the job's start on the pod ({waited:.0f}s)",
                startup_timeout=True,
            )
        return Progress(last_step=last_step, last_progress_at=last_progress_at)
    stalled = now - last_progress_at
    if stalled > hang_timeout_s:
        return Progress(last_step=last_step, last_progress_at=last_progress_at, hung=f"progress stopped at step {last_step} for {stalled:.0f}s (hung)")
    return Progress(last_step=last_step, last_progress_at=last_progress_at)


Action = Literal["running", "succeeded", "failed", "restart", "abort"]


class Verdict(Frozen):
    """What to do with a job after one poll."""

    action: Action = Field(description="running: poll again; succeeded/failed: the job ended by itself; restart: new pod; abort: kill and fail")
    reason: str | None = Field(default=None, description="Why")
    startup_timeout: bool = Field(default=False, description="The watchdog ends the attempt because its start-up ran past startup_timeout_s")


def judge(
    *,
    pod_state: PodState | None,
    exit_report: ExitReport | None,
    hung: str | None,
    restarts: int,
    max_restarts: int,
    job_cost: float,
    max_job_usd: float,
    stop_for_run_cap: bool,
    startup_timeout: bool = False,
) -> Verdict:
    """The decision of one poll. A report from the runner wins; then a lost pod; then the caps; then the watchdog
    (``startup_timeout``: ``hung`` is a start-up that ran past its timeout)."""
    if exit_report is not None:
        if exit_report.succeeded:
            return Verdict(action="succeeded")
        return Verdict(action="failed", reason=f"runner: {exit_report.reason} (rl exit code {exit_report.exit_code}): {exit_report.message}")
    if pod_state in (None, PodState.stopped, PodState.terminated):
        reason = "pod was preempted or stopped before the job ended" if pod_state is not None else "pod disappeared before the job ended"
        return Verdict(action="restart" if restarts < max_restarts else "abort", reason=reason)
    if stop_for_run_cap:
        return Verdict(action="abort", reason="stopped: the run budget cap was reached (budget.on_cap = stop)")
    if job_cost >= max_job_usd:
        return Verdict(action="abort", reason=f"stopped: the job cost ${job_cost:.2f} reached budget.max_job_usd ${max_job_usd:.2f}")
    if hung is not None:
        return Verdict(action="restart" if restarts < max_restarts else "abort", reason=f"watchdog: {hung}", startup_timeout=startup_timeout)
    return Verdict(action="running")


def judge_eval(
    *,
    pod_state: PodState | None,
    result: EvalResult | None,
    request_id: str,
    waited_s: float,
    timeout_s: float,
    job_cost: float,
    max_job_usd: float,
    stop_for_run_cap: bool,
) -> Verdict:
    """The decision of one poll while the job's pod runs its hidden eval. The pod's result wins; then a lost pod; then the caps and the timeout."""
    if result is not None:
        if result.request_id != request_id:
            return Verdict(action="failed", reason=f"the pod answered eval request {result.request_id}, not {request_id}")
        if result.error is not None:
            return Verdict(action="failed", reason=f"on-pod eval failed: {result.error}")
        return Verdict(action="succeeded")
    if pod_state in (None, PodState.stopped, PodState.terminated):
        return Verdict(action="abort", reason="the pod was lost during its on-pod eval")
    if stop_for_run_cap:
        return Verdict(action="abort", reason="stopped: the run budget cap was reached (budget.on_cap = stop)")
    if job_cost >= max_job_usd:
        return Verdict(action="abort", reason=f"stopped: the job cost ${job_cost:.2f} reached budget.max_job_usd ${max_job_usd:.2f}")
    if waited_s > timeout_s:
        return Verdict(action="abort", reason=f"the on-pod eval gave no result within backends.eval.eval_timeout_s = {timeout_s:g} s")
    return Verdict(action="running")


def eval_refusal(exit_report: ExitReport) -> str | None:
    """Why the hidden prompts must not go to this job's pod (None: they may): only after a successful
    exit report that confirms the agent's processes are gone and the runner waits for the request."""
    if not exit_report.succeeded:
        return f"the job did not succeed ({exit_report.reason})"
    if not exit_report.agent_stopped:
        return "the pod did not confirm that the agent's processes stopped; no hidden item was sent"
    if not exit_report.eval_on_pod:
        return "the pod's runner does not serve an on-pod eval for this job; no hidden item was sent"
    return None


def eval_targets(trained_is_base: bool, base_known: bool) -> list[Target]:
    """Models the pod must score: the trained one (unless it is the base), and the base unless its score is known."""
    targets: list[Target] = [] if trained_is_base else ["trained"]
    return targets if base_known else [*targets, "base"]


def keep_warm(pod_state: PodState | None, idle_pods: int, warm_pool_size: int, run_accepting: bool) -> bool:
    """Keep a pod whose job just ended for the next job, or terminate it."""
    return pod_state == PodState.running and run_accepting and idle_pods < warm_pool_size


def reap_reason(
    *,
    pod_state: PodState,
    uptime_s: int,
    assignment: PodAssignment | None,
    job_live: bool,
    run_final: bool,
    run_accepting: bool,
    now: float,
    idle_timeout_s: float,
    orphan_grace_s: float,
) -> str | None:
    """Why the reaper terminates one of our pods, or None to leave it alone."""
    if pod_state == PodState.terminated:
        return None
    if run_final:
        return "its run has ended"
    if assignment is None:
        return "no assignment record (orphan)" if uptime_s >= orphan_grace_s else None
    if assignment.terminated:
        return "settlement was interrupted"
    if assignment.job_name is not None:
        return None if job_live else f"its job {assignment.job_name} is not live (orphan)"
    if pod_state == PodState.stopped:
        return "stopped while idle"
    if not run_accepting:
        return "idle and the run takes no new jobs"
    idle = now - (assignment.released_at or now)
    if idle > idle_timeout_s:
        return f"idle for {idle:.0f}s"
    return None


class ReapSchedule:
    """When the orphan reaper last ran in this process, per run database: it lists the pods (a vendor API call) at most
    once per `reap_interval_s`. A backend is built for every stage message, so the schedule outlives it: each backend
    takes `PROCESS_REAP_SCHEDULE` unless it is given its own."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def take(self, key: str, now: float, interval_s: float) -> bool:
        """Whether `key`'s reaper is due at `now` (it never ran, or ran `interval_s` or more before); if so, it runs now."""
        with self._lock:
            if now - self._last.get(key, float("-inf")) < interval_s:
                return False
            self._last[key] = now
            return True


PROCESS_REAP_SCHEDULE = ReapSchedule()
"""The reaper's schedule of this process (one per process, like the rate it keeps)."""
