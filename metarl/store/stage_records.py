"""Database side of what the agent, probe and eval stages store: submissions, verdicts, evaluations.

Each runs once per stage message, so each is sent as written (:func:`metarl.store.db.run_sql`), without
ORM compilation. Inserts are idempotent on their unique keys: a replayed stage stores nothing twice.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metarl.store.columns import assignments, columns_of, insert_lists
from metarl.store.db import SqlTarget, json_param, run_sql
from metarl.store.records import Evaluation, ProbeAttempt

WHEN_HELD = "EXISTS (SELECT 1 FROM held)"
"""The condition a record written with its stage's move carries: the move's locks were taken (`metarl.store.episodes.FINISH_AND_MOVE_SQL`)."""
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class StageRecord:
    """A record written in the same statement as a stage's move or heartbeat, as one of its CTEs.

    A record whose SQL carries `WHEN_HELD` is written only with the move (`metarl.store.episodes.FINISH_AND_MOVE_SQL`);
    one without it (a poll's facts, a charge) is written whether or not the move happens."""

    name: str
    """Its CTE's name in the statement, and the prefix of its parameters there (`<name>__<param>`): distinct among a statement's records."""
    sql: str
    """Its SQL, with `%(param)s` placeholders."""
    params: Mapping[str, Any]
    """Its parameters, by the names its SQL uses."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"a record's name is a lower-case SQL identifier, not {self.name!r}")


@functools.lru_cache(maxsize=256)
def _named_cte(name: str, sql: str) -> str:
    return f"{name} AS ({_PLACEHOLDER.sub(lambda match: f'%({name}__{match[1]})s', sql)})"


def record_ctes(records: Sequence[StageRecord]) -> tuple[list[str], dict[str, Any]]:
    """The records as CTEs (`name AS (sql)`) and their parameters, each renamed `<record>__<param>`.

    So no two records, and no record and the statement around them, share a parameter. The same
    records give the same text (the statement is prepared once per connection).
    """
    names = [record.name for record in records]
    if len(set(names)) != len(names):
        raise ValueError(f"records need distinct names: {names}")
    params = {f"{record.name}__{key}": value for record in records for key, value in record.params.items()}
    return [_named_cte(record.name, record.sql) for record in records], params


def with_records(statement: str, params: dict[str, Any], records: Sequence[StageRecord]) -> tuple[str, dict[str, Any]]:
    """`statement` (one without a WITH of its own) preceded by the records as its CTEs, and the parameters of both."""
    if not records:
        return statement, params
    ctes, record_params = record_ctes(records)
    return f"WITH {', '.join(ctes)}\n{statement}", {**params, **record_params}


def write_records(session: SqlTarget, records: Sequence[StageRecord]) -> None:
    """Write records on their own, in one statement (none of them may carry `WHEN_HELD`)."""
    if records:
        run_sql(session, *with_records("SELECT 1", {}, records))


VERDICT_COLUMNS = ("passed", "errors", "probe_seconds", "model_name", "explicit_hyperparameters", "isolation")
"""What the probe's verdict writes on the attempt (with `probed_at`); the agent's submission writes the attempt's other columns."""
SUBMISSION_COLUMNS, SUBMISSION_VALUES = insert_lists(
    ProbeAttempt.__table__, columns_of(ProbeAttempt.__table__, without=("id", *VERDICT_COLUMNS, "probed_at")), {"submitted_at": "now()"}
)
SUBMISSION_SQL = f"""
INSERT INTO probe_attempts ({SUBMISSION_COLUMNS})
SELECT {SUBMISSION_VALUES}
WHERE {WHEN_HELD}
ON CONFLICT ON CONSTRAINT uq_probe_attempts_episode_id DO NOTHING
"""
VERDICT_SQL = f"""
UPDATE probe_attempts
SET {assignments(ProbeAttempt.__table__, (*VERDICT_COLUMNS, "probed_at"), {"probed_at": "now()"})}
WHERE episode_id = %(episode_id)s AND attempt = %(attempt)s AND {WHEN_HELD}
"""
"""Written with the stage's move, inside its statement (as is EVALUATION_SQL)."""
EVALUATION_COLUMNS, EVALUATION_VALUES = insert_lists(Evaluation.__table__, columns_of(Evaluation.__table__, without=("id",)), {"created_at": "now()"})
EVALUATION_SQL = f"""
INSERT INTO evaluations ({EVALUATION_COLUMNS})
SELECT {EVALUATION_VALUES}
WHERE {WHEN_HELD}
ON CONFLICT ON CONSTRAINT uq_evaluations_episode_id DO NOTHING
"""


def submission_record(
    *,
    episode_id: int,
    run_id: str,
    attempt: int,
    job_toml: str,
    workspace_uri: str | None,
    agent_tokens: int,
    agent_backend: str,
    policy_tokens: list[int] | None,
    behaviour_logprobs: list[float] | None,
    prompt_length: int | None,
) -> StageRecord:
    """One agent submission (its sampled tokens and behaviour logprobs too, for the outer update), written with the agent stage's move."""
    params: dict[str, Any] = {
        "episode_id": episode_id,
        "run_id": run_id,
        "attempt": attempt,
        "job_toml": job_toml,
        "workspace_uri": workspace_uri,
        "agent_tokens": agent_tokens,
        "agent_backend": agent_backend,
        "policy_tokens": json_param(policy_tokens) if policy_tokens is not None else None,
        "behaviour_logprobs": json_param(behaviour_logprobs) if behaviour_logprobs is not None else None,
        "prompt_length": prompt_length,
    }
    return StageRecord("submitted", SUBMISSION_SQL, params)


def verdict_record(
    *,
    episode_id: int,
    attempt: int,
    passed: bool,
    errors: list[dict[str, Any]],
    probe_seconds: float,
    model_name: str | None,
    explicit_hyperparameters: int | None,
    isolation: str | None = None,
) -> StageRecord:
    """The probe's verdict on a submission, written with the probe stage's move (``isolation``: the
    level its environment module ran under, None when none ran)."""
    params = {
        "isolation": isolation,
        "passed": passed,
        "errors": json_param(errors),
        "probe_seconds": probe_seconds,
        "model_name": model_name,
        "explicit_hyperparameters": explicit_hyperparameters,
        "episode_id": episode_id,
        "attempt": attempt,
    }
    return StageRecord("verdict", VERDICT_SQL, params)


def evaluation_record(
    *,
    episode_id: int,
    backend: str,
    simulated: bool,
    base_score: float,
    trained_score: float,
    ci_low: float | None,
    ci_high: float | None,
    n_items: int,
    eval_seconds: float,
) -> StageRecord:
    """The hidden-eval scores of an episode's trained model (and the base score it is compared with), written with the eval stage's move."""
    params = {
        "episode_id": episode_id,
        "backend": backend,
        "simulated": simulated,
        "base_score": base_score,
        "trained_score": trained_score,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "n_items": n_items,
        "eval_seconds": eval_seconds,
    }
    return StageRecord("evaluation", EVALUATION_SQL, params)
