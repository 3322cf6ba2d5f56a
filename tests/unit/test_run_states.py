"""The one definition of "run ended" (schemas.states.ENDED_RUN_STATUSES) and the SQL built from it."""

from __future__ import annotations

from metarl.store.episodes import ENDED_ARRAY
from schemas.states import ENDED_RUN_STATUSES, RESUMABLE_RUN_STATUSES, RunStatus


def test_a_run_has_ended_when_stopped_finished_failed_or_paused() -> None:
    assert set(ENDED_RUN_STATUSES) == {RunStatus.stopped, RunStatus.finished, RunStatus.failed, RunStatus.paused}
    # a stopping or interrupted run still finishes the work in flight: it has not ended
    assert not {RunStatus.stopping, RunStatus.running, RunStatus.interrupted} & set(ENDED_RUN_STATUSES)
    assert len(set(ENDED_RUN_STATUSES)) == len(ENDED_RUN_STATUSES)


def test_run_config_again_continues_exactly_the_unfinished_statuses() -> None:
    assert set(RESUMABLE_RUN_STATUSES) == {RunStatus.running, RunStatus.stopping, RunStatus.interrupted, RunStatus.paused}
    assert not {RunStatus.finished, RunStatus.stopped, RunStatus.failed} & set(RESUMABLE_RUN_STATUSES)


def test_the_stage_claim_sql_refuses_exactly_the_ended_statuses() -> None:
    quoted = {status.value for status in RunStatus if f"'{status.value}'" in ENDED_ARRAY}
    assert quoted == {status.value for status in ENDED_RUN_STATUSES}
