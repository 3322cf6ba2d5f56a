"""Base-model scores on a task's hidden eval, cached per `BaseScoreKey`: everything a score depends on.

The eval stage and the agent's ``baseline_score`` tool share this cache: whichever asks first
measures the score with the eval backend and stores it; everyone after reads the stored row.
The key holds the task, the model name and the built model's identity (for a local stand-in the
content hash of its build: families, tokenizer, recipe, scale), the hidden eval's version, size and
pass@k, the grader, the eval backend and its scorer settings, so a rebuilt model or another scale
never reuses an old score (migration 0010). Only the score leaves this module, never an eval item.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from metarl.interfaces import BaseModelIdentity, BaseScoreKey, EvalBackend, Score
from metarl.store.columns import checked_columns, insert_lists
from metarl.store.db import SqlTarget, run_sql, session_scope
from metarl.store.records import BaselineScore
from schemas.task_spec import TaskSpec

GRADER_SOURCES = ("families.py", "data_families.py", "scoring.py")
"""Modules of metarl/learning whose source is the families, their hidden evals and the pass@k aggregation: editing them changes the grader's identity."""

BASE_SCORE_KEY_COLUMNS = checked_columns(BaselineScore.__table__, BaseScoreKey.model_fields)
"""The columns of a cached score's key: the fields of `BaseScoreKey` (the table's unique key, migration 0010)."""
CACHED_BASELINE_SQL = f"SELECT score FROM baseline_scores WHERE {' AND '.join(f'{column} = %({column})s' for column in BASE_SCORE_KEY_COLUMNS)}"
STORE_COLUMNS, STORE_VALUES = insert_lists(BaselineScore.__table__, (*BASE_SCORE_KEY_COLUMNS, "score", "ci_low", "ci_high", "n_items"))
STORE_BASELINE_SQL = f"INSERT INTO baseline_scores ({STORE_COLUMNS}) VALUES ({STORE_VALUES}) ON CONFLICT ON CONSTRAINT uq_baseline_scores_key DO NOTHING"
"""Sent as written (`cached_baseline`, `store_baseline`)."""


@functools.cache
def grader_code_digest() -> str:
    """Short hash of the grading code (GRADER_SOURCES), read once per process."""
    folder = Path(__file__).resolve().parents[1] / "learning"
    digest = hashlib.sha256()
    for name in GRADER_SOURCES:
        digest.update(name.encode())
        digest.update((folder / name).read_bytes())
    digest.update((folder.parent / "graders.py").read_bytes())
    return digest.hexdigest()[:12]


def eval_identity(task: TaskSpec) -> str:
    """What the task's hidden eval and grader are, beyond the code: the grader's options, the source of the
    plugin graders it uses, and the hidden eval's file content or, for a generated one, a non-reversible
    fingerprint of the deployment secret."""
    from metarl.learning.data_families import family_for, read_regular_file
    from metarl.learning.eval_secret import active_eval_secret, secret_fingerprint
    from metarl.learning.grader_plugins import grader_sources

    family = family_for(task)
    digest = hashlib.sha256(json.dumps(dict(family.grader), sort_keys=True).encode())
    for name, source in sorted(grader_sources(family.grader).items()):
        digest.update(b"plugin\0" + name.encode() + b"\0" + source)
    if task.hidden_eval.path is not None:
        digest.update(b"file\0" + read_regular_file(Path(task.hidden_eval.path), "hidden_eval.path"))
    else:
        digest.update(b"secret\0" + secret_fingerprint(active_eval_secret()).encode())
    return digest.hexdigest()


def base_score_key(task: TaskSpec, model_name: str, backend_name: str, identity: BaseModelIdentity) -> BaseScoreKey:
    """The key of ``model_name``'s base score on ``task`` with an eval backend and what its score depends on."""
    return BaseScoreKey(
        task_id=task.id,
        model_name=model_name,
        model_build=identity.build,
        model_scale=identity.scale,
        eval_version=task.hidden_eval.version,
        eval_items=task.hidden_eval.n_items,
        pass_k=task.hidden_eval.pass_k,
        grader=f"{task.family[:40]}:{hashlib.sha256((grader_code_digest() + eval_identity(task)).encode()).hexdigest()[:16]}",
        backend=backend_name,
        scorer=identity.scorer,
    )


def cached_baseline(session: SqlTarget, key: BaseScoreKey) -> float | None:
    """The stored base score for ``key``, if any."""
    row = run_sql(session, CACHED_BASELINE_SQL, key.model_dump()).first()
    return None if row is None else float(row[0])


def store_baseline(session: SqlTarget, key: BaseScoreKey, score: Score) -> None:
    """Store a measured base score; a row stored meanwhile by another worker wins (same inputs, same score)."""
    run_sql(session, STORE_BASELINE_SQL, {**key.model_dump(), "score": score.score, "ci_low": score.ci_low, "ci_high": score.ci_high, "n_items": score.n_items})


def store_base_score(database_url: str, key: BaseScoreKey, score: Score) -> None:
    """:func:`store_baseline` in a transaction of its own."""
    with session_scope(database_url) as session:
        store_baseline(session, key, score)


def base_score_cached(database_url: str, key: BaseScoreKey) -> bool:
    """Whether a base score for ``key`` is stored (:func:`cached_baseline`)."""
    with session_scope(database_url) as session:
        return cached_baseline(session, key) is not None


def baseline_score(database_url: str, key: BaseScoreKey, task: TaskSpec, backend: EvalBackend) -> float:
    """The cached base score for ``key``, measured with ``backend`` and stored on first use."""
    with session_scope(database_url) as session:
        cached = cached_baseline(session, key)
    if cached is not None:
        return cached
    measured = backend.score_base(task, key.model_name)
    with session_scope(database_url) as session:
        store_baseline(session, key, measured)
        stored = cached_baseline(session, key)
    return stored if stored is not None else measured.score


def baseline_lookup(
    database_url: str, task: TaskSpec, key_for: Callable[[str], BaseScoreKey], backend_factory: Callable[[], EvalBackend]
) -> Callable[[str], float]:
    """The agent tool's lookup for ``task``: ``key_for(model)`` keys the score; the eval backend is built only if a score must be measured."""
    backends: list[EvalBackend] = []

    def lookup(model_name: str) -> float:
        key = key_for(model_name)
        with session_scope(database_url) as session:
            cached = cached_baseline(session, key)
        if cached is not None:
            return cached
        if not backends:
            backends.append(backend_factory())
        return baseline_score(database_url, key, task, backends[0])

    return lookup
