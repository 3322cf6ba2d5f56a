"""The states of a run's records, as plain enums: what the database stores in its status and stage columns.

Apart from the SQLAlchemy models (`metarl.store.records` re-exports them), so that a reader of the
records that does not load the models (`metarl status`) can name them.
"""

from __future__ import annotations

import enum


class RunStatus(str, enum.Enum):
    """Lifecycle of a run."""

    running = "running"
    stopping = "stopping"
    stopped = "stopped"
    finished = "finished"
    failed = "failed"
    paused = "paused"
    """A platform fault stopped it (the message says which and the fix); `metarl resume` or `metarl run` continues it."""
    interrupted = "interrupted"
    """Its orchestrator was stopped (Ctrl-C, SIGTERM); stages in flight finish, `metarl resume` or `metarl run` continues it."""


ENDED_RUN_STATUSES: tuple[RunStatus, ...] = (RunStatus.stopped, RunStatus.finished, RunStatus.failed, RunStatus.paused)
"""The statuses of a run that has ended: no tick, stage or outer step works for it any more (`metarl resume`
may start a stopped, paused or failed one again). The one definition of "run ended", for Python and SQL alike."""

DRIVEN_RUN_STATUSES: tuple[RunStatus, ...] = (RunStatus.running, RunStatus.stopping)
"""The statuses of a run an orchestrator is driving: only such a run can be marked interrupted, and its inner jobs
hold a train backend's slots (`metarl_inner_job_holds_slot`, migration 0015; so does a job a worker still polls)."""

RESUMABLE_RUN_STATUSES: tuple[RunStatus, ...] = (RunStatus.running, RunStatus.stopping, RunStatus.interrupted, RunStatus.paused)
"""The statuses of an unfinished run that `metarl run CONFIG` takes up again instead of starting a second run of the same name."""


class Stage(str, enum.Enum):
    """Where an episode is. `done` and `failed` are terminal."""

    agent = "agent"
    probe = "probe"
    train = "train"
    eval = "eval"
    done = "done"
    failed = "failed"


class StageOutcome(str, enum.Enum):
    """What one run of a stage task (or the outer update) did: the Celery result of the task, for Flower and the logs."""

    skipped = "skipped"
    """The message was stale: the episode is elsewhere, or its claim is another worker's."""
    abandoned = "abandoned"
    """The run stopped or the episode's group was dropped while the stage ran; nothing was recorded."""
    taken_over = "taken over"
    """Another worker took the claim over while this one worked; its result was discarded."""
    submitted = "submitted"
    passed = "passed"
    rejected = "rejected"
    polling = "polling"
    """The inner job runs: the stage polls it again later."""
    budget = "budget"
    """The run's budget left no room to launch the inner job."""
    failed = "failed"
    succeeded = "succeeded"
    lost = "lost"
    terminated = "terminated"
    """An inner job ended so (the train stage's outcome is its job's ended status)."""
    scored = "scored"
    updated = "updated"
    missing = "missing"
    """No such outer step."""


class ClaimStatus(str, enum.Enum):
    """State of one worker's claim on one stage attempt."""

    running = "running"
    done = "done"
    failed = "failed"
    abandoned = "abandoned"
    pending = "pending"
    """Given back by a worker that could not work it for a platform fault: the next claim takes it without a takeover."""


class GroupStatus(str, enum.Enum):
    """Lifecycle of a group of episodes."""

    open = "open"
    complete = "complete"
    batched = "batched"
    dropped = "dropped"
    evaluated = "evaluated"


class OuterStatus(str, enum.Enum):
    """Lifecycle of an outer update."""

    pending = "pending"
    running = "running"
    done = "done"
    failed = "failed"


class InnerJobStatus(str, enum.Enum):
    """Lifecycle of an inner training job, mapped from each backend's own statuses."""

    launching = "launching"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    lost = "lost"
    terminated = "terminated"


SLOT_HOLDING_JOB_STATUSES: tuple[InnerJobStatus, ...] = (InnerJobStatus.launching, InnerJobStatus.running)
"""The statuses of an inner job that holds one of its train backend's slots, while its run is driven or a worker polls it
(`metarl_inner_job_holds_slot`, migration 0015; the progress display's train slots, metarl/store/progress.py)."""
