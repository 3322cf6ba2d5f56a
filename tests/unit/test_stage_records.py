"""Records written as CTEs of a stage's move or heartbeat statement: names and parameters never clash."""

from __future__ import annotations

import pytest

from metarl.store.stage_records import WHEN_HELD, record_ctes


def test_each_records_parameters_are_renamed_after_it() -> None:
    ctes, params = record_ctes(
        [
            ("polled", "UPDATE inner_jobs SET status = %(status)s WHERE episode_id = %(episode_id)s", {"status": "succeeded", "episode_id": 7}),
            ("charge_0", "INSERT INTO cost_ledger (episode_id, source) VALUES (%(episode_id)s, %(source)s)", {"episode_id": 7, "source": "sim"}),
        ]
    )
    assert ctes == [
        "polled AS (UPDATE inner_jobs SET status = %(polled__status)s WHERE episode_id = %(polled__episode_id)s)",
        "charge_0 AS (INSERT INTO cost_ledger (episode_id, source) VALUES (%(charge_0__episode_id)s, %(charge_0__source)s))",
    ]
    assert params == {"polled__status": "succeeded", "polled__episode_id": 7, "charge_0__episode_id": 7, "charge_0__source": "sim"}


def test_the_same_records_give_the_same_text_and_conditions_stay() -> None:
    record = ("verdict", f"UPDATE probe_attempts SET passed = %(passed)s WHERE {WHEN_HELD}", {"passed": True})
    first, _ = record_ctes([record])
    again, params = record_ctes([(record[0], record[1], {"passed": False})])
    assert first == again and WHEN_HELD in first[0] and params == {"verdict__passed": False}


def test_two_records_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct names"):
        record_ctes([("charge", "SELECT %(a)s", {"a": 1}), ("charge", "SELECT %(a)s", {"a": 2})])


def test_no_records_give_no_text() -> None:
    assert record_ctes([]) == ([], {})
