"""The one definition of "run ended" (schemas.states.ENDED_RUN_STATUSES) and the SQL built from it."""

from __future__ import annotations

import importlib.util
import re

from metarl.store.episodes import ENDED_ARRAY
from metarl.store.migration_head import MIGRATIONS_DIR
from schemas.states import DRIVEN_RUN_STATUSES, ENDED_RUN_STATUSES, RESUMABLE_RUN_STATUSES, SLOT_HOLDING_JOB_STATUSES, InnerJobStatus, RunStatus


def test_a_run_has_ended_when_stopped_finished_failed_or_paused() -> None:
    assert set(ENDED_RUN_STATUSES) == {RunStatus.stopped, RunStatus.finished, RunStatus.failed, RunStatus.paused}
    # a stopping or interrupted run still finishes the work in flight: it has not ended
    assert not {RunStatus.stopping, RunStatus.running, RunStatus.interrupted} & set(ENDED_RUN_STATUSES)
    assert len(set(ENDED_RUN_STATUSES)) == len(ENDED_RUN_STATUSES)


def test_run_config_again_continues_exactly_the_unfinished_statuses() -> None:
    assert set(RESUMABLE_RUN_STATUSES) == {RunStatus.running, RunStatus.stopping, RunStatus.interrupted, RunStatus.paused}
    assert not {RunStatus.finished, RunStatus.stopped, RunStatus.failed} & set(RESUMABLE_RUN_STATUSES)


def test_the_capacity_count_takes_the_jobs_of_exactly_the_driven_runs_and_the_polled_ones() -> None:
    """Migration 0015's frozen SQL names the statuses of DRIVEN_RUN_STATUSES (no ended or interrupted one) and of SLOT_HOLDING_JOB_STATUSES,
    and the capacity count filters on the job statuses before it asks the per-job rule (the index on status serves it)."""
    spec = importlib.util.spec_from_file_location("migration_0015", MIGRATIONS_DIR / "versions" / "0015_capacity_counts_polled_jobs.py")
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    counted = re.search(r"r\.status IN \(([^)]*)\)", migration.HOLDS_SLOT)
    assert counted is not None
    assert set(re.findall(r"'([a-z]+)'", counted.group(1))) == {status.value for status in DRIVEN_RUN_STATUSES}
    assert not (set(DRIVEN_RUN_STATUSES) & (set(ENDED_RUN_STATUSES) | {RunStatus.interrupted}))
    slot_holding = {status.value for status in SLOT_HOLDING_JOB_STATUSES}
    for sql in (migration.HOLDS_SLOT, migration.CREATE_INNER_JOB):
        held = re.search(r"j\.status IN \(([^)]*)\)", sql)
        assert held is not None
        assert set(re.findall(r"'([a-z]+)'", held.group(1))) == slot_holding
    assert "metarl_inner_job_holds_slot(j.id)" in migration.CREATE_INNER_JOB
    assert InnerJobStatus.succeeded not in SLOT_HOLDING_JOB_STATUSES


def test_the_stage_claim_sql_refuses_exactly_the_ended_statuses() -> None:
    quoted = {status.value for status in RunStatus if f"'{status.value}'" in ENDED_ARRAY}
    assert quoted == {status.value for status in ENDED_RUN_STATUSES}


def test_every_way_an_inner_job_ends_and_every_outer_claim_refusal_is_a_stage_outcome() -> None:
    """The train stage returns its job's ended status as its outcome, the outer update its claim's refusal: each must
    be a StageOutcome, or the task would raise after its work was recorded."""
    from typing import Literal, get_args, get_origin, get_type_hints

    from metarl.store.outer_steps import claim_outer_work
    from schemas.states import InnerJobStatus, StageOutcome

    ended = [status for status in InnerJobStatus if status not in (InnerJobStatus.launching, InnerJobStatus.running)]
    assert ended and all(StageOutcome(status.value).value == status.value for status in ended)
    returned = get_args(get_type_hints(claim_outer_work)["return"])
    refusals = [value for arg in returned if get_origin(arg) is Literal for value in get_args(arg)]
    assert sorted(refusals) == ["missing", "skipped"] and all(StageOutcome(refusal).value == refusal for refusal in refusals)
