"""Grow a run by copying its finished records: how `bench.scale` reaches 100,000 episodes without running them all.

Every finished group is copied with its episodes, stage claims, submissions, inner jobs,
evaluations, rewards, cost-ledger lines, outer steps and policy versions, in SQL (INSERT ... SELECT
from temporary tables holding the template rows, read once). Each copy gets new ids (offset past
the existing ones), outer-step and policy-version numbers shifted past the template's steps, and
suffixed unique keys (inner-job names and external ids, idempotency keys). Every column of the
records is copied: the column lists come from the records' tables (`metarl.store.records`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CursorResult, Table, text

from metarl.store.db import get_engine
from metarl.store.records import Base, CostEntry, Episode, EpisodeGroup, Evaluation, InnerJob, OuterStep, PolicyVersion, ProbeAttempt, Reward, StageClaim


def table_of(record: type[Base]) -> Table:
    """The table of a record class."""
    table = record.__table__
    assert isinstance(table, Table)
    return table


FINISHED_GROUPS = ("batched", "evaluated", "dropped")
"""Group statuses copied: groups no stage or outer step will change again."""

EPISODE_CHILDREN: tuple[Table, ...] = tuple(table_of(record) for record in (StageClaim, ProbeAttempt, InnerJob, Evaluation, Reward, CostEntry))
"""Tables whose rows belong to one episode (`episode_id`)."""

SHIFTED = "{column} + :shift"
NEW_ID = "id + :o"
OF_EPISODE = "episode_id + :oe"

COPIES: tuple[tuple[Table, Mapping[str, str]], ...] = (
    (table_of(OuterStep), {"id": NEW_ID, "step": SHIFTED, "policy_version_before": SHIFTED, "policy_version_after": SHIFTED}),
    (table_of(PolicyVersion), {"id": NEW_ID, "version": SHIFTED, "outer_step_id": "outer_step_id + :os"}),
    (table_of(EpisodeGroup), {"id": NEW_ID, "policy_version": SHIFTED, "outer_step_id": "outer_step_id + :os"}),
    (table_of(Episode), {"id": NEW_ID, "group_id": "group_id + :og", "policy_version": SHIFTED}),
    (table_of(StageClaim), {"id": NEW_ID, "episode_id": OF_EPISODE}),
    (table_of(ProbeAttempt), {"id": NEW_ID, "episode_id": OF_EPISODE}),
    (table_of(InnerJob), {"id": NEW_ID, "episode_id": OF_EPISODE, "name": "name || '-x' || :r", "external_id": "external_id || '-x' || :r"}),
    (table_of(Evaluation), {"id": NEW_ID, "episode_id": OF_EPISODE}),
    (table_of(Reward), {"id": NEW_ID, "episode_id": OF_EPISODE}),
    (table_of(CostEntry), {"id": NEW_ID, "episode_id": OF_EPISODE, "idempotency_key": "idempotency_key || '#x' || :r"}),
)
"""Each copied table (in insert order: a row's references first) and the expressions of the columns a copy changes."""


def copy_statement(table: Table, changed: Mapping[str, str]) -> str:
    """INSERT ... SELECT of every column of `table` from its template `t_<table>`, `changed` columns by their expressions (pure).

    Parameters: `:o` (this table's id offset), `:os`, `:og`, `:oe` (the outer steps', groups' and
    episodes' offsets), `:shift` (steps and versions) and `:r` (the copy's number).
    """
    columns = [column.name for column in table.c]
    unknown = sorted(set(changed) - set(columns))
    if unknown:
        raise ValueError(f"{table.name} has no column(s) {', '.join(unknown)}")
    values = [changed[name].format(column=name) if name in changed else name for name in columns]
    return f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {', '.join(values)} FROM t_{table.name}"


@dataclass(frozen=True)
class Replication:
    """What :func:`replicate_finished_records` added."""

    copies: int
    episodes_added: int


def replicate_finished_records(database_url: str, run_id: str, target_episodes: int) -> Replication:
    """Copy the run's finished records until it has at least `target_episodes` episodes, in one transaction.

    The run's outer steps must be 1..n, all done. Its policy version moves past the copies' versions.
    """
    with get_engine(database_url).begin() as connection:

        def run(sql: str, **params: object) -> CursorResult[Any]:
            return connection.execute(text(sql), params)

        steps = run("SELECT count(*), coalesce(max(step), 0) FROM outer_steps WHERE run_id = :run AND status = 'done'", run=run_id).one()
        done_steps, max_step = (int(value) for value in steps)
        if done_steps == 0 or done_steps != max_step:
            raise RuntimeError(f"replicating needs outer steps 1..n all done; found {done_steps} done, max step {max_step}")
        finished = ", ".join(f"'{status}'" for status in FINISHED_GROUPS)
        run(f"CREATE TEMP TABLE t_episode_groups ON COMMIT DROP AS SELECT * FROM episode_groups WHERE run_id = :run AND status IN ({finished})", run=run_id)
        run("CREATE TEMP TABLE t_episodes ON COMMIT DROP AS SELECT * FROM episodes WHERE group_id IN (SELECT id FROM t_episode_groups)")
        for table in EPISODE_CHILDREN:
            run(f"CREATE TEMP TABLE t_{table.name} ON COMMIT DROP AS SELECT * FROM {table.name} WHERE episode_id IN (SELECT id FROM t_episodes)")
        run("CREATE TEMP TABLE t_outer_steps ON COMMIT DROP AS SELECT * FROM outer_steps WHERE run_id = :run AND step <= :steps", run=run_id, steps=done_steps)
        run(
            "CREATE TEMP TABLE t_policy_versions ON COMMIT DROP AS SELECT * FROM policy_versions WHERE run_id = :run AND version BETWEEN 1 AND :steps",
            run=run_id,
            steps=done_steps,
        )
        per_copy = int(run("SELECT count(*) FROM t_episodes").scalar_one())
        have = int(run("SELECT count(*) FROM episodes WHERE run_id = :run", run=run_id).scalar_one())
        copies = max(0, math.ceil((target_episodes - have) / per_copy)) if per_copy else 0
        offsets = {table.name: int(run(f"SELECT coalesce(max(id), 0) FROM {table.name}").scalar_one()) for table, _ in COPIES}
        statements = [(table.name, copy_statement(table, changed)) for table, changed in COPIES]
        for r in range(1, copies + 1):
            moved = {name: offset * r for name, offset in offsets.items()}
            for name, statement in statements:
                run(statement, o=moved[name], os=moved["outer_steps"], og=moved["episode_groups"], oe=moved["episodes"], shift=done_steps * r, r=r)
        for name, offset in offsets.items():
            run(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), :v)", v=max(1, offset * (copies + 1)))
        if copies:
            run("UPDATE runs SET policy_version = policy_version + :shift WHERE id = :run", shift=done_steps * copies, run=run_id)
    return Replication(copies, copies * per_copy)
