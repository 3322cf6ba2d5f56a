"""`python -m bench.versus_search --quick` end to end: real probe, real GRPO jobs, real scoring; the CSV, plot and summary it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.versus_search import PROVENANCE_SUFFIX, PolicyProvenance
from metarl.policy.local_policy import LocalPolicy, PolicyConfig
from metarl.versus_search import METHODS, read_versus_csv, summarize
from tests.conftest import REPO

pytestmark = pytest.mark.slow

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_run_writes_checked_rows_a_plot_and_the_zero_shot_line(tmp_path: Path) -> None:
    # No trained checkpoint ships: a policy state with another init seed stands in, labelled so, to run the trained-agent path.
    state = tmp_path / "artifacts" / "policy" / "test-run" / "v00003-0123456789ab.pt"
    LocalPolicy(PolicyConfig(init_seed=5, default_bias=1.0)).save_state(state)
    provenance = PolicyProvenance(run_id="test-run", commit="0000000", seed=0, outer_version=3, note="test stand-in, not a trained policy")
    state.with_name(state.name + PROVENANCE_SUFFIX).write_text(provenance.model_dump_json())
    out = tmp_path / "out"
    env = dict(os.environ)  # METARL_EVAL_SECRET: the test secret tests/conftest.py sets
    command = [sys.executable, "-m", "bench.versus_search", "--quick", "--out", str(out), "--cache-dir", str(tmp_path / "models"), "--policy", str(state)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "QUICK RUN" in result.stdout and "# output checked" in result.stdout

    rows = read_versus_csv(out / "versus_search-quick.csv")
    assert {row.mode for row in rows} == {"quick"}
    families = {"date_format", "addition"}
    for method in METHODS:
        for family in families:
            for seed in (0, 1):
                jobs = sorted(row.job_index for row in rows if (row.method, row.family, row.seed) == (method, family, seed))
                assert jobs == ([1] if method == "sensible_preset" else [1, 2, 3, 4]), (method, family, seed, jobs)
    assert {row.family for row in rows if row.held_out} == {"date_format"}
    assert any(row.outcome == "passed" and row.score is not None and row.cpu_s > 0 and row.steps for row in rows), "no job trained"
    assert all(row.cost_usd == 0.0 for row in rows)
    for point in summarize(rows):
        assert point.best.low is not None and point.best.high is not None and point.best.low <= point.best.mean <= point.best.high
    assert (out / "versus_search-quick.png").read_bytes()[:8] == PNG_MAGIC

    summary = (out / "summary-quick.txt").read_text()
    assert summary.startswith("# versus search, QUICK RUN")
    assert "zero-shot on date_format: trained agent's first job" in summary and "Optuna TPE best of 1:" in summary
    meta = json.loads((out / "meta-quick.json").read_text())
    assert meta["mode"] == "quick" and meta["trained_agent"]["run_id"] == "test-run" and meta["wall_s"] > 0
