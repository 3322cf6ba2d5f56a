"""The base-score cache shared by the eval stage and the agent's baseline_score tool (real PostgreSQL).

A stored score is reused only for the same key: another model build, scale, pass@k, eval size,
scorer or backend measures again (`metarl.store.baselines`, migration 0010).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from metarl import composition as registry
from metarl.backends.sim.config import SimEvalBackend
from metarl.backends.sim.simulator import SimEval
from metarl.interfaces import Score
from metarl.learning import models
from metarl.store.baselines import baseline_lookup, baseline_score, cached_baseline
from metarl.store.db import session_scope
from metarl.store.records import BaselineScore
from metarl.workspace import Workspace
from schemas.base import load_toml_model
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
TASK = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")
MODEL = TASK.budget.allowed_models[0]


class CountingEval(SimEval):
    """The simulator's evaluator, counting how often it is asked to score a base model; `offset` tells its measurements apart."""

    def __init__(self, offset: float = 0.0) -> None:
        super().__init__(SimEvalBackend(type="sim"))
        self.base_calls = 0
        self.offset = offset

    def score_base(self, task: TaskSpec, model_name: str) -> Score:
        self.base_calls += 1
        measured = super().score_base(task, model_name)
        return measured.model_copy(update={"score": round(measured.score + self.offset, 4)})


def run_config(eval_backend: dict[str, Any]) -> RunConfig:
    """The simulator example with this eval backend, and local training where it scores local checkpoints (docs/backends.md, the matrix)."""
    data = tomllib.loads((REPO / "examples" / "sim.toml").read_text())
    data["backends"]["eval"] = eval_backend
    if eval_backend["type"] != "sim":
        data["backends"]["train"] = {"type": "local", "model_scale": eval_backend.get("model_scale", 1.0)}
    return RunConfig.model_validate(data)


SIM = run_config({"type": "sim"})
LOCAL = run_config({"type": "local", "model_scale": 1.0})


def with_hidden_eval(**changes: Any) -> TaskSpec:
    return TASK.model_copy(update={"hidden_eval": TASK.hidden_eval.model_copy(update=changes)})


def stored_rows(url: str) -> int:
    with session_scope(url) as session:
        return session.execute(select(func.count()).select_from(BaselineScore)).scalar_one()


def test_first_lookup_measures_and_stores_then_the_cache_answers(pg_url: str) -> None:
    evaluator = CountingEval()
    key = registry.base_score_key(SIM, TASK, MODEL)
    first = baseline_score(pg_url, key, TASK, evaluator)
    second = baseline_score(pg_url, key, TASK, evaluator)
    assert first == second == SimEval(SimEvalBackend(type="sim")).score_base(TASK, MODEL).score
    assert evaluator.base_calls == 1
    assert stored_rows(pg_url) == 1


def test_workspace_tool_returns_the_cached_score_and_builds_no_backend_when_cached(pg_url: str, tmp_path: Path) -> None:
    measured = baseline_score(pg_url, registry.base_score_key(SIM, TASK, MODEL), TASK, CountingEval())
    built: list[CountingEval] = []

    def factory() -> CountingEval:
        built.append(CountingEval())
        return built[-1]

    lookup = baseline_lookup(pg_url, TASK, lambda model: registry.base_score_key(SIM, TASK, model), factory)
    workspace = Workspace(tmp_path / "ws", TASK, baseline=lookup)
    result = workspace.baseline_score(MODEL)
    assert result.ok and result.result == {"model": MODEL, "score": measured}
    assert built == []
    refused = workspace.baseline_score("not-a-model")
    assert not refused.ok and stored_rows(pg_url) == 1


def test_a_rebuilt_model_or_another_scale_pass_k_size_or_scorer_measures_again(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each change below is a new key: the eval stage's read finds nothing, the old row stays for the old key.
    Nothing is built: a stand-in's build identity is a hash of what it would be built from."""
    first = CountingEval(offset=0.0)
    original = registry.base_score_key(LOCAL, TASK, MODEL)
    assert baseline_score(pg_url, original, TASK, first) == first.score_base(TASK, MODEL).score

    changed_keys = {
        "scale": registry.base_score_key(run_config({"type": "local", "model_scale": 0.5}), TASK, MODEL),
        "pass_k": registry.base_score_key(LOCAL, with_hidden_eval(pass_k=4), MODEL),
        "eval size": registry.base_score_key(LOCAL, with_hidden_eval(n_items=100), MODEL),
        "sampling seed": registry.base_score_key(run_config({"type": "local", "model_scale": 1.0, "seed": 7}), TASK, MODEL),
        "vllm engine": registry.base_score_key(run_config({"type": "vllm", "model_scale": 1.0}), TASK, MODEL),
        "simulator": registry.base_score_key(SIM, TASK, MODEL),
    }
    monkeypatch.setattr(models, "RECIPE_VERSION", models.RECIPE_VERSION + "-rebuilt")
    changed_keys["recipe"] = registry.base_score_key(LOCAL, TASK, MODEL)
    monkeypatch.undo()
    monkeypatch.setattr(models, "CHARACTERS", models.CHARACTERS + "~")
    changed_keys["tokenizer"] = registry.base_score_key(LOCAL, TASK, MODEL)
    monkeypatch.undo()
    assert registry.base_score_key(LOCAL, TASK, MODEL) == original  # undone: the same build again

    for offset, (change, key) in enumerate(changed_keys.items(), start=1):
        assert key != original, change
        evaluator = CountingEval(offset=offset / 100)
        with session_scope(pg_url) as session:
            assert cached_baseline(session, key) is None, f"{change}: the old score was found"
        assert baseline_score(pg_url, key, TASK, evaluator) == evaluator.score_base(TASK, MODEL).score, change
        assert evaluator.base_calls == 2, change  # measured once for the cache, once above for the comparison
    assert stored_rows(pg_url) == 1 + len(changed_keys)
    with session_scope(pg_url) as session:
        assert cached_baseline(session, original) == first.score_base(TASK, MODEL).score
        stored = session.execute(select(BaselineScore).where(BaselineScore.model_scale == 0.5)).scalar_one()
        assert stored.model_build == models.base_model_build(MODEL, 0.5) and stored.model_build.startswith("local-s-")


def test_the_build_identity_follows_what_the_weights_are_made_of(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit-level: families/tokenizer/recipe/scale change the build; the hub name and the local name are the same build."""
    base = models.base_model_build("Qwen/Qwen3-0.6B", 1.0)
    assert base == models.base_model_build("local-s", 1.0) != models.base_model_build("local-l", 1.0)
    assert models.base_model_build("local-s", 0.25) != base
    monkeypatch.setattr(models, "source_digest", lambda: "edited families.py")
    assert models.base_model_build("local-s", 1.0) != base
