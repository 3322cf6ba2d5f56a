"""SIMULATION: a discrete-event model of our orchestrator on a simulated GPU cloud, in simulated time.

Nothing here runs a job, a database or a broker. Durations, failures and prices are inputs (the
`sim` backend's lognormal `sample_duration`, seeded per episode); every *decision* is made by our
own pure functions, imported, not reimplemented:

* episode transitions: `metarl.domain.transitions.after_agent / after_probe / after_train / after_eval`
  (a failed inner job ends the episode, as `workers.stages.finish_train` does);
* the probe verdict: `metarl.probe.job.probe_job_text` on job.toml text written by the `sim` agent's
  own generators (`metarl.backends.sim.simulator`); the caller passes the probe in (the sim train backend
  adds no compile checks: `metarl.composition.probe_checks` is empty for it);
* staleness: `metarl.outer_update.filter_stale` drops complete groups that are too old, each tick;
* batching: `metarl.domain.batching.plan_batch` (oldest fresh groups first, `groups_per_batch` at once),
  `groups_to_open` (whole groups to keep the window full) and `group_complete`.

The tick (`Simulation.orchestrate`) follows `Orchestrator.tick`: drop stale groups, create one outer
step when none is running, then open groups. How many groups it opens follows `Orchestrator._open_groups`
(those few lines are the only rule copied here: they live inside the database-bound loop). The
synchronous baseline uses the same functions with the window set to one batch, opened only when the
previous batch's outer update has finished.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from metarl.backends.sim.config import SimDuration, SimTrainBackend
from metarl.backends.sim.simulator import INVALID_KINDS, _invalid_job_text, _valid_job, sample_duration, seeded_rng, simulated_skill
from metarl.domain.batching import GroupView, group_complete, groups_to_open, plan_batch
from metarl.domain.transitions import Transition, after_agent, after_eval, after_probe, after_train
from metarl.outer_update import filter_stale
from schemas.base import dump_toml_model
from schemas.states import Stage
from schemas.task_spec import TaskSpec

AGENT_DONE, PROBE_DONE, TRAIN_DONE, EVAL_DONE, OUTER_DONE = "agent_done", "probe_done", "train_done", "eval_done", "outer_done"
Mode = Literal["async", "sync", "sync-no-probe"]
ProbeFn = Callable[[str, TaskSpec], bool]


# -- inputs ---------------------------------------------------------------------------------------


class CloudSettings(BaseModel):
    """The SIMULATED cloud and workload: pods, stage durations, failure rates, price. Times in simulated seconds."""

    model_config = ConfigDict(extra="forbid")

    pods: int = Field(default=16, ge=1, le=10_000, description="GPU pods (2x A40 each) held for the run")
    outer_steps: int = Field(default=54, ge=1, le=100_000, description="Outer updates in the run")
    group_size: int = Field(default=8, ge=1, le=1024, description="Episodes per group")
    groups_per_batch: int = Field(default=4, ge=1, le=10_000, description="Complete groups per outer update")
    invalid_rate: float = Field(default=0.2, ge=0.0, le=1.0, description="Chance that one submitted job is invalid")
    max_probe_attempts: int = Field(default=3, ge=1, le=100, description="Submissions per episode before it ends unvalidated")
    gpu_failure_rate: float = Field(
        default=SimTrainBackend.model_fields["failure_rate"].default,
        ge=0.0,
        le=1.0,
        description="Chance that a valid job fails on its pod (at the end, as the sim backend does)",
    )
    usd_per_pod_hour: float = Field(default=SimTrainBackend.model_fields["usd_per_hour"].default, ge=0.0, le=1000.0, description="Price of one 2x A40 pod-hour")
    agent: SimDuration = Field(default=SimDuration(median_s=180.0, sigma=0.5, max_s=1800.0), description="One agent attempt (LLM API, unlimited concurrency)")
    probe: SimDuration = Field(default=SimDuration(median_s=30.0, sigma=0.3, max_s=300.0), description="One probe (CPU pool)")
    train: SimDuration = Field(default=SimDuration(median_s=720.0, sigma=0.7, max_s=4 * 3600.0), description="One valid inner job on a pod (heavy-tailed)")
    invalid_on_gpu: SimDuration = Field(
        default=SimDuration(median_s=300.0, sigma=0.5, max_s=1800.0),
        description="Pod time an invalid job burns before it fails (boot, model load, config error)",
    )
    eval: SimDuration = Field(default=SimDuration(median_s=120.0, sigma=0.3, max_s=900.0), description="One hidden eval (separate GPU eval workers)")
    outer: SimDuration = Field(default=SimDuration(median_s=120.0, sigma=0.3, max_s=900.0), description="One outer update")
    probe_workers: int = Field(default=8, ge=1, le=10_000, description="Probe pool size")
    eval_workers: int = Field(default=8, ge=1, le=10_000, description="Eval pool size (their GPUs are not the 16 pods and are not priced here)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of every draw")


class PolicySettings(BaseModel):
    """How the orchestrator schedules: our asynchronous window, or a synchronous batch."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = Field(description="async: our window; sync: one batch at a time, waiting for its slowest job; sync-no-probe: sync without the probe")
    in_flight: int = Field(default=32, ge=1, le=100_000, description="window.in_flight (async only)")
    max_steps_off_policy: int = Field(default=2, ge=0, le=1000, description="outer.max_steps_off_policy")
    stale_groups: Literal["drop", "resample"] = Field(default="drop", description="outer.stale_groups")


