"""Stage tasks. Each claims its row, works outside any transaction, and records its result in one.

A duplicated or replayed message finds the stage claimed or done and does nothing.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from celery import Task
from celery.signals import task_failure

from metarl import composition as registry
from metarl.artifact_store import DIGEST_MARK, ArtifactStore
from metarl.backends.local.agent import workspace_key
from metarl.domain.retry import WORKER_BACKOFF, backoff_delay
from metarl.domain.transitions import Transition, after_agent, after_eval, after_probe, after_train
from metarl.errors import CapacityError, PermanentBackendError, PlatformFault, TransientBackendError, describe_error
from metarl.interfaces import BaseScoreKey, EpisodeContext
from metarl.messaging.dispatch import send_stage
from metarl.probe.job import probe_job_text
from metarl.store import (
    Claim,
    ClaimReads,
    CreationBlock,
    InnerJobRow,
    StageClaimed,
    StageRecord,
    StageSkipped,
    StaleTransition,
    StoreError,
    baseline_lookup,
    claim_stage_work,
    cost_records,
    count_transient_failure,
    evaluation_record,
    inner_job_name,
    launch_record,
    lost_record,
    move_episode,
    note_capacity_wait,
    note_claim_error,
    note_storage_wait,
    poll_record,
    renew_claim,
    reward_params,
    reward_record,
    store_base_score,
    submission_record,
    unscored_reward_record,
    verdict_record,
)
from schemas.base import parse_toml_text, validate_model
from schemas.job import JobSpec
from schemas.run_config import RunConfig
from schemas.states import ClaimStatus, InnerJobStatus, Stage, StageOutcome
from workers.app import app
from workers.common import database_url, worker_name
from workers.heartbeat import Heartbeater
from workers.hosts import PlatformBlocked, check_this_host, pause_for_fault

log = logging.getLogger("metarl.worker")

STORAGE_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""A full disk or quota: the stage waits for space (retried, claim kept) instead of failing its episode."""
MAX_STORAGE_WAIT_S = 10.0
STAGE_TASK_NAMES = {
    "metarl.stage.agent": Stage.agent,
    "metarl.stage.probe": Stage.probe,
    "metarl.stage.train": Stage.train,
    "metarl.stage.eval": Stage.eval,
}


@dataclass
class StageJob:
    """A claimed stage with what its work needs (`loaded`: what the stage's loader read in the claim's transaction;
    `attempts`: the reward's inputs from the stage row, `StageRow.passed_attempt_and_tokens`)."""

    claim: Claim
    config: RunConfig
    ctx: EpisodeContext
    job_toml: str | None = None
    loaded: Any = None
    attempts: tuple[int | None, int] = (None, 0)


StageLoader = Callable[[ClaimReads, StageClaimed], Any]
"""Reads what a stage needs after its claim, on the claim's connection (`metarl.store.stage_work.claim_stage_work`)."""


def claim_episode_stage(stage: Stage, episode_id: int, probe_attempt: int, token: str | None, load: StageLoader | None = None) -> StageJob | None:
    """Claim the stage, or return None when the message is stale, done, or held by a live worker.

    The claim is one statement, the claim rules' one more when it is a duplicate message or a
    takeover; then `load` reads (or creates, in its own statement) what the stage needs, unless the
    stage was abandoned too often.
    """

    def load_unless_abandoned(reads: ClaimReads, claimed: StageClaimed) -> Any:
        blocked = check_this_host(claimed.ctx.run_id, claimed.config, stage.value)  # the secret first: before anything draws or keys a hidden eval
        if blocked is not None:
            return blocked
        if load is None or claimed.claim.takeovers > claimed.config.retries.max_stage_attempts:
            return None
        return load(reads, claimed)

    outcome = claim_stage_work(
        database_url(),
        stage=stage,
        episode_id=episode_id,
        probe_attempt=probe_attempt,
        token=token,
        worker=worker_name(),
        load=load_unless_abandoned,
    )
    if isinstance(outcome, StageSkipped):
        log.info("skip %s episode=%s attempt=%s: %s", stage.value, episode_id, probe_attempt, outcome.reason)
        return None
    claimed = outcome.claimed
    claim, config = claimed.claim, claimed.config
    if isinstance(outcome.loaded, PlatformBlocked):
        pause_for_fault(claimed.ctx.run_id, stage.value, outcome.loaded.fault, claim)
        return None
    job = StageJob(
        claim=claim, config=config, ctx=claimed.ctx, job_toml=claimed.row.job_toml, loaded=outcome.loaded, attempts=claimed.row.passed_attempt_and_tokens
    )
    if claim.takeovers > config.retries.max_stage_attempts:
        message = f"stage {stage.value} was abandoned {claim.takeovers} times (workers died or crashed in it); giving up"
        fail_episode(job, stage, f"{message}; last error: {claim.last_error}" if claim.last_error else message)
        return None
    return job


