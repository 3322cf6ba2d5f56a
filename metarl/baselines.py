"""Base-model scores on a task's hidden eval, cached per (task, model, eval version, eval backend).

The eval stage and the agent's ``baseline_score`` tool share this cache: whichever asks first
measures the score with the eval backend and stores it; everyone after reads the stored row.
Only the score leaves this module, never an eval item.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from metarl.backends.base import EvalBackend, Score
from metarl.db import SqlTarget, database_identity, run_sql, session_scope
from schemas.records import BaselineScore
from schemas.task_spec import TaskSpec


CACHED_BASELINE_SQL = """
SELECT score FROM baseline_scores
WHERE task_id = %(task_id)s AND model_name = %(model_name)s AND eval_version = %(eval_version)s AND backend = %(backend)s
"""
"""Sent as written, once per process per score (`cached_baseline`)."""


BaselineKey = tuple[tuple[str, int, str], str, str, int, str]
"""(database, task id, model name, hidden-eval version, eval backend): what a base score is measured for, and where it is stored."""
_known_baselines: dict[BaselineKey, float] = {}
"""Base scores this process has read: a stored score never changes (a second store of the same key stores nothing)."""
KNOWN_BASELINES_KEPT = 4096


def cached_baseline(session: SqlTarget, task: TaskSpec, model_name: str, backend_name: str) -> float | None:
    """The stored base score of ``model_name`` on ``task`` for this eval version and backend, if any (read once per process)."""
    key = (database_identity(session), task.id, model_name, task.hidden_eval.version, backend_name)
    known = _known_baselines.get(key)
    if known is not None:
        return known
    params = {"task_id": task.id, "model_name": model_name, "eval_version": task.hidden_eval.version, "backend": backend_name}
    row = run_sql(session, CACHED_BASELINE_SQL, params).first()
    if row is None:
        return None
    if len(_known_baselines) >= KNOWN_BASELINES_KEPT:
        _known_baselines.clear()
    _known_baselines[key] = float(row[0])
    return _known_baselines[key]


def store_baseline(session: Session, task: TaskSpec, model_name: str, backend_name: str, score: Score) -> None:
    """Store a measured base score; a row stored meanwhile by another worker wins (same inputs, same score)."""
    session.execute(
        insert(BaselineScore)
        .values(
            task_id=task.id,
            model_name=model_name,
            eval_version=task.hidden_eval.version,
            backend=backend_name,
            score=score.score,
            ci_low=score.ci_low,
            ci_high=score.ci_high,
            n_items=score.n_items,
        )
        .on_conflict_do_nothing(constraint="uq_baseline_scores_task_id")
    )


def baseline_score(database_url: str, task: TaskSpec, model_name: str, backend: EvalBackend) -> float:
    """The cached base score, measured with ``backend`` and stored on first use."""
    with session_scope(database_url) as session:
        cached = cached_baseline(session, task, model_name, backend.name)
    if cached is not None:
        return cached
    measured = backend.score_base(task, model_name)
    with session_scope(database_url) as session:
        store_baseline(session, task, model_name, backend.name, measured)
        stored = cached_baseline(session, task, model_name, backend.name)
    return stored if stored is not None else measured.score


def baseline_lookup(database_url: str, task: TaskSpec, backend_factory: Callable[[], EvalBackend]) -> Callable[[str], float]:
    """The agent tool's lookup for ``task``: the eval backend is built only if a score must be measured."""
    backends: list[EvalBackend] = []

    def lookup(model_name: str) -> float:
        if not backends:
            backends.append(backend_factory())
        return baseline_score(database_url, task, model_name, backends[0])

    return lookup
