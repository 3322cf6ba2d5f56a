"""The base-score cache shared by the eval stage and the agent's baseline_score tool (real PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, select

from metarl.backends.base import Score
from metarl.backends.sim import SimEval
from metarl.baselines import baseline_lookup, baseline_score
from metarl.db import session_scope
from metarl.workspace import Workspace
from schemas.base import load_toml_model
from schemas.records import BaselineScore
from schemas.run_config import SimEvalBackend
from schemas.task_spec import TaskSpec

REPO = Path(__file__).resolve().parents[2]
TASK = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")


class CountingEval(SimEval):
    """The simulator's evaluator, counting how often it is asked to score a base model."""

    def __init__(self) -> None:
        super().__init__(SimEvalBackend(type="sim"))
        self.base_calls = 0

    def score_base(self, task: TaskSpec, model_name: str) -> Score:
        self.base_calls += 1
        return super().score_base(task, model_name)


def stored_rows(url: str) -> int:
    with session_scope(url) as session:
        return session.execute(select(func.count()).select_from(BaselineScore)).scalar_one()


def test_first_lookup_measures_and_stores_then_the_cache_answers(pg_url: str) -> None:
    evaluator = CountingEval()
    model = TASK.budget.allowed_models[0]
    first = baseline_score(pg_url, TASK, model, evaluator)
    second = baseline_score(pg_url, TASK, model, evaluator)
    assert first == second == SimEval(SimEvalBackend(type="sim")).score_base(TASK, model).score
    assert evaluator.base_calls == 1
    assert stored_rows(pg_url) == 1


def test_workspace_tool_returns_the_cached_score_and_builds_no_backend_when_cached(pg_url: str, tmp_path: Path) -> None:
    model = TASK.budget.allowed_models[0]
    measured = baseline_score(pg_url, TASK, model, CountingEval())
    built: list[CountingEval] = []

    def factory() -> CountingEval:
        built.append(CountingEval())
        return built[-1]

    workspace = Workspace(tmp_path / "ws", TASK, baseline=baseline_lookup(pg_url, TASK, factory))
    result = workspace.baseline_score(model)
    assert result.ok and result.result == {"model": model, "score": measured}
    assert [evaluator.base_calls for evaluator in built] == [0]
    refused = workspace.baseline_score("not-a-model")
    assert not refused.ok and stored_rows(pg_url) == 1