@task_failure.connect
def note_stage_failure(sender: Any = None, exception: BaseException | None = None, args: Sequence[Any] | None = None, **_: Any) -> None:
    """Record `Type: message` on the still-running claim of a stage task that raised, hit its time limit, or lost its process.

    Celery sends `task_failure` from the pool process for an exception and from the worker's main
    process for a hard time limit or a lost pool process. The claim then expires and is taken
    over; when the takeovers pass the cap, the episode fails with this error in its message.
    """
    stage = STAGE_TASK_NAMES.get(getattr(sender, "name", ""))
    if stage is None or exception is None or not args or len(args) < 2:
        return
    try:
        note_claim_error(database_url(), episode_id=int(args[0]), stage=stage, probe_attempt=int(args[1]), error=describe_error(exception))
    except StoreError as err:
        log.warning("could not record the error of %s episode=%s: %s", stage.value, args[0], err)


def fail_episode(job: StageJob, stage: Stage, message: str) -> None:
    """Record a permanent failure of the episode (after retry caps or a permanent error); at train, its unfinished inner job is lost with it."""
    records = [lost_record(job.ctx.episode_id, f"abandoned: {message}")] if stage == Stage.train else []
    try:
        failed = Transition(Stage.failed, job.ctx.probe_attempt)
        if not move_episode(database_url(), job.claim, ClaimStatus.failed, failed, episode_error=message, claim_error=message, records=records):
            return
    except StaleTransition:
        pass  # the episode moved on: nothing was written
    log.warning("episode %s failed at %s: %s", job.ctx.episode_id, stage.value, message)


def storage_wait_s(lease_s: float) -> float:
    """Seconds between tries while storage is full: well inside the lease, so the claim is never taken over meanwhile."""
    return max(0.2, min(MAX_STORAGE_WAIT_S, lease_s / 3))


def wait_for_storage(task: Task, job: StageJob, stage: Stage, err: OSError) -> Exception:
    """The stage hit a full disk: keep the claim, show why on the claim and the episode (`metarl status`), try again later.

    Nothing is failed or billed meanwhile: the episode pauses in its stage until space is freed.
    """
    message = f"waiting for storage space: {describe_error(err)}"
    note_storage_wait(database_url(), job.claim, message)
    delay = storage_wait_s(job.config.retries.lease_s)
    log.warning("%s episode=%s %s; retry in %.1fs", stage.value, job.ctx.episode_id, message, delay)
    return task.retry(args=[job.ctx.episode_id, job.ctx.probe_attempt], kwargs={"token": job.claim.token}, countdown=delay, max_retries=None)


def run_with_retries(task: Task, job: StageJob, stage: Stage, work: Callable[[], Any]) -> Any:
    """Run backend work; transient errors retry with backoff up to the cap, permanent errors fail the episode.

    A full disk (ENOSPC, EDQUOT) is neither: the stage waits for space (see wait_for_storage).
    """
    try:
        return work()
    except OSError as err:
        if err.errno not in STORAGE_FULL_ERRNOS:
            raise
        raise wait_for_storage(task, job, stage, err) from None
    except TransientBackendError as err:
        failures = count_transient_failure(database_url(), job.claim)
        if failures >= job.config.retries.max_stage_attempts:
            fail_episode(job, stage, f"gave up after {failures} transient errors: {err}")
            return None
        delay = backoff_delay(WORKER_BACKOFF, failures)
        log.warning("transient error at %s episode=%s (%s); retry in %ss", stage.value, job.ctx.episode_id, err, delay)
        raise task.retry(args=[job.ctx.episode_id, job.ctx.probe_attempt], kwargs={"token": job.claim.token}, countdown=delay, max_retries=None) from None
    except PermanentBackendError as err:
        fail_episode(job, stage, str(err))
        return None
    except PlatformFault as err:
        return platform_fault(task, job, stage, err)


