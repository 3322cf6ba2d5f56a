"""The trained policy states shipped under bench/results load in this code and say where they come from.

A change of the job language's vocabulary makes them unloadable; this test then names the state to retrain
(`bench.versus_search` needs one to compare the trained agent without training first).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.versus_search import PROVENANCE_SUFFIX, resolve_provenance
from metarl.policy.local_policy import state_file_problem

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
STATES = sorted(RESULTS.glob("*/*.pt"))


def test_at_least_one_trained_state_is_shipped() -> None:
    assert STATES, f"no trained policy state under {RESULTS}"


@pytest.mark.parametrize("state", STATES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_a_shipped_state_loads_and_has_its_provenance(state: Path) -> None:
    assert state_file_problem(state) is None, f"{state} no longer loads: retrain it (BENCHMARKS.md, Meta-RL) or remove it"
    assert state.with_name(state.name + PROVENANCE_SUFFIX).is_file()
    provenance = resolve_provenance(state, None, None)
    assert provenance.outer_version > 0 and state.name.startswith(f"v{provenance.outer_version:05d}-")
