"""Inner jobs on Runpod pods: submit, then poll; a warm pool, a watchdog, an orphan reaper, per-second billing.

Over 600 lines on purpose: one class follows a job's whole life on a pod (place, poll, eval, settle, release, reap), steps
that share the pool's lock and the job state; the pure rules are in verdicts.py, pod names, shared files and billing in pods.py.

The train task launches a job once (idempotent by name) and then polls it with short retried
tasks; no worker is held for the whole job. All vendor calls go through `metarl.backends.runpod.provider`.

Pods and jobs meet in artifact storage, under `<artifacts root>/runpod/`:

    jobs/<job>/job.json               the job (spec, task) written before launch
    jobs/<job>/bundle/                the compiled prime-rl job bundle (metarl.backends.runpod.primerl), the runner's job_url
    jobs/<job>/a<k>/pod.json          AttemptPointer: the pod of attempt k (k > 0 after a restart)
    jobs/<job>/a<k>/                  the runner's result_url: status.json (heartbeats with the last
                                      metrics.jsonl step), metrics/, logs/, weights/step_N/, exit.json
    pods/<pod name>/assignment.json   PodAssignment: which job the pod runs now (job_name null: idle)

The result files are those of `metarl.backends.runpod.pod.runner` (`Heartbeat` and `ExitReport` of `metarl.backends.runpod.pod.protocol`). A pod is
created for a job and named after it (`metarl-<run>-<episode>`, `-r<k>` for restart k), with the
runner's METARL_RUNNER_JOB_URL / METARL_RUNNER_RESULT_URL in its environment, so a fresh pod runs
its first job at boot. When a job ends on a healthy pod, the pod is kept idle for the next job of
the same run (up to `warm_pool_size`, for `idle_timeout_s`); a job takes an idle pod before it
creates one, by rewriting the pod's assignment file (claims serialised by a PostgreSQL advisory
lock). The image's main process, `metarl.backends.runpod.pod.supervisor`, follows that file and runs each new job
with `metarl.backends.runpod.pod.runner` (`tests/fakes/runner.py` is a stand-in that follows it too). Pods also
get the artifact-storage variables named in `storage_env` (the runner keeps them from `rl`) and the
task's `max_gpu_train_seconds`, in the bundle manifest, which the runner enforces.

On-pod hidden eval (`[backends.eval] type = "pod_vllm"`, `metarl.backends.runpod.pod.eval_server`): the assignment says
`eval_on_pod`, so the runner stays on its job after `exit.json`. A poll that finds a successful
`exit.json` (written only once the agent's code stopped on the pod) publishes
`a<k>/eval/request.json` with the hidden prompts (the trained model, and the base when no pod has
scored it for the task yet), waits for `a<k>/eval/result.json`, keeps base completions under
`baselines/`, and only then releases the pod and ends the train stage; the eval stage grades.

Billing: pod seconds are charged in intervals of `billing_interval_s` of the vendor's uptime, one
ledger row per pod and interval with the key `runpod:<pod id>:<interval>`, so re-polls, takeovers
and reapers never bill twice. Complete intervals are billed while the pod runs; the last, partial
one when the pod is settled (stopped, its final uptime read, billed, then terminated). Intervals
that start once a job's eval request is published are the job's hidden eval: source `runpod_eval`
instead of `runpod` (same key, so the split is exact to the interval and never double-billed). A job
whose start-up runs past `startup_timeout_s` is settled at no less than the seconds it held the pod
(a container that never started shows no uptime while the pod is billed), its intervals described as
"start-up timed out", and its error says so.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from metarl.backends.runpod.config import PodVllmEvalBackend, RunpodTrainBackend
from metarl.backends.runpod.memory import job_memory_problems
from metarl.backends.runpod.pod.eval_server import REQUEST_FILE, RESULT_FILE, EvalRequest, EvalResult
from metarl.backends.runpod.pod.manifest import EXIT_FILE, METRICS_DIR, STATUS_FILE
from metarl.backends.runpod.pod.protocol import ExitReport, Heartbeat, PodAssignment
from metarl.backends.runpod.pod.supervisor import POD_NAME_ENV, POD_ROOT_ENV
from metarl.backends.runpod.pods import (
    NAME_PREFIX,
    POOL_LOCK_KEY,
    REAP_LOCK_KEY,
    RUNNER_JOB_URL_ENV,
    RUNNER_RESULT_URL_ENV,
    AttemptPointer,
    JobState,
    JobUrls,
    Store,
    billable_chunks,
    chunks_after,
    final_uptime,
    job_cost_usd,
    pod_charges,
    pod_name_for,
    run_key_of,
    run_prefix,
    settle_price,
    startup_uptime,
    storage_environment,
)
from metarl.backends.runpod.provider import LaunchRequest, PodInfo, PodState, RetryPolicy, RunpodProvider
from metarl.backends.runpod.verdicts import (
    PROCESS_REAP_SCHEDULE,
    ReapSchedule,
    eval_refusal,
    eval_targets,
    heartbeat_step,
    judge,
    judge_eval,
    keep_warm,
    reap_reason,
    watchdog,
)
from metarl.errors import CapacityError, PermanentBackendError, TransientBackendError
from metarl.interfaces import BackendServices, CostItem, EpisodeContext, LaunchResult, PollResult, RunpodRuns
from metarl.probe.job import BackendCheck
from schemas.backend_config import expect_config
from schemas.job import JobSpec
from schemas.run_config import BudgetConfig, RunConfig
from schemas.states import ENDED_RUN_STATUSES, RunStatus
from schemas.task_spec import TaskSpec

log = logging.getLogger("metarl.runpod")

_LOCAL_POOL_LOCK = threading.Lock()

LedgerWriter = Callable[[str, "int | None", list[CostItem]], None]


class RunpodTrain:
    """Train backend on Runpod pods (see the module docstring for the protocol and billing)."""

    name = "runpod"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> RunpodTrain:
        """Built from the run's config (metarl/composition.py), with the on-pod eval's settings when the hidden eval scores on the pods."""
        pod_eval = config.backends.eval if isinstance(config.backends.eval, PodVllmEvalBackend) else None
        return cls(expect_config(config.backends.train, RunpodTrainBackend), config.artifacts.root, config.budget, services.runpod_runs(), pod_eval=pod_eval)

    @staticmethod
    def compile_checks(config: RunConfig) -> list[BackendCheck]:
        """The probe's checks of a job: against the pinned prime-rl (metarl/backends/runpod/primerl/checks.py), and that its
        model fits the pods' trainer GPUs in the mode it asks for (metarl/backends/runpod/memory.py)."""
        from metarl.backends.runpod.primerl.checks import primerl_compile_problems

        backend = expect_config(config.backends.train, RunpodTrainBackend)
        return [primerl_compile_problems, functools.partial(job_memory_problems, list(backend.gpu_types), dict(backend.gpu_memory_gb), backend.gpu_count)]

    def __init__(
        self,
        config: RunpodTrainBackend,
        artifacts_root: str,
        budget: BudgetConfig | None = None,
        runs: RunpodRuns | None = None,
        provider: RunpodProvider | None = None,
        clock: Callable[[], float] = time.time,
        ledger: LedgerWriter | None = None,
        environ: Mapping[str, str] | None = None,
        pod_eval: PodVllmEvalBackend | None = None,
        reap_schedule: ReapSchedule | None = None,
    ):
        self.config = config
        self.pod_eval = pod_eval
        self.budget = budget or BudgetConfig()
        self.store = Store(artifacts_root)
        self.runs = runs
        retry = RetryPolicy(attempts=config.api_retries, backoff_s=config.api_backoff_s, call_timeout_s=config.api_timeout_s)
        self.provider = provider or RunpodProvider(retry, capacity_cooldown_s=config.capacity_cooldown_s)
        self.clock = clock
        self.ledger = ledger
        self.environ = os.environ if environ is None else environ
        self.reap_schedule = PROCESS_REAP_SCHEDULE if reap_schedule is None else reap_schedule

    # TrainBackend protocol

    def capacity(self) -> int:
        return self.config.max_pods

    def poll_interval_s(self) -> float:
        return self.config.poll_interval_s

    def launch(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> LaunchResult:
        """Write the job, then put it on a pod: its own pod if it has one, an idle warm pod, or a new one."""
        self._write_job(ctx, job, job_name)
        self.maintain()
        state = self._place(ctx.run_id, job_name, attempt=0, prior_usd=0.0, restarts=[])
        return LaunchResult(external_id=state.pod_id or job_name, state=state.model_dump(mode="json"))

    def poll(self, ctx: EpisodeContext, job: JobSpec, external_id: str, state: dict[str, Any]) -> PollResult:
        current = JobState.model_validate(state)
        self.maintain()
        if current.pod_id is None:
            return self._place_waiting(ctx, current)
        try:
            pod = self.provider.query(current.pod_id)
        except TransientBackendError as err:
            return self._api_unreachable(current, err)
        current.api_errors = 0
        now = self.clock()
        attempt_dir = self.store.attempt_path(current.job_name, current.attempt)
        exit_report = self.store.read_model(posixpath.join(attempt_dir, EXIT_FILE), ExitReport)
        heartbeat = self.store.read_model(posixpath.join(attempt_dir, STATUS_FILE), Heartbeat)
        uptime = max(current.last_uptime, pod.uptime_s if pod else 0)
        costs = self._running_charges(current, uptime)
        current.last_uptime = uptime
        progress = watchdog(
            now,
            heartbeat_step(heartbeat),
            current.last_step,
            current.last_progress_at,
            current.assigned_at,
            self.config.startup_timeout_s,
            self.config.hang_timeout_s,
        )
        current.last_step, current.last_progress_at = progress.last_step, progress.last_progress_at
        if exit_report is not None:
            current.trained_is_base = exit_report.succeeded and exit_report.trained_is_base  # the eval scores the base for it
        verdict = judge(
            pod_state=pod.state if pod else None,
            exit_report=exit_report,
            hung=progress.hung,
            restarts=len(current.restarts),
            max_restarts=self.config.max_restarts,
            job_cost=job_cost_usd(current.prior_usd, uptime, current.uptime_at_assign, current.cost_per_hr),
            max_job_usd=self.budget.max_job_usd,
            stop_for_run_cap=self.budget.on_cap == "stop" and self._run_over_budget(ctx.run_id),
            startup_timeout=progress.startup_timeout,
        )
        if verdict.action == "succeeded" and self.pod_eval is not None and exit_report is not None:
            return self._poll_eval(ctx, job, current, pod, exit_report, attempt_dir, costs, uptime, now)
        if verdict.action == "running":
            return PollResult(status="running", state=current.model_dump(mode="json"), costs=costs)
        if verdict.action in ("succeeded", "failed"):
            assert exit_report is not None
            self._release(ctx.run_id, ctx.episode_id, current, pod)
            metrics = self.store.uri(posixpath.join(attempt_dir, METRICS_DIR, "metrics.jsonl"))
            log.info("runpod job %s %s on pod %s (attempt %s)", current.job_name, verdict.action, current.pod_id, current.attempt)
            return PollResult(
                status=verdict.action,
                state=current.model_dump(mode="json"),
                checkpoint_uri=exit_report.weights_url if verdict.action == "succeeded" else None,
                metrics_uri=metrics,
                train_seconds=exit_report.duration_s,
                error=verdict.reason,
                costs=costs,
            )
        log.warning("runpod job %s on pod %s: %s -> %s", current.job_name, current.pod_id, verdict.reason, verdict.action)
        note = None
        if verdict.startup_timeout:  # billed for the time it waited even when the vendor shows no uptime
            current.last_uptime = startup_uptime(current.last_uptime, current.uptime_at_assign, current.assigned_at, now)
            note = "start-up timed out"
        spent = self._settle(ctx.run_id, ctx.episode_id, current.pod_id, current.pod_name, pod, current, note=note)
        if verdict.action == "abort":
            error = verdict.reason if note is None else f"{verdict.reason}; pod {current.pod_id} billed for {current.last_uptime}s"
            return PollResult(status="failed", state=current.model_dump(mode="json"), error=error, costs=costs)
        restarts = [*current.restarts, verdict.reason or "restart"]
        try:
            moved = self._place(ctx.run_id, current.job_name, attempt=current.attempt + 1, prior_usd=current.prior_usd + spent, restarts=restarts)
        except CapacityError as err:
            log.warning("runpod job %s waits for a pod after a restart: %s", current.job_name, err)
            moved = JobState(
                job_name=current.job_name, attempt=current.attempt + 1, prior_usd=current.prior_usd + spent, restarts=restarts, waiting_since=self.clock()
            )
        return PollResult(status="running", state=moved.model_dump(mode="json"), costs=costs)

    # the on-pod hidden eval

    def _poll_eval(
        self,
        ctx: EpisodeContext,
        job: JobSpec,
        current: JobState,
        pod: PodInfo | None,
        exit_report: ExitReport,
        attempt_dir: str,
        costs: list[CostItem],
        uptime: int,
        now: float,
    ) -> PollResult:
        """Training ended well on the pod: publish the hidden prompts (once), wait for the pod's completions, then release the pod."""
        assert self.pod_eval is not None
        request_path = posixpath.join(attempt_dir, *REQUEST_FILE.split("/"))
        result_path = posixpath.join(attempt_dir, *RESULT_FILE.split("/"))
        request_id = f"{current.job_name}:a{current.attempt}"
        result = self.store.read_model(result_path, EvalResult)
        if current.eval_requested_at is None and result is None:
            if pod is None or pod.state in (PodState.stopped, PodState.terminated):
                assert current.pod_id is not None
                self._settle(ctx.run_id, ctx.episode_id, current.pod_id, current.pod_name, pod, current)
                return PollResult(status="failed", state=current.model_dump(mode="json"), error="the pod was lost before its on-pod eval", costs=costs)
            refusal = eval_refusal(exit_report)
            if refusal is not None:  # the agent's code may still run there: the pod takes no next job either
                assert current.pod_id is not None
                self._settle(ctx.run_id, ctx.episode_id, current.pod_id, current.pod_name, pod, current)
                return PollResult(status="failed", state=current.model_dump(mode="json"), error=refusal, costs=costs)
            targets = eval_targets(exit_report.trained_is_base, self._base_known(ctx.task, job.model.name))
            if not targets:
                return self._end_after_eval(ctx, current, pod, exit_report, costs)
            published = self.store.read_model(request_path, EvalRequest)  # a poll that died after publishing
            if published is None:
                from metarl.backends.runpod.eval import eval_request

                published = eval_request(ctx.task, self.pod_eval, request_id=request_id, targets=targets, published_at=now)
                self.store.write_model(request_path, published)
                log.info("runpod job %s: training ended on pod %s; eval request published (%s)", current.job_name, current.pod_id, ", ".join(targets))
            current.eval_requested_at, current.eval_uptime_start, current.eval_targets = published.published_at, uptime, list(published.targets)
            return PollResult(status="running", state=current.model_dump(mode="json"), costs=costs)
        verdict = judge_eval(
            pod_state=pod.state if pod else None,
            result=result,
            request_id=request_id,
            waited_s=now - (current.eval_requested_at or now),
            timeout_s=self.pod_eval.eval_timeout_s,
            job_cost=job_cost_usd(current.prior_usd, uptime, current.uptime_at_assign, current.cost_per_hr),
            max_job_usd=self.budget.max_job_usd,
            stop_for_run_cap=self.budget.on_cap == "stop" and self._run_over_budget(ctx.run_id),
        )
        if verdict.action == "running":
            return PollResult(status="running", state=current.model_dump(mode="json"), costs=costs)
        if result is not None:
            self._remove(request_path)  # the pod deletes it; so does the backend, whatever the pod did
            if verdict.action == "succeeded":
                self._keep_base(ctx.task, job.model.name, result, current.job_name)
                current.eval_result_uri = self.store.uri(result_path)
        if verdict.action in ("abort", "failed"):  # a pod whose eval failed (a changed scoring stack, say) takes no next job
            self._remove(request_path)
            log.warning("runpod job %s on pod %s: %s", current.job_name, current.pod_id, verdict.reason)
            assert current.pod_id is not None
            self._settle(ctx.run_id, ctx.episode_id, current.pod_id, current.pod_name, pod, current)
            return PollResult(status="failed", state=current.model_dump(mode="json"), error=verdict.reason, costs=costs)
        return self._end_after_eval(ctx, current, pod, exit_report, costs)

    def _end_after_eval(self, ctx: EpisodeContext, current: JobState, pod: PodInfo | None, exit_report: ExitReport, costs: list[CostItem]) -> PollResult:
        """The job is over and its eval done (or not needed): release its pod and end the train stage."""
        self._release(ctx.run_id, ctx.episode_id, current, pod)
        attempt_dir = self.store.attempt_path(current.job_name, current.attempt)
        log.info("runpod job %s succeeded on pod %s (attempt %s, on-pod eval)", current.job_name, current.pod_id, current.attempt)
        return PollResult(
            status="succeeded",
            state=current.model_dump(mode="json"),
            checkpoint_uri=exit_report.weights_url,
            metrics_uri=self.store.uri(posixpath.join(attempt_dir, METRICS_DIR, "metrics.jsonl")),
            train_seconds=exit_report.duration_s,
            costs=costs,
        )

    def _base_known(self, task: TaskSpec, model_name: str) -> bool:
        """The base score of (task, model) is cached, or a pod's completions for it are kept."""
        from metarl.backends.runpod.eval import NAME, baseline_path

        if self.store.read(baseline_path(self.store, task, model_name)) is not None:
            return True
        if self.runs is None or self.pod_eval is None:
            return False
        from metarl.backends.runpod.eval import PodVllmEval

        return self.runs.base_score_cached(task, model_name, NAME, PodVllmEval.base_model_identity(self.pod_eval, model_name, task))

    def _keep_base(self, task: TaskSpec, model_name: str, result: EvalResult, job_name: str) -> None:
        from metarl.backends.runpod.eval import keep_baseline

        output = result.outputs.get("base")
        if output is not None and keep_baseline(self.store, task, model_name, output, result.digest, job_name):
            log.info("runpod job %s: base completions of %s on %s kept", job_name, model_name, task.id)

    def _remove(self, path: str) -> None:
        try:
            self.store.fs.rm(path)
        except FileNotFoundError:
            pass

    # placement

    def _write_job(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> None:
        payload = {
            "job_name": job_name,
            "run_id": ctx.run_id,
            "episode_id": ctx.episode_id,
            "task_id": ctx.task.id,
            "family": ctx.task.family,
            "max_train_seconds": ctx.train_seconds,
            "job": job.model_dump(mode="json"),
        }
        self.store.write_bytes(self.store.path("jobs", job_name, "job.json"), json.dumps(payload, indent=2).encode("utf-8"))
        if ctx.workspace_uri is None:
            log.warning("runpod job %s has no workspace (simulated agent): no prime-rl bundle is written", job_name)
            return
        from metarl.backends.runpod.primerl.compiler import compile_bundle, pod_compile_options, write_bundle
        from metarl.learning.data_families import family_for
        from metarl.learning.grader_plugins import grader_sources
        from metarl.workspace import WorkspaceError

        options = pod_compile_options(self.config.gpu_count, ctx.train_seconds)
        try:
            bundle = compile_bundle(job, ctx.workspace_uri, options, grader_sources(family_for(ctx.task).grader))
        except WorkspaceError as err:
            raise PermanentBackendError(f"job bundle of {job_name}: {err.message}") from None
        write_bundle(bundle, self.store.uri(self.bundle_path(job_name)))

    def bundle_path(self, job_name: str) -> str:
        return self.store.path("jobs", job_name, "bundle")

    def _state_for(self, job_name: str, attempt: int, pod: PodInfo, prior_usd: float, restarts: list[str], billed_chunks: int) -> JobState:
        now = self.clock()
        return JobState(
            job_name=job_name,
            attempt=attempt,
            pod_id=pod.pod_id,
            pod_name=pod.name,
            gpu_type=pod.gpu_type,
            gpu_count=pod.gpu_count or self.config.gpu_count,
            cost_per_hr=pod.cost_per_hr,
            assigned_at=now,
            uptime_at_assign=pod.uptime_s,
            last_uptime=pod.uptime_s,
            billed_chunks=billed_chunks,
            last_progress_at=now,
            prior_usd=prior_usd,
            restarts=restarts,
        )

    def _place(self, run_id: str, job_name: str, attempt: int, prior_usd: float, restarts: list[str]) -> JobState:
        """Put attempt k of a job on a pod; idempotent (a second call finds the first call's pod)."""
        attempt_dir = self.store.attempt_path(job_name, attempt)
        pointer_path = posixpath.join(attempt_dir, "pod.json")
        pointer = self.store.read_model(pointer_path, AttemptPointer)
        if pointer is not None:
            pod = self.provider.query(pointer.pod_id) if pointer.pod_id else self.provider.find_by_name(pointer.pod_name)
            assignment = self.store.read_model(self.store.assignment_path(pointer.pod_name), PodAssignment)
            if pod is not None and assignment is not None and assignment.job_name == job_name and not assignment.terminated:
                self.store.write_model(pointer_path, AttemptPointer(pod_name=pod.name, pod_id=pod.pod_id))
                log.info("runpod job %s re-attached to pod %s", job_name, pod.pod_id)
                return self._state_for(job_name, attempt, pod, prior_usd, restarts, assignment.billed_chunks)
        warm = self._claim_idle(run_id, job_name, attempt_dir)
        if warm is not None:
            pod, billed = warm
            self.store.write_model(pointer_path, AttemptPointer(pod_name=pod.name, pod_id=pod.pod_id))
            log.info("runpod job %s reuses warm pod %s", job_name, pod.pod_id)
            return self._state_for(job_name, attempt, pod, prior_usd, restarts, billed)
        name = pod_name_for(job_name, attempt)
        assignment_path = self.store.assignment_path(name)
        previous = self.store.read_model(assignment_path, PodAssignment)
        if previous is None or previous.job_name != job_name:
            seq = previous.seq + 1 if previous else 1
            self.store.write_model(
                assignment_path,
                PodAssignment(
                    pod_name=name,
                    seq=seq,
                    job_name=job_name,
                    **self._urls(job_name, attempt_dir),
                    assigned_at=self.clock(),
                    eval_on_pod=self.pod_eval is not None,
                ),
            )
        self.store.write_model(pointer_path, AttemptPointer(pod_name=name))
        pod = self.provider.launch(self._launch_request(name, job_name, attempt_dir))
        self.store.write_model(pointer_path, AttemptPointer(pod_name=name, pod_id=pod.pod_id))
        return self._state_for(job_name, attempt, pod, prior_usd, restarts, 0)

    def _urls(self, job_name: str, attempt_dir: str) -> JobUrls:
        return JobUrls(job_url=self.store.uri(self.bundle_path(job_name)), result_url=self.store.uri(attempt_dir))

    def _launch_request(self, name: str, job_name: str, attempt_dir: str) -> LaunchRequest:
        urls = self._urls(job_name, attempt_dir)
        return LaunchRequest(
            name=name,
            image=self.config.image,
            gpu_types=tuple(self.config.gpu_types),
            gpu_count=self.config.gpu_count,
            cloud_type=self.config.cloud_type,
            container_disk_gb=self.config.container_disk_gb,
            volume_gb=self.config.volume_gb,
            env={
                **storage_environment(self.config.storage_env, self.environ),
                POD_ROOT_ENV: self.store.root_uri,
                POD_NAME_ENV: name,
                RUNNER_JOB_URL_ENV: urls["job_url"],
                RUNNER_RESULT_URL_ENV: urls["result_url"],
            },
        )

    def _place_waiting(self, ctx: EpisodeContext, current: JobState) -> PollResult:
        """A restarted job without a pod yet (capacity): try again, give up after startup_timeout_s."""
        try:
            placed = self._place(ctx.run_id, current.job_name, current.attempt, current.prior_usd, current.restarts)
        except CapacityError as err:
            waited = self.clock() - (current.waiting_since or self.clock())
            if waited > self.config.startup_timeout_s:
                return PollResult(status="failed", state=current.model_dump(mode="json"), error=f"no pod for the restarted job within {waited:.0f}s: {err}")
            return PollResult(status="running", state=current.model_dump(mode="json"))
        return PollResult(status="running", state=placed.model_dump(mode="json"))

    def _api_unreachable(self, current: JobState, err: TransientBackendError) -> PollResult:
        current.api_errors += 1
        if current.api_errors >= self.config.max_poll_api_errors:
            raise TransientBackendError(f"{err} ({current.api_errors} polls in a row)")
        log.warning("runpod job %s: poll could not reach the API (%s in a row): %s", current.job_name, current.api_errors, err)
        return PollResult(status="running", state=current.model_dump(mode="json"))

    # pool

    def _pool_lock(self) -> Any:
        """A cross-process lock on the pool (PostgreSQL advisory lock; a thread lock without a database)."""
        if self.runs is None:
            return _LOCAL_POOL_LOCK
        return self.runs.holding_lock(POOL_LOCK_KEY)

    def _claim_idle(self, run_id: str, job_name: str, attempt_dir: str) -> tuple[PodInfo, int] | None:
        """Take an idle running pod of this run, if any; the assignment file is the claim."""
        if self.config.warm_pool_size == 0:
            return None
        candidates = [pod for pod in self.provider.list_owned(run_prefix(run_id)) if pod.state == PodState.running]
        if not candidates:
            return None
        with self._pool_lock():
            for pod in sorted(candidates, key=lambda pod: pod.pod_id):
                path = self.store.assignment_path(pod.name)
                assignment = self.store.read_model(path, PodAssignment)
                if assignment is None or assignment.job_name is not None or assignment.terminated:
                    continue
                self.store.write_model(
                    path,
                    assignment.model_copy(
                        update={
                            "seq": assignment.seq + 1,
                            "job_name": job_name,
                            **self._urls(job_name, attempt_dir),
                            "assigned_at": self.clock(),
                            "released_at": None,
                            "eval_on_pod": self.pod_eval is not None,
                        }
                    ),
                )
                return pod, assignment.billed_chunks
        return None

    def _idle_pods(self, run_id: str) -> int:
        prefix = run_prefix(run_id)
        pods_dir = self.store.path("pods")
        try:
            names = [posixpath.basename(path) for path in self.store.fs.ls(pods_dir, detail=False)]
        except FileNotFoundError:
            return 0
        count = 0
        for name in names:
            if not name.startswith(prefix):
                continue
            assignment = self.store.read_model(self.store.assignment_path(name), PodAssignment)
            if assignment is not None and assignment.job_name is None and not assignment.terminated:
                count += 1
        return count

    def _release(self, run_id: str, episode_id: int, current: JobState, pod: PodInfo | None) -> None:
        """The job ended by itself: keep its pod warm for the next job, or settle it."""
        assert current.pod_name is not None and current.pod_id is not None
        path = self.store.assignment_path(current.pod_name)
        with self._pool_lock():
            assignment = self.store.read_model(path, PodAssignment)
            if assignment is None or assignment.job_name != current.job_name:
                return
            keep = keep_warm(pod.state if pod else None, self._idle_pods(run_id), self.config.warm_pool_size, self._run_accepting(run_id))
            if keep:
                self.store.write_model(
                    path,
                    assignment.model_copy(
                        update={
                            "seq": assignment.seq + 1,
                            "job_name": None,
                            "job_url": None,
                            "result_url": None,
                            "released_at": self.clock(),
                            "billed_chunks": current.billed_chunks,
                            "eval_on_pod": False,
                        }
                    ),
                )
                log.info("runpod pod %s kept warm after job %s", current.pod_id, current.job_name)
                return
        self._settle(run_id, episode_id, current.pod_id, current.pod_name, pod, current)

    # settlement and billing

    def _running_charges(self, current: JobState, uptime: int) -> list[CostItem]:
        """Complete billing intervals of the job's pod not charged yet (recorded with the poll)."""
        if current.pod_id is None:
            return []
        chunk_s = self.config.billing_interval_s
        chunks = billable_chunks(uptime, chunk_s, current.billed_chunks, final=False)
        current.billed_chunks = chunks_after(uptime, chunk_s, current.billed_chunks, final=False)
        return pod_charges(
            current.pod_id,
            self._gpu_label(current.gpu_count, current.gpu_type),
            current.cost_per_hr,
            chunks,
            chunk_s,
            current.eval_uptime_start,
            current.job_name,
        )

    def _gpu_label(self, gpu_count: int, gpu_type: str | None) -> str:
        return f"{gpu_count or self.config.gpu_count}x {gpu_type or 'GPU'}"

    def _settle(
        self, run_id: str, episode_id: int | None, pod_id: str, pod_name: str | None, pod: PodInfo | None, current: JobState | None, note: str | None = None
    ) -> float:
        """Stop the pod, read its final uptime, charge every interval (``note`` ends their descriptions), then terminate it.
        Returns the cost of the job's share of the pod. Safe to repeat at any point (idempotent keys, idempotent calls)."""
        if pod_name is not None:
            path = self.store.assignment_path(pod_name)
            assignment = self.store.read_model(path, PodAssignment)
            if assignment is not None and not assignment.terminated:
                self.store.write_model(path, assignment.model_copy(update={"terminated": True}))
        if pod is not None and pod.state in (PodState.running, PodState.provisioning, PodState.unknown):
            self.provider.stop(pod_id)
        after = self.provider.query(pod_id)
        seen = max(current.last_uptime if current else 0, pod.uptime_s if pod else 0)
        uptime = final_uptime(after.uptime_s if after else None, seen)
        cost_per_hr = settle_price(current.cost_per_hr if current else None, after.cost_per_hr if after else None, pod.cost_per_hr if pod else None)
        chunk_s = self.config.billing_interval_s
        label = self._gpu_label(
            current.gpu_count if current else (pod.gpu_count if pod else 0), current.gpu_type if current else (pod.gpu_type if pod else None)
        )
        items = pod_charges(
            pod_id,
            label,
            cost_per_hr,
            billable_chunks(uptime, chunk_s, 0, final=True),
            chunk_s,
            current.eval_uptime_start if current else None,
            current.job_name if current else None,
            note,
        )
        self._record(run_id, episode_id, items)
        self.provider.terminate(pod_id)
        if current is not None:
            current.billed_chunks = chunks_after(uptime, chunk_s, 0, final=True)
            current.last_uptime = uptime
            log.info("runpod pod %s settled: %ss billed, terminated", pod_id, uptime)
            return job_cost_usd(0.0, uptime, current.uptime_at_assign, cost_per_hr)
        log.info("runpod pod %s settled: %ss billed, terminated", pod_id, uptime)
        return 0.0

    def _record(self, run_id: str, episode_id: int | None, items: list[CostItem]) -> None:
        """Write charges to the ledger now (settlement must be billed before the pod is gone)."""
        if not items:
            return
        if self.ledger is not None:
            self.ledger(run_id, episode_id, items)
            return
        if self.runs is None:
            raise PermanentBackendError("the runpod backend needs METARL_DATABASE_URL to bill pods")
        self.runs.record_costs(run_id, episode_id, items)

    # run state

    def _run_total(self, run_id: str) -> float | None:
        if self.runs is None:
            return None
        return self.runs.run_total_usd(run_id)

    def _run_over_budget(self, run_id: str) -> bool:
        total = self._run_total(run_id)
        return total is not None and total >= self.budget.max_run_usd

    def _run_accepting(self, run_id: str) -> bool:
        """The run still launches jobs: running, no stop requested, under its budget."""
        if self.runs is None:
            return True
        run = self.runs.run_state(run_id)
        if run is None or run.status != RunStatus.running or run.stop_requested:
            return False
        return not self._run_over_budget(run_id)

    # reaper

    def maintain(self, force: bool = False) -> int:
        """Orphan reaper, at most once per reap_interval_s per process (`ReapSchedule`) unless `force`; returns how many pods it terminated."""
        if self.runs is None:
            return 0
        now = self.clock()
        if not self.reap_schedule.take(self.runs.name, now, float("-inf") if force else self.config.reap_interval_s):
            return 0
        with self.runs.trying_lock(REAP_LOCK_KEY) as locked:
            if not locked:
                return 0
            try:
                pods = self.provider.list_owned(NAME_PREFIX)
            except TransientBackendError as err:
                log.warning("runpod reaper: could not list pods: %s", err)
                return 0
            return self._reap(pods, now)

    def _reap(self, pods: list[PodInfo], now: float) -> int:
        assert self.runs is not None, "the reaper runs only with the run database"
        by_run: dict[str, list[PodInfo]] = {}
        for pod in pods:
            key = run_key_of(pod.name)
            if key is not None:
                by_run.setdefault(key, []).append(pod)
        reaped = 0
        for key, run_pods in by_run.items():
            run = self.runs.reap_view(key)
            if run is None:
                continue  # not a run of this database: another deployment's pods are none of our business
            run_id, final = run.run_id, run.status in ENDED_RUN_STATUSES
            config, live = run.config, run.live_jobs
            train = config.backends.train
            if not isinstance(train, RunpodTrainBackend):
                continue
            pod_eval = config.backends.eval if isinstance(config.backends.eval, PodVllmEvalBackend) else None
            backend = RunpodTrain(
                train,
                config.artifacts.root,
                config.budget,
                self.runs,
                self.provider,
                self.clock,
                self.ledger,
                pod_eval=pod_eval,
                reap_schedule=self.reap_schedule,
            )
            accepting = backend._run_accepting(run_id) if not final else False
            for pod in run_pods:
                assignment = backend.store.read_model(backend.store.assignment_path(pod.name), PodAssignment)
                reason = reap_reason(
                    pod_state=pod.state,
                    uptime_s=pod.uptime_s,
                    assignment=assignment,
                    job_live=assignment is not None and assignment.job_name in live,
                    run_final=final,
                    run_accepting=accepting,
                    now=now,
                    idle_timeout_s=train.idle_timeout_s,
                    orphan_grace_s=train.orphan_grace_s,
                )
                if reason is None:
                    continue
                log.warning("runpod reaper: terminating pod %s (%s): %s", pod.pod_id, pod.name, reason)
                backend._settle(run_id, None, pod.pod_id, pod.name, pod, None)
                reaped += 1
        return reaped

    def release_run(self, run_id: str) -> int:
        """Settle and terminate every pod of a run (the orchestrator calls this when the run ends)."""
        pods = self.provider.list_owned(run_prefix(run_id))
        for pod in pods:
            if pod.state != PodState.terminated:
                log.info("runpod: run %s ended; terminating pod %s (%s)", run_id, pod.pod_id, pod.name)
                self._settle(run_id, None, pod.pod_id, pod.name, pod, None)
        return len(pods)
