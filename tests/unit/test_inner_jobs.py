"""Pure parts of the inner-job records: names and the creation's answer."""

from __future__ import annotations

from metarl.store.inner_jobs import creation_outcome, inner_job_name, inner_job_name_prefix
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