def platform_fault(task: Task, job: StageJob, stage: Stage, fault: PlatformFault) -> None:
    """Infrastructure failed, not the job: retry with backoff while it may pass, then pause the run with the cause. The
    episode keeps its stage and is charged nothing; `metarl resume` takes the stage up again."""
    if fault.retryable:
        failures = count_transient_failure(database_url(), job.claim)
        if failures < job.config.retries.max_stage_attempts:
            delay = backoff_delay(WORKER_BACKOFF, failures)
            log.warning("platform fault at %s episode=%s (%s); retry in %ss", stage.value, job.ctx.episode_id, fault, delay)
            raise task.retry(args=[job.ctx.episode_id, job.ctx.probe_attempt], kwargs={"token": job.claim.token}, countdown=delay, max_retries=None) from None
    pause_for_fault(job.ctx.run_id, stage.value, fault, job.claim)
    return None


def run_store(job: StageJob) -> ArtifactStore:
    """The run's artifact store as this host reaches it."""
    return ArtifactStore(job.config.artifacts.root)


def with_local_workspace(job: StageJob) -> EpisodeContext:
    """The episode's context with its workspace as a folder on this host (a verified copy from the store under a URL root)."""
    if job.ctx.workspace_uri is None:
        return job.ctx
    return job.ctx.model_copy(update={"workspace_uri": str(run_store(job).tree(job.ctx.workspace_uri))})


def stored_workspace(job: StageJob, folder: str | None) -> str | None:
    """Put the workspace the agent wrote on this host into the run's store; its reference (None: no workspace)."""
    if folder is None:
        return None
    store = run_store(job)
    reference = store.put_tree(Path(folder), f"{workspace_key(job.ctx)}/files")
    if store.remote:
        shutil.rmtree(store.working_dir(workspace_key(job.ctx)), ignore_errors=True)
    return reference


def local_checkpoint(job: StageJob, checkpoint: str | None) -> str | None:
    """A checkpoint the store holds, as a verified folder on this host; any other URI as it is (a backend's own storage)."""
    if checkpoint is None or DIGEST_MARK not in checkpoint:
        return checkpoint
    return str(run_store(job).tree(checkpoint))


def heartbeating(job: StageJob) -> Heartbeater:
    return Heartbeater(database_url(), job.claim, interval_s=max(0.5, job.config.retries.lease_s / 3))


def dispatch_after(job: StageJob, stage: Stage, episode_id: int, probe_attempt: int) -> None:
    if stage in (Stage.agent, Stage.probe, Stage.train, Stage.eval):
        send_stage(app, stage, episode_id, probe_attempt, time_limit=job.config.deadlines.for_queue(stage.value))


@app.task(bind=True, name="metarl.stage.agent", queue="agent", max_retries=None)
def agent_stage(self: Task, episode_id: int, probe_attempt: int, token: str | None = None) -> StageOutcome:
    """Run the trainer agent for one attempt and store its submission."""
    job = claim_episode_stage(Stage.agent, episode_id, probe_attempt, token)
    if job is None:
        return StageOutcome.skipped
    backend = registry.agent_backend(job.config)
    lookup = baseline_lookup(
        database_url(), job.ctx.task, lambda model: registry.base_score_key(job.config, job.ctx.task, model), lambda: registry.eval_backend(job.config)
    )

    def attempt() -> Any:
        written = backend.run_attempt(job.ctx, baseline=lookup)
        return written.model_copy(update={"workspace_uri": stored_workspace(job, written.workspace_uri)})

    with heartbeating(job) as beat:
        submission = run_with_retries(self, job, Stage.agent, attempt)
    if submission is None or beat.lost.is_set():
        return StageOutcome.abandoned
    to = after_agent(probe_attempt)
    sample = submission.sample
    submitted = submission_record(
        episode_id=episode_id,
        run_id=job.ctx.run_id,
        attempt=probe_attempt,
        job_toml=submission.job_toml,
        workspace_uri=submission.workspace_uri,
        agent_tokens=submission.agent_tokens,
        agent_backend=backend.name,
        policy_tokens=sample.tokens if sample else None,
        behaviour_logprobs=sample.logprobs if sample else None,
        prompt_length=sample.prompt_length if sample else None,
    )
    charges = cost_records(job.ctx.run_id, episode_id, submission.costs, backend.simulated)  # the tokens were spent, moved or not
    if not move_episode(database_url(), job.claim, ClaimStatus.done, to, records=[submitted, *charges]):
        return StageOutcome.taken_over
    dispatch_after(job, to.stage, episode_id, to.probe_attempt)
    return StageOutcome.submitted


