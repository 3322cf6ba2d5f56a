"""Every combination of agent, train, eval and outer backend types the registry offers is either accepted or refused at load
with one error that names the pair and the alternative; the accepted set is the matrix in docs/backends.md.

The combinations are enumerated from the registered config models (schemas/backend_registry.py), not from a hand list.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any

import pytest

from schemas.backend_config import STAGE_NAMES
from schemas.backend_registry import backend_type, stage_configs
from schemas.base import ConfigError, validate_model
from schemas.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_BACKENDS = [tomllib.loads((REPO / "examples" / f"{name}.toml").read_text())["backends"] for name in ("sim", "local", "runpod", "tinker")]


def minimal_table(stage: str, type_name: str) -> dict[str, Any]:
    """A table of that type that validates alone: a shipped example's when one uses the type (required prices, image), else just the type."""
    for backends in EXAMPLE_BACKENDS:
        if backends[stage]["type"] == type_name:
            return dict(backends[stage])
    return {"type": type_name}


def combinations() -> list[tuple[str, ...]]:
    return list(itertools.product(*([backend_type(model) for model in stage_configs(stage)] for stage in STAGE_NAMES)))


def load(types: tuple[str, ...]) -> RunConfig:
    data = {"run": {"name": "matrix", "tasks": ["addition"]}, "backends": {stage: minimal_table(stage, kind) for stage, kind in zip(STAGE_NAMES, types)}}
    return validate_model(RunConfig, data, "matrix.toml")


def accepted() -> set[tuple[str, ...]]:
    runs = set()
    for types in combinations():
        try:
            load(types)
        except ConfigError:
            continue
        runs.add(types)
    return runs


MATRIX_TABLE = REPO / "docs" / "backends.md"


def documented_pairs() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(agent, outer) and (train, eval) pairs the matrix table in docs/backends.md says run: rows `| x | y | runs |`."""
    agent_outer, train_eval = set(), set()
    section = None
    for line in MATRIX_TABLE.read_text().splitlines():
        if line.startswith("| agent | outer |"):
            section = agent_outer
        elif line.startswith("| train | eval |"):
            section = train_eval
        elif not line.startswith("|"):
            section = None
        elif section is not None and not line.startswith("|--"):
            cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
            if cells[2].startswith("runs"):
                section.add((cells[0], cells[1]))
    return agent_outer, train_eval


def test_every_combination_is_accepted_or_refused_with_the_pair_and_the_alternative() -> None:
    refused = 0
    for types in combinations():
        try:
            load(types)
        except ConfigError as error:
            refused += 1
            [problem] = error.problems
            named = [kind for kind in types if f'"{kind}"' in problem.message or f"`{kind}`" in problem.message]
            assert len(set(named)) >= 1 and problem.field == "backends", (types, problem)
            assert "use" in problem.fix or "set" in problem.fix or "both" in problem.message, (types, problem)
    assert 0 < refused < len(combinations())


def test_the_accepted_combinations_are_the_documented_matrix() -> None:
    agent_outer, train_eval = documented_pairs()
    expected = {(agent, train, evaluate, outer) for agent, outer in agent_outer for train, evaluate in train_eval}
    assert accepted() == expected


@pytest.mark.parametrize(("train", "evaluate"), [("runpod", "vllm"), ("runpod", "local"), ("sim", "local"), ("sim", "vllm")])
def test_an_eval_that_cannot_score_the_trained_weights_is_refused_at_load(train: str, evaluate: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(("sim", train, evaluate, "sim"))
    [problem] = error.value.problems
    assert f'backends.eval.type = "{evaluate}" cannot score what backends.train.type = "{train}" trains' in problem.message
    assert "backends.eval.type = " in problem.fix
