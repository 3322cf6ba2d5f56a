"""Pure parts of the inner-job records: names, the creation's answer, the limits a train claim creates under."""

from __future__ import annotations

import datetime as dt

from metarl.store.inner_jobs import InnerJobLimits, creation_outcome, inner_job_name, inner_job_name_prefix
from metarl.store.records import InnerJobStatus

RUN_ID = "0123456789abcdef-run"


def test_a_job_name_is_its_runs_prefix_and_the_episode():
    assert inner_job_name(RUN_ID, 42) == "metarl-01234567-42"
    assert inner_job_name(RUN_ID, 42).startswith(inner_job_name_prefix(RUN_ID))
    assert inner_job_name(RUN_ID, 4) != inner_job_name(RUN_ID, 42)


def test_the_creation_answer_names_the_cap_that_stopped_it_budget_first():
    assert creation_outcome(10.0, None, name="n", backend="sim", max_usd=10.0) == "budget"
    assert creation_outcome(9.99, None, name="n", backend="sim", max_usd=10.0) == "capacity"
    created = creation_outcome(0.0, 7, name="n", backend="sim", max_usd=10.0)
    assert not isinstance(created, str)
    assert (created.id, created.name, created.backend, created.status, created.external_id) == (7, "n", "sim", InnerJobStatus.launching, None)


def test_the_limits_parameters_name_the_run_and_its_job_prefix():
    created_at = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
    limits = InnerJobLimits(run_id=RUN_ID, run_created_at=created_at, backend="runpod", simulated=False, max_usd=50.0, capacity=16, max_stage_attempts=3)
    params = limits.params()
    assert params["limits_run_id"] == RUN_ID and params["limits_run_created_at"] == created_at
    assert params["name_prefix"] + "42" == inner_job_name(RUN_ID, 42)
    assert (params["backend"], params["simulated"], params["max_usd"], params["capacity"], params["max_stage_attempts"]) == ("runpod", False, 50.0, 16, 3)