# -- the event queue ------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Event:
    """Something that finishes at `time`; ties are served in the order they were scheduled (`seq`)."""

    time: float
    seq: int
    kind: str = field(compare=False)
    ref: int = field(compare=False)


def push_event(queue: list[Event], time: float, kind: str, ref: int, seq: int) -> Event:
    """Schedule an event on a heap-ordered list and return it."""
    if not math.isfinite(time) or time < 0:
        raise ValueError(f"event time must be finite and >= 0, got {time}")
    event = Event(time, seq, kind, ref)
    heapq.heappush(queue, event)
    return event


def pop_event(queue: list[Event]) -> Event:
    """The earliest event (first scheduled among equal times)."""
    return heapq.heappop(queue)


# -- seeded draws (the same episode gets the same draws under every policy) -----------------------


def draw_duration(duration: SimDuration, seed: int, *parts: object) -> float:
    """A lognormal duration from the sim backend's sampler, seeded by `parts`."""
    return sample_duration(duration, seeded_rng("bench-async", seed, *parts))


@dataclass(frozen=True)
class Submission:
    """One job.toml the simulated agent submitted, and whether it was generated invalid (ground truth)."""

    job_toml: str
    invalid: bool


def draw_submission(seed: int, episode_id: int, attempt: int, invalid_rate: float, policy_version: int, task: TaskSpec) -> Submission:
    """The sim agent's generators: a valid job for the policy's skill, broken one of the sim's ways with `invalid_rate`."""
    rng = seeded_rng("bench-async-job", seed, episode_id, attempt)
    invalid = rng.random() < invalid_rate
    kind = rng.choice(INVALID_KINDS)
    valid = _valid_job(rng, simulated_skill(policy_version), task)
    return Submission(job_toml=_invalid_job_text(kind, valid) if invalid else dump_toml_model(valid), invalid=invalid)


def draw_job_fails(seed: int, episode_id: int, failure_rate: float) -> bool:
    """Whether a valid job fails on its pod."""
    return seeded_rng("bench-async-fail", seed, episode_id).random() < failure_rate


# -- state and records ----------------------------------------------------------------------------


@dataclass
class EpisodeState:
    """One simulated episode."""

    id: int
    group_id: int
    task_id: str
    policy_version: int
    stage: Stage = Stage.agent
    attempt: int = 1
    submission: Submission | None = None
    ended_unvalidated: bool = False


@dataclass
class GroupState:
    """One simulated group (same task, same policy version)."""

    id: int
    task_id: str
    policy_version: int
    size: int
    finished: int = 0
    status: str = "open"  # open -> complete -> batched | dropped
    opened_at: float = 0.0
    completed_at: float | None = None
    gpu_s: float = 0.0


@dataclass(frozen=True)
class JobRecord:
    """One job's time on a pod."""

    episode_id: int
    group_id: int
    start: float
    end: float
    invalid: bool
    succeeded: bool

    @property
    def seconds(self) -> float:
        """Pod seconds the job held."""
        return self.end - self.start


