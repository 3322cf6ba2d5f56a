"""The base of every stage backend's config model: each vendor folder defines its own (`metarl/backends/<vendor>/config.py`).

A backend config is picked by its `type` inside its stage's table (`[backends.train]`, ...). Its
class attributes say where the vendor's code is, as ``module:name`` paths that are imported only
when that backend is configured (`metarl/composition.py` builds the backend, `metarl/dry_run.py`
asks for its plan), and which run combinations it refuses (`RunConfig` asks at load).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Literal, TypeVar

from pydantic import Field

from schemas.base import FieldProblem, StrictModel

if TYPE_CHECKING:
    from schemas.task_spec import TaskSpec

StageName = Literal["agent", "train", "eval", "outer"]
STAGE_NAMES: tuple[StageName, ...] = ("agent", "train", "eval", "outer")
ConfigT = TypeVar("ConfigT", bound="BackendConfig")


class BackendConfig(StrictModel):
    """Settings of one stage's backend; a vendor's subclass narrows `type` to its own literal."""

    type: str = Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_]*$", description="Backend kind")

    stage: ClassVar[StageName]
    backend_class: ClassVar[str]
    """``module:Class`` of the backend; the class builds itself with ``from_run_config(config, services)``."""
    planner: ClassVar[str]
    """``module:function`` giving this stage's part of the dry-run plan (``function(backend_config, inputs)``)."""
    api_key_env: ClassVar[str | None] = None
    """The environment variable the backend reads its API key from (checked by `metarl run` before anything starts)."""

    def combination_problem(self, backends: Mapping[StageName, BackendConfig]) -> str | None:
        """Why this backend cannot run beside the run's other stage backends, with the fix (None: it can)."""
        return None


class AgentBackendConfig(BackendConfig):
    """Settings of a trainer-agent backend."""

    stage: ClassVar[StageName] = "agent"


class TrainBackendConfig(BackendConfig):
    """Settings of an inner-trainer backend."""

    stage: ClassVar[StageName] = "train"
    trains_on_gpu: ClassVar[bool] = False
    """Whether its jobs get a task's GPU training-time cap (``budget.max_gpu_train_seconds``) instead of the CPU one."""
    weights: ClassVar[str]
    """What its trained weights are, as the eval backends name it in ``scores`` (e.g. `local`: a CPU stand-in's checkpoint folder)."""

    def train_seconds(self, task: TaskSpec) -> float:
        """The training-time cap of one of ``task``'s inner jobs on this backend."""
        return task.budget.train_seconds_for(self.trains_on_gpu)

    def task_problems(self, task: TaskSpec) -> list[FieldProblem]:
        """Why some job of ``task`` could never run on this backend whatever the agent writes (a model that fits no GPU); empty: none."""
        return []


class EvalBackendConfig(BackendConfig):
    """Settings of a hidden-eval scorer backend."""

    stage: ClassVar[StageName] = "eval"
    scores: ClassVar[frozenset[str]]
    """The kinds of trained weights (a train backend's ``weights``) it can score; the run config refuses any other pair."""


class OuterBackendConfig(BackendConfig):
    """Settings of an outer-update backend."""

    stage: ClassVar[StageName] = "outer"

    def resume_problem(self, version: int, saved_at: dt.datetime, now: dt.datetime, max_outer_steps: int) -> str | None:
        """Why a run cannot go on from policy version ``version``, saved at ``saved_at`` (None: it can); `metarl resume` asks before anything starts."""
        return None

    def saved_state_problem(self, fetch_state: Callable[[], str]) -> str | None:
        """Why this code cannot continue from a version's saved state (None: it can); ``fetch_state`` gives its local path
        and is called only by a backend that reads the state. `metarl resume` asks before anything starts."""
        return None


def expect_config(backend: BackendConfig, model: type[ConfigT]) -> ConfigT:
    """``backend`` as the vendor's model it must be (TypeError naming both when the run config holds another)."""
    if not isinstance(backend, model):
        raise TypeError(f"backends.{backend.stage} is a {type(backend).__name__} (type = {backend.type!r}), not the {model.__name__} this backend needs")
    return backend
