"""Column lists of the SQL text come from the records (`metarl.store.columns`), and the statements built from them list them all."""

from __future__ import annotations

import re

import pytest

from metarl.store.columns import assignments, checked_columns, columns_of, insert_lists
from metarl.store.inner_jobs import INNER_JOB_COLUMNS
from metarl.store.ledger import RECORD_COST_SQL
from metarl.store.records import CostEntry, Evaluation, InnerJob, ProbeAttempt, Reward
from metarl.store.stage_records import EVALUATION_SQL, SUBMISSION_SQL, VERDICT_COLUMNS, VERDICT_SQL

TABLE = CostEntry.__table__


def inserted_columns(sql: str) -> list[str]:
    """The column list of an INSERT statement's text."""
    match = re.search(r"INSERT INTO \w+ \(([^)]*)\)", sql)
    assert match is not None, sql
    return [name.strip() for name in match.group(1).split(",")]


def test_columns_of_keeps_the_records_order_and_rejects_unknown_names() -> None:
    assert columns_of(TABLE)[:3] == ("id", "run_id", "episode_id")
    assert "id" not in columns_of(TABLE, without=("id",))
    with pytest.raises(ValueError, match="cost_ledger has no column nope"):
        columns_of(TABLE, without=("nope",))
    with pytest.raises(ValueError, match="no column amount, kind"):
        checked_columns(TABLE, ("run_id", "amount", "kind"))


def test_insert_lists_name_each_parameter_after_its_column_unless_given() -> None:
    assert insert_lists(TABLE, ("run_id", "created_at"), {"created_at": "now()"}) == ("run_id, created_at", "%(run_id)s, now()")
    with pytest.raises(ValueError, match="not inserted into cost_ledger: source"):
        insert_lists(TABLE, ("run_id",), {"source": "'x'"})
    assert assignments(TABLE, ("unit", "created_at"), {"created_at": "now()"}) == "unit = %(unit)s, created_at = now()"
    with pytest.raises(ValueError, match="has no column units"):
        assignments(TABLE, ("units",))


def test_whole_row_inserts_list_every_column_of_their_record_but_the_id() -> None:
    for sql, record in ((RECORD_COST_SQL, CostEntry), (EVALUATION_SQL, Evaluation)):
        assert inserted_columns(sql) == list(columns_of(record.__table__, without=("id",)))
    from metarl.store.episodes import REWARD_WITH_MOVE_SQL

    assert inserted_columns(REWARD_WITH_MOVE_SQL) == list(columns_of(Reward.__table__, without=("id",)))


def test_a_submission_and_its_verdict_write_every_column_of_the_attempt_between_them() -> None:
    submitted = set(inserted_columns(SUBMISSION_SQL))
    verdict = set(re.findall(r"(\w+) = ", VERDICT_SQL.split("WHERE")[0]))
    assert verdict == {*VERDICT_COLUMNS, "probed_at"}
    assert submitted | verdict == set(columns_of(ProbeAttempt.__table__, without=("id",))) and not submitted & verdict


def test_the_inner_job_read_with_the_stage_row_is_columns_of_the_inner_job() -> None:
    assert set(INNER_JOB_COLUMNS) <= set(columns_of(InnerJob.__table__)) and INNER_JOB_COLUMNS[0] == "id"