@app.task(bind=True, name="metarl.stage.probe", queue="probe", max_retries=None)
def probe_stage(self: Task, episode_id: int, probe_attempt: int, token: str | None = None) -> StageOutcome:
    """Validate one submission; send errors back to the agent or end the episode at the retry cap."""
    job = claim_episode_stage(Stage.probe, episode_id, probe_attempt, token)
    if job is None:
        return StageOutcome.skipped
    job_toml, workspace_uri = submitted_job_text(job.ctx, job.job_toml), job.ctx.workspace_uri
    started = time.perf_counter()
    checks = registry.probe_checks(job.config)
    if workspace_uri is not None:
        minimum = job.config.sandbox.min_isolation
        verdict = run_with_retries(
            self, job, Stage.probe, lambda: probe_workspace_or_fail(str(with_local_workspace(job).workspace_uri), job.ctx.task, checks, job.ctx.seed, minimum)
        )
        if verdict is None:
            return StageOutcome.failed
        log.info("probe episode=%s attempt=%s passed=%s isolation=%s", episode_id, probe_attempt, verdict.passed, verdict.isolation)
    else:
        verdict = probe_job_text(job_toml, job.ctx.task, checks)
    seconds = time.perf_counter() - started
    to = after_probe(verdict.passed, probe_attempt, job.config.retries.max_probe_attempts)
    probed = verdict_record(
        episode_id=episode_id,
        attempt=probe_attempt,
        passed=verdict.passed,
        errors=[problem.model_dump() for problem in verdict.errors],
        probe_seconds=seconds,
        model_name=verdict.job.model.name if verdict.job else None,
        explicit_hyperparameters=verdict.job.explicit_hyperparameters() if verdict.job else None,
        isolation=verdict.isolation,
    )
    records = [probed]
    if to.ends_unvalidated:
        records.append(unscored_reward_record(episode_id=episode_id, run_id=job.ctx.run_id, config=job.config, task=job.ctx.task, attempts=job.attempts))
    if not move_episode(database_url(), job.claim, ClaimStatus.done, to, records=records):
        return StageOutcome.taken_over
    dispatch_after(job, to.stage, episode_id, to.probe_attempt)
    return StageOutcome.passed if verdict.passed else StageOutcome.rejected


def probe_workspace_or_fail(workspace_uri: str, task, checks, seed: int, min_isolation: Literal["process", "full"] = "full"):
    """The whole-workspace probe; a sandbox that cannot start is a transient infrastructure error, a
    host that cannot give the run's ``[sandbox] min_isolation`` a permanent one (never the agent's fault)."""
    from metarl.probe.workspace import probe_workspace
    from metarl.sandbox.parent import IsolationUnavailable, SandboxLimits, SandboxUnavailable

    try:
        return probe_workspace(workspace_uri, task, checks, seed=seed, limits=SandboxLimits(min_isolation=min_isolation))
    except IsolationUnavailable as err:
        raise PermanentBackendError(str(err)) from None
    except SandboxUnavailable as err:
        raise TransientBackendError(f"sandbox unavailable: {err}") from None


def submitted_job_text(ctx: EpisodeContext, job_toml: str | None) -> str:
    """The job.toml text of the claimed attempt (read with the claim); an attempt past the agent stage always has one."""
    if job_toml is None:
        raise RuntimeError(f"episode {ctx.episode_id} attempt {ctx.probe_attempt} has no submission")
    return job_toml


def passing_job(ctx: EpisodeContext, job_toml: str | None) -> JobSpec:
    """The validated job of the attempt that passed the probe."""
    return validate_model(JobSpec, parse_toml_text(submitted_job_text(ctx, job_toml), "job.toml"), "job.toml")


@dataclass(frozen=True)
class TrainInputs:
    """What the train stage's loader read or created: the passing job and its inner job, or why there is none."""

    spec: JobSpec
    inner: InnerJobRow | None
    blocked: CreationBlock | None = None


