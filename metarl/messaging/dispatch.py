"""Sending stage work to the queues: ids only, JSON only."""

from __future__ import annotations

from celery import Celery

from schemas.states import Stage

STAGE_TASKS = {
    Stage.agent: ("metarl.stage.agent", "agent"),
    Stage.probe: ("metarl.stage.probe", "probe"),
    Stage.train: ("metarl.stage.train", "train"),
    Stage.eval: ("metarl.stage.eval", "eval"),
}
OUTER_TASK = ("metarl.outer.update", "outer")


def send_stage(
    app: Celery, stage: Stage, episode_id: int, probe_attempt: int, *, token: str | None = None, countdown: float | None = None, time_limit: float | None = None
) -> None:
    """Send one stage message; `time_limit` is its hard wall-clock limit (the run's `deadlines`), kept by Celery across retries."""
    name, queue = STAGE_TASKS[stage]
    app.send_task(name, args=[episode_id, probe_attempt], kwargs={"token": token} if token else {}, queue=queue, countdown=countdown, time_limit=time_limit)


def send_outer(app: Celery, outer_step_id: int, *, time_limit: float | None = None) -> None:
    name, queue = OUTER_TASK
    app.send_task(name, args=[outer_step_id], queue=queue, time_limit=time_limit)
