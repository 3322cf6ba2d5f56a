"""Records written as CTEs of a stage's move or heartbeat statement: names and parameters never clash."""

from __future__ import annotations

import dataclasses

import pytest

from metarl.store.stage_records import WHEN_HELD, StageRecord, record_ctes, verdict_record


def test_each_records_parameters_are_renamed_after_it() -> None:
    ctes, params = record_ctes(
        [
            StageRecord("polled", "UPDATE inner_jobs SET status = %(status)s WHERE episode_id = %(episode_id)s", {"status": "succeeded", "episode_id": 7}),
            StageRecord("charge_0", "INSERT INTO cost_ledger (episode_id, source) VALUES (%(episode_id)s, %(source)s)", {"episode_id": 7, "source": "sim"}),
        ]
    )
    assert ctes == [
        "polled AS (UPDATE inner_jobs SET status = %(polled__status)s WHERE episode_id = %(polled__episode_id)s)",
        "charge_0 AS (INSERT INTO cost_ledger (episode_id, source) VALUES (%(charge_0__episode_id)s, %(charge_0__source)s))",
    ]
    assert params == {"polled__status": "succeeded", "polled__episode_id": 7, "charge_0__episode_id": 7, "charge_0__source": "sim"}


def test_the_same_records_give_the_same_text_and_conditions_stay() -> None:
    record = StageRecord("verdict", f"UPDATE probe_attempts SET passed = %(passed)s WHERE {WHEN_HELD}", {"passed": True})
    first, _ = record_ctes([record])
    again, params = record_ctes([dataclasses.replace(record, params={"passed": False})])
    assert first == again and WHEN_HELD in first[0] and params == {"verdict__passed": False}


def test_two_records_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct names"):
        record_ctes([StageRecord("charge", "SELECT %(a)s", {"a": 1}), StageRecord("charge", "SELECT %(a)s", {"a": 2})])


@pytest.mark.parametrize("name", ["", "Charge", "0charge", "charge-0", "charge; DROP TABLE runs"])
def test_a_record_is_named_by_a_lower_case_sql_identifier(name: str) -> None:
    with pytest.raises(ValueError, match="lower-case SQL identifier"):
        StageRecord(name, "SELECT 1", {})


def test_a_record_is_a_frozen_value() -> None:
    record = verdict_record(
        episode_id=3, attempt=1, passed=True, errors=[], probe_seconds=0.5, model_name=None, explicit_hyperparameters=None, isolation="process"
    )
    assert (record.name, record.params["episode_id"], WHEN_HELD in record.sql) == ("verdict", 3, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.name = "other"  # type: ignore[misc]


def test_no_records_give_no_text() -> None:
    assert record_ctes([]) == ([], {})