def train_inputs(reads: ClaimReads, claimed: StageClaimed) -> TrainInputs:
    """The train stage's loader: the passing job and its inner job, created on the first submit when budget and capacity allow.

    The job is created in one autocommit statement on the claim's connection; the capacity count and
    the insert run under the backend's advisory lock, so two submits never both take the last slot.
    """
    config, ctx, row = claimed.config, claimed.ctx, claimed.row
    spec = passing_job(ctx, row.job_toml)
    if row.inner_job is not None:
        return TrainInputs(spec, row.inner_job)
    backend = registry.train_backend(config)
    created = reads.create_inner_job(
        run_id=ctx.run_id,
        episode_id=ctx.episode_id,
        name=inner_job_name(ctx.run_id, ctx.episode_id),
        backend=backend.name,
        simulated=backend.simulated,
        model_name=spec.model.name,
        max_usd=config.budget.max_run_usd,
        capacity=backend.capacity(),
    )
    return TrainInputs(spec, None, created) if isinstance(created, str) else TrainInputs(spec, created)


@dataclass(frozen=True)
class EvalInputs:
    """What the eval stage's claim read: the passing job, its finished inner job, the base score's key and cached score (None if not yet measured)."""

    spec: JobSpec
    inner: InnerJobRow
    base_key: BaseScoreKey
    base_score: float | None


def eval_inputs(reads: ClaimReads, claimed: StageClaimed) -> EvalInputs:
    """The eval stage's loader: the passing job, its inner job (read with the stage row) and the stored base score, if any."""
    config, ctx, row = claimed.config, claimed.ctx, claimed.row
    spec = passing_job(ctx, row.job_toml)
    inner = row.inner_job
    if inner is None:
        raise RuntimeError(f"episode {ctx.episode_id} reached eval without an inner job record")
    base_key = registry.base_score_key(config, ctx.task, spec.model.name)
    return EvalInputs(spec, inner, base_key, reads.cached_base_score(base_key))


@app.task(bind=True, name="metarl.stage.train", queue="train", max_retries=None)
def train_stage(self: Task, episode_id: int, probe_attempt: int, token: str | None = None) -> StageOutcome:
    """Submit the inner job once, then poll it with short messages (each sends the next) until it ends."""
    job = claim_episode_stage(Stage.train, episode_id, probe_attempt, token, load=train_inputs)
    if job is None:
        return StageOutcome.skipped
    inputs: TrainInputs = job.loaded
    spec, inner = inputs.spec, inputs.inner
    backend = registry.train_backend(job.config)
    url = database_url()

    def poll_again(countdown: float) -> StageOutcome:
        """Send this stage's next poll (with the claim's token) and end this message: no Retry, whose traceback Celery pickles."""
        send_stage(
            app,
            Stage.train,
            episode_id,
            probe_attempt,
            token=job.claim.token,
            countdown=countdown,
            time_limit=job.config.deadlines.for_queue(Stage.train.value),
        )
        return StageOutcome.polling

    if inputs.blocked == "budget":
        fail_episode(job, Stage.train, f"run budget of ${job.config.budget.max_run_usd} reached; job not launched")
        return StageOutcome.budget
    if inputs.blocked == "capacity":
        return poll_again(backend.poll_interval_s())  # the claim was just renewed by this attempt's claim
    assert inner is not None
    name, external_id, state, status = inner.name, inner.external_id, dict(inner.backend_state or {}), inner.status
    if external_id is None:
        try:
            launched = run_with_retries(self, job, Stage.train, lambda: backend.launch(with_local_workspace(job), spec, name))
        except CapacityError as err:
            note_capacity_wait(url, job.claim, f"capacity: {err}")
            return poll_again(max(5.0, backend.poll_interval_s()))
        if launched is None:
            return StageOutcome.failed
        renew_claim(url, job.claim, records=[launch_record(episode_id, launched)])  # the launch is recorded whether or not the claim still holds
        return poll_again(backend.poll_interval_s())
    if status != InnerJobStatus.running:
        return finish_train(job, episode_id, probe_attempt, status, inner.error)
    polled = run_with_retries(self, job, Stage.train, lambda: backend.poll(with_local_workspace(job), spec, external_id, state))
    if polled is None:
        return StageOutcome.failed
    ended = None if polled.status == "running" else (InnerJobStatus.succeeded if polled.status == "succeeded" else InnerJobStatus.failed)
    facts = [*cost_records(job.ctx.run_id, episode_id, polled.costs, backend.simulated), poll_record(episode_id, polled, ended)]
    # the poll's facts are written in the move's (or the heartbeat's) statement, and kept when the move is refused
    if ended is None:
        renew_claim(url, job.claim, records=facts)
        to = None
    else:
        to = close_train_stage(url, job, episode_id, probe_attempt, ended, polled.error, facts=facts)
    if ended is None:
        return poll_again(backend.poll_interval_s())
    if to is None:
        return StageOutcome.taken_over
    dispatch_after(job, to.stage, episode_id, to.probe_attempt)
    return StageOutcome(ended.value)