@dataclass(frozen=True)
class StepRecord:
    """One outer update."""

    step: int
    created_at: float
    done_at: float
    version_before: int
    staleness: tuple[int, ...]


@dataclass
class SimRecord:
    """Everything one simulated run produced."""

    mode: str
    pods: int
    makespan_s: float = 0.0
    jobs: list[JobRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    episodes: int = 0
    unvalidated: int = 0
    probe_rejections: int = 0
    dropped_groups: int = 0
    dropped_gpu_s: float = 0.0
    batched_groups: set[int] = field(default_factory=set)
    events: int = 0


# -- the simulation -------------------------------------------------------------------------------


class Simulation:
    """One run of the orchestrator's scheduling rules against the simulated cloud.

    `step()` serves one event, then runs one orchestrator tick and hands queued work to free
    workers; `run()` steps until the last outer update is done.
    """

    def __init__(self, cloud: CloudSettings, policy: PolicySettings, tasks: dict[str, TaskSpec], probe: ProbeFn):
        self.cloud, self.policy, self.tasks, self.probe = cloud, policy, tasks, probe
        self.trainable = [task_id for task_id, spec in tasks.items() if not spec.held_out]
        if not self.trainable:
            raise ValueError("the simulation needs at least one task that is not held out")
        self.now = 0.0
        self.version = 0
        self.steps_created = 0
        self.outer_busy: int | None = None
        self.queue: list[Event] = []
        self.seq = 0
        self.episodes: dict[int, EpisodeState] = {}
        self.groups: dict[int, GroupState] = {}
        self.active = 0
        self.free = {"probe": cloud.probe_workers, "train": cloud.pods, "eval": cloud.eval_workers}
        self.waiting: dict[str, deque[int]] = {"probe": deque(), "train": deque(), "eval": deque()}
        self.running_jobs: dict[int, float] = {}
        self.step_started: dict[int, tuple[float, int, tuple[int, ...]]] = {}
        self.resample: list[str] = []
        self.record = SimRecord(mode=policy.mode, pods=cloud.pods)

    # scheduling helpers
    def _schedule(self, delay: float, kind: str, ref: int) -> None:
        self.seq += 1
        push_event(self.queue, self.now + delay, kind, ref, self.seq)

    def _finish(self, episode: EpisodeState, to: Transition) -> None:
        episode.stage = to.stage
        episode.attempt = to.probe_attempt
        self.active -= 1
        group = self.groups[episode.group_id]
        group.finished += 1
        if group.status == "open" and group_complete(group.finished, group.size):
            group.status, group.completed_at = "complete", self.now

    # one event
    def apply(self, event: Event) -> None:
        """Move one episode (or the outer update) on, using our transition rules."""
        if event.kind == OUTER_DONE:
            created_at, version_before, staleness = self.step_started.pop(event.ref)
            self.record.steps.append(StepRecord(event.ref, created_at, self.now, version_before, staleness))
            self.version += 1
            self.outer_busy = None
            return
        episode = self.episodes[event.ref]
        if event.kind == AGENT_DONE:
            episode.submission = draw_submission(
                self.cloud.seed, episode.id, episode.attempt, self.cloud.invalid_rate, episode.policy_version, self.tasks[episode.task_id]
            )
            to = after_agent(episode.attempt)
            episode.stage = to.stage
            self.waiting["probe"].append(episode.id)
        elif event.kind == PROBE_DONE:
            self.free["probe"] += 1
            assert episode.submission is not None
            passed = self.policy.mode == "sync-no-probe" or self.probe(episode.submission.job_toml, self.tasks[episode.task_id])
            self.record.probe_rejections += not passed
            to = after_probe(passed, episode.attempt, self.cloud.max_probe_attempts)
            if to.stage == Stage.train:
                episode.stage = to.stage
                self.waiting["train"].append(episode.id)
            elif to.stage == Stage.agent:
                episode.stage, episode.attempt = to.stage, to.probe_attempt
                self._schedule(draw_duration(self.cloud.agent, self.cloud.seed, "agent", episode.id, episode.attempt), AGENT_DONE, episode.id)
            else:
                episode.ended_unvalidated = to.ends_unvalidated
                self.record.unvalidated += to.ends_unvalidated
                self._finish(episode, to)
        elif event.kind == TRAIN_DONE:
            self.free["train"] += 1
            assert episode.submission is not None
            start = self.running_jobs.pop(episode.id)
            succeeded = not episode.submission.invalid and not draw_job_fails(self.cloud.seed, episode.id, self.cloud.gpu_failure_rate)
            self.record.jobs.append(JobRecord(episode.id, episode.group_id, start, self.now, episode.submission.invalid, succeeded))
            self.groups[episode.group_id].gpu_s += self.now - start
            if succeeded:
                to = after_train(episode.attempt)
                episode.stage = to.stage
                self.waiting["eval"].append(episode.id)
            else:
                self._finish(episode, Transition(Stage.done, episode.attempt))
        elif event.kind == EVAL_DONE:
            self.free["eval"] += 1
            self._finish(episode, after_eval(episode.attempt))
        else:
            raise ValueError(f"unknown event kind {event.kind!r}")

    # one orchestrator tick
    def orchestrate(self) -> None:
        """Drop stale groups, start an outer update when a batch is ready, open groups (Orchestrator.tick's order)."""
        complete = {g.id: [g] for g in self.groups.values() if g.status == "complete"}
        split = filter_stale(complete, self.version, self.policy.max_steps_off_policy, mode=self.policy.stale_groups)
        for group_id in split.dropped:
            group = self.groups[group_id]
            group.status = "dropped"
            self.record.dropped_groups += 1
            self.record.dropped_gpu_s += group.gpu_s
            if self.policy.stale_groups == "resample":
                self.resample.append(group.task_id)
        if self.outer_busy is None and self.steps_created < self.cloud.outer_steps:
            plan = plan_batch(
                [GroupView(g.id, g.policy_version) for g in self.groups.values() if g.status == "complete"],
                self.version,
                self.policy.max_steps_off_policy,
                self.cloud.groups_per_batch,
            )
            if plan.batch:
                self.steps_created += 1
                for group_id in plan.batch:
                    self.groups[group_id].status = "batched"
                    self.record.batched_groups.add(group_id)
                staleness = tuple(self.version - self.groups[g].policy_version for g in plan.batch)
                self.step_started[self.steps_created] = (self.now, self.version, staleness)
                self.outer_busy = self.steps_created
                self._schedule(draw_duration(self.cloud.outer, self.cloud.seed, "outer", self.steps_created), OUTER_DONE, self.steps_created)
        self._open_groups()

    def groups_wanted(self) -> int:
        """How many groups to open now (Orchestrator._open_groups; the sync baseline opens one batch when idle)."""
        waiting = sum(1 for g in self.groups.values() if g.status in ("open", "complete"))
        if self.policy.mode == "async":
            needed = (self.cloud.outer_steps - self.steps_created) * self.cloud.groups_per_batch - waiting
            window = groups_to_open(self.active, self.policy.in_flight, self.cloud.group_size)
            return max(0, min(needed, window))
        if self.outer_busy is not None or waiting or self.active or self.steps_created >= self.cloud.outer_steps:
            return 0
        return groups_to_open(self.active, self.cloud.group_size * self.cloud.groups_per_batch, self.cloud.group_size)

    def _open_groups(self) -> None:
        count = self.groups_wanted()
        opened_so_far = len(self.groups)
        for index in range(count):
            task_id = self.resample.pop(0) if self.resample else self.trainable[(opened_so_far + index) % len(self.trainable)]
            group = GroupState(len(self.groups) + 1, task_id, self.version, self.cloud.group_size, opened_at=self.now)
            self.groups[group.id] = group
            for _ in range(self.cloud.group_size):
                episode = EpisodeState(len(self.episodes) + 1, group.id, task_id, self.version)
                self.episodes[episode.id] = episode
                self.active += 1
                self.record.episodes += 1
                self._schedule(draw_duration(self.cloud.agent, self.cloud.seed, "agent", episode.id, 1), AGENT_DONE, episode.id)

    # hand queued work to free workers
    def dispatch(self) -> None:
        """Start queued probes, jobs and evals on free workers, first come first served."""
        while self.free["probe"] and self.waiting["probe"]:
            episode = self.episodes[self.waiting["probe"].popleft()]
            self.free["probe"] -= 1
            seconds = 0.0 if self.policy.mode == "sync-no-probe" else draw_duration(self.cloud.probe, self.cloud.seed, "probe", episode.id, episode.attempt)
            self._schedule(seconds, PROBE_DONE, episode.id)
        while self.free["train"] and self.waiting["train"]:
            episode = self.episodes[self.waiting["train"].popleft()]
            assert episode.submission is not None
            self.free["train"] -= 1
            self.running_jobs[episode.id] = self.now
            duration = self.cloud.invalid_on_gpu if episode.submission.invalid else self.cloud.train
            self._schedule(draw_duration(duration, self.cloud.seed, "train", episode.id), TRAIN_DONE, episode.id)
        while self.free["eval"] and self.waiting["eval"]:
            episode = self.episodes[self.waiting["eval"].popleft()]
            self.free["eval"] -= 1
            self._schedule(draw_duration(self.cloud.eval, self.cloud.seed, "eval", episode.id), EVAL_DONE, episode.id)

    def step(self) -> bool:
        """Serve the next event; False when the run is over (or nothing is left to happen)."""
        if len(self.record.steps) >= self.cloud.outer_steps or not self.queue:
            return False
        event = pop_event(self.queue)
        self.now = event.time
        self.record.events += 1
        self.apply(event)
        self.orchestrate()
        self.dispatch()
        return True

    def run(self, max_events: int = 50_000_000) -> SimRecord:
        """Run to the last outer update; returns the record."""
        self.orchestrate()
        self.dispatch()
        while self.step():
            if self.record.events > max_events:
                raise RuntimeError(f"simulation did not finish within {max_events} events")
        if len(self.record.steps) < self.cloud.outer_steps:
            raise RuntimeError(f"simulation stalled after {len(self.record.steps)} of {self.cloud.outer_steps} outer steps")
        self.record.makespan_s = self.now
        return self.record


# -- metrics (pure) -------------------------------------------------------------------------------


def busy_fraction(busy_s: float, pods: int, makespan_s: float) -> float:
    """Share of the pods' time spent running jobs."""
    if pods <= 0 or makespan_s <= 0:
        raise ValueError("pods and makespan must be positive")
    return busy_s / (pods * makespan_s)


def steps_per_hour(steps: int, makespan_s: float) -> float:
    """Outer updates per simulated hour."""
    if makespan_s <= 0:
        raise ValueError("makespan must be positive")
    return steps / (makespan_s / 3600.0)


def pod_usd(pod_seconds: float, usd_per_pod_hour: float) -> float:
    """Dollars for some pod-seconds."""
    return pod_seconds / 3600.0 * usd_per_pod_hour


def per_item(total: float, count: int) -> float:
    """total / count, NaN when count is 0."""
    return total / count if count else float("nan")


class Metrics(BaseModel):
    """What the benchmark reports for one simulated run."""

    model_config = ConfigDict(extra="forbid")

    mode: str = Field(min_length=1, max_length=32, description="Policy")
    makespan_h: float = Field(ge=0.0, description="Simulated hours to the last outer update")
    outer_steps: int = Field(ge=0, description="Outer updates done")
    steps_per_hour: float = Field(ge=0.0, description="Outer updates per simulated hour")
    busy_fraction: float = Field(ge=0.0, le=1.0, description="Pod busy time / (pods x makespan)")
    useful_fraction: float = Field(ge=0.0, le=1.0, description="Like busy_fraction, without pod time on groups later dropped as stale")
    episodes: int = Field(ge=0, description="Episodes opened")
    jobs_on_gpu: int = Field(ge=0, description="Jobs that got a pod")
    jobs_succeeded: int = Field(ge=0, description="Jobs that trained successfully")
    jobs_failed_on_gpu: int = Field(ge=0, description="Jobs that failed after reaching a pod")
    invalid_jobs_on_gpu: int = Field(ge=0, description="Jobs generated invalid that reached a pod (the probe should have stopped them)")
    pool_usd: float = Field(ge=0.0, description="Pods billed for the whole run (warm pool)")
    busy_usd: float = Field(ge=0.0, description="Pods billed only while running a job")
    usd_per_successful_job: float = Field(description="pool_usd / jobs_succeeded")
    busy_usd_per_successful_job: float = Field(description="busy_usd / jobs_succeeded")
    jobs_used: int = Field(ge=0, description="Successful jobs whose group went into an outer update")
    usd_per_used_job: float = Field(description="pool_usd / jobs_used")
    failed_gpu_usd: float = Field(ge=0.0, description="Dollars of pod time on jobs that failed after reaching a pod")
    invalid_gpu_usd: float = Field(ge=0.0, description="Part of failed_gpu_usd on jobs the probe should have stopped")
    invalid_gpu_s: float = Field(ge=0.0, description="Pod seconds on jobs the probe should have stopped")
    probe_rejections: int = Field(ge=0, description="Submissions the probe sent back")
    unvalidated: int = Field(ge=0, description="Episodes that hit the probe retry cap")
    dropped_groups: int = Field(ge=0, description="Complete groups dropped as too stale")
    dropped_gpu_usd: float = Field(ge=0.0, description="Pod dollars spent on groups later dropped as stale")
    max_staleness: int = Field(ge=0, description="Largest staleness of a batched group")
    mean_staleness: float = Field(ge=0.0, description="Mean staleness of batched groups")


def summarize(record: SimRecord, usd_per_pod_hour: float) -> Metrics:
    """The reported numbers of one simulated run."""
    busy = sum(job.seconds for job in record.jobs)
    failed = [job for job in record.jobs if not job.succeeded]
    invalid = [job for job in record.jobs if job.invalid]
    succeeded = sum(job.succeeded for job in record.jobs)
    used = sum(job.succeeded and job.group_id in record.batched_groups for job in record.jobs)
    staleness = [s for step in record.steps for s in step.staleness]
    pool = pod_usd(record.pods * record.makespan_s, usd_per_pod_hour)
    busy_usd = pod_usd(busy, usd_per_pod_hour)
    return Metrics(
        mode=record.mode,
        makespan_h=record.makespan_s / 3600.0,
        outer_steps=len(record.steps),
        steps_per_hour=steps_per_hour(len(record.steps), record.makespan_s),
        busy_fraction=busy_fraction(busy, record.pods, record.makespan_s),
        useful_fraction=busy_fraction(busy - record.dropped_gpu_s, record.pods, record.makespan_s),
        episodes=record.episodes,
        jobs_on_gpu=len(record.jobs),
        jobs_succeeded=succeeded,
        jobs_failed_on_gpu=len(failed),
        invalid_jobs_on_gpu=len(invalid),
        pool_usd=pool,
        busy_usd=busy_usd,
        usd_per_successful_job=per_item(pool, succeeded),
        busy_usd_per_successful_job=per_item(busy_usd, succeeded),
        jobs_used=used,
        usd_per_used_job=per_item(pool, used),
        failed_gpu_usd=pod_usd(sum(job.seconds for job in failed), usd_per_pod_hour),
        invalid_gpu_usd=pod_usd(sum(job.seconds for job in invalid), usd_per_pod_hour),
        invalid_gpu_s=sum(job.seconds for job in invalid),
        probe_rejections=record.probe_rejections,
        unvalidated=record.unvalidated,
        dropped_groups=record.dropped_groups,
        dropped_gpu_usd=pod_usd(record.dropped_gpu_s, usd_per_pod_hour),
        max_staleness=max(staleness, default=0),
        mean_staleness=sum(staleness) / len(staleness) if staleness else 0.0,
    )


def record_digest(record: SimRecord) -> str:
    """A short fingerprint of a run's jobs and steps: the same seed and settings give the same digest."""
    import hashlib

    digest = hashlib.sha256()
    for job in record.jobs:
        digest.update(f"{job.episode_id}:{job.start:.6f}:{job.end:.6f}:{job.invalid}:{job.succeeded};".encode())
    for step in record.steps:
        digest.update(f"{step.step}:{step.created_at:.6f}:{step.done_at:.6f}:{step.staleness};".encode())
    return digest.hexdigest()[:12]