def close_train_stage(
    url: str, job: StageJob, episode_id: int, probe_attempt: int, status: InnerJobStatus, error: str | None, facts: Sequence[StageRecord] = ()
) -> Transition | None:
    """Close the train claim and move the episode in one statement of its own (None if the claim was taken over).

    A succeeded job goes to eval; a failed job ends the episode with no job credit (its reward is a
    record of the move). `facts` (the last poll's) are written in the move's statement, whether or
    not the move happens.
    """
    if status == InnerJobStatus.succeeded:
        to = after_train(probe_attempt)
        return to if move_episode(url, job.claim, ClaimStatus.done, to, records=facts) else None
    to = Transition(Stage.done, probe_attempt)
    unscored = unscored_reward_record(episode_id=episode_id, run_id=job.ctx.run_id, config=job.config, task=job.ctx.task, attempts=job.attempts)
    moved = move_episode(url, job.claim, ClaimStatus.done, to, episode_error=f"inner job failed: {error or ''}", records=[*facts, unscored])
    return to if moved else None


def finish_train(job: StageJob, episode_id: int, probe_attempt: int, status: InnerJobStatus, error: str | None) -> StageOutcome:
    """Close the train stage of a job that had already ended when this attempt started (`error`: the job's, read with the claim)."""
    to = close_train_stage(database_url(), job, episode_id, probe_attempt, status, error)
    if to is None:
        return StageOutcome.taken_over
    dispatch_after(job, to.stage, episode_id, to.probe_attempt)
    return StageOutcome(status.value)


@app.task(bind=True, name="metarl.stage.eval", queue="eval", max_retries=None)
def eval_stage(self: Task, episode_id: int, probe_attempt: int, token: str | None = None) -> StageOutcome:
    """Score base (cached) and trained model on the hidden eval; store evaluation and reward."""
    job = claim_episode_stage(Stage.eval, episode_id, probe_attempt, token, load=eval_inputs)
    if job is None:
        return StageOutcome.skipped
    inputs: EvalInputs = job.loaded
    spec, inner, base_score = inputs.spec, inputs.inner, inputs.base_score
    backend = registry.eval_backend(job.config)
    task = job.ctx.task
    url = database_url()
    checkpoint, state, train_seconds = inner.checkpoint_uri, dict(inner.backend_state or {}), inner.train_seconds
    started = time.perf_counter()
    with heartbeating(job) as beat:
        if base_score is None:
            base = run_with_retries(self, job, Stage.eval, lambda: backend.score_base(task, spec.model.name))
            if base is None:
                return StageOutcome.failed
            store_base_score(url, inputs.base_key, base)
            base_score = base.score
        trained = run_with_retries(self, job, Stage.eval, lambda: backend.score_trained(job.ctx, spec, local_checkpoint(job, checkpoint), state))
    if trained is None or beat.lost.is_set():
        return StageOutcome.abandoned
    to = after_eval(probe_attempt)
    evaluated = evaluation_record(
        episode_id=episode_id,
        backend=backend.name,
        simulated=backend.simulated,
        base_score=base_score,
        trained_score=trained.score,
        ci_low=trained.ci_low,
        ci_high=trained.ci_high,
        n_items=trained.n_items,
        eval_seconds=time.perf_counter() - started,
    )
    rewarded = reward_record(
        reward_params(
            episode_id=episode_id,
            run_id=job.ctx.run_id,
            config=job.config,
            task=task,
            attempts=job.attempts,
            base_score=base_score,
            trained_score=trained.score,
            train_seconds=train_seconds,
        )
    )
    charges = cost_records(job.ctx.run_id, episode_id, trained.costs, backend.simulated)
    if not move_episode(url, job.claim, ClaimStatus.done, to, records=[evaluated, rewarded, *charges]):
        return StageOutcome.taken_over
    return StageOutcome.scored
