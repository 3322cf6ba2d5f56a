"""The local backends wired into the pools: real GRPO inner jobs and real hidden-eval scoring."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import tomli_w
from sqlalchemy import select

from metarl.learning.registry import get_family
from metarl.store.db import session_scope
from metarl.store.records import Evaluation, InnerJob, InnerJobStatus, Run, RunStatus
from tests.conftest import REPO, metarl_cli
from tests.integration.helpers import assert_exactly_once

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def short_task_specs(folder: Path, task_ids: list[str], train_seconds: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for task_id in task_ids:
        spec = tomllib.loads((REPO / "tasks_specs" / f"{task_id}.toml").read_text())
        spec["budget"]["max_train_seconds"] = train_seconds
        (folder / f"{task_id}.toml").write_text(tomli_w.dumps(spec))


def local_config(tmp_path: Path) -> Path:
    short_task_specs(tmp_path / "specs", ["addition", "reversal"], train_seconds=6.0)
    path = tmp_path / "local.toml"
    path.write_text(
        f"""
[run]
name = "local-itest"
seed = 3
tasks = ["addition", "reversal"]
task_specs_dir = "{tmp_path / "specs"}"
max_outer_steps = 1

[backends.agent]
type = "sim"
duration = {{ median_s = 0.0 }}
invalid_rate = 0.0

[backends.train]
type = "local"
poll_interval_s = 0.5
model_scale = 0.04
model_cache_dir = "{tmp_path / "models"}"

[backends.eval]
type = "local"
model_scale = 0.04
model_cache_dir = "{tmp_path / "models"}"

[backends.outer]
type = "sim"

[window]
in_flight = 2
tick_s = 0.3

[outer]
group_size = 2
groups_per_batch = 1

[retries]
lease_s = 30
redispatch_after_s = 30

[artifacts]
root = "{tmp_path / "artifacts"}"
"""
    )
    return path


def test_local_train_and_eval_in_pools_leak_no_hidden_eval_item(tmp_path, service_env, pools, pg_url):
    done = metarl_cli(["run", str(local_config(tmp_path)), "--no-workers", "--quiet"], service_env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = re.search(r"run ([0-9a-f\-]{36})", done.stdout).group(1)
    with session_scope(pg_url) as session:
        assert session.get(Run, run_id).status == RunStatus.finished
        assert_exactly_once(session, run_id)
        jobs = session.execute(select(InnerJob).where(InnerJob.run_id == run_id)).scalars().all()
        assert jobs and all(job.backend == "local" and not job.simulated for job in jobs)
        succeeded = [job for job in jobs if job.status == InnerJobStatus.succeeded]
        assert succeeded, [job.error for job in jobs]
        for job in succeeded:
            checkpoint = Path(job.checkpoint_uri)
            assert (checkpoint / "config.json").exists() and (checkpoint / "model.safetensors").exists()
            rows = [json.loads(line) for line in Path(job.metrics_uri).read_text().splitlines()]
            assert rows and "reward_mean" in rows[0]
        evaluations = (
            session.execute(select(Evaluation).join(InnerJob, InnerJob.episode_id == Evaluation.episode_id).where(InnerJob.run_id == run_id)).scalars().all()
        )
        assert evaluations and all(e.backend == "local" and not e.simulated and e.n_items == 200 for e in evaluations)
    assert_no_hidden_eval_item_in_artifacts(tmp_path)


def assert_no_hidden_eval_item_in_artifacts(tmp_path: Path) -> None:
    """No file any job or workspace wrote contains a hidden-eval prompt."""
    hidden = {task: {item.prompt for item in get_family(task).hidden_eval(200, 1)} for task in ("addition", "reversal")}
    files = [path for path in (tmp_path / "artifacts").rglob("*") if path.is_file()]
    assert any(path.name == "dataset.jsonl" for path in files)
    all_hidden = set().union(*hidden.values())
    for path in files:
        found = strings_in(path) & all_hidden
        assert not found, f"{path} contains hidden-eval items: {sorted(found)[:3]}"


def json_strings(value: object) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(set(), *(json_strings(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(set(), *(json_strings(v) for v in value))
    return set()


def strings_in(path: Path) -> set[str]:
    """Every JSON string value of a JSON/JSONL file, or every stripped line of another text file."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix == ".jsonl":
        return set().union(set(), *(json_strings(json.loads(line)) for line in text.splitlines() if line.strip()))
    if path.suffix == ".json":
        return json_strings(json.loads(text))
    return {line.strip() for line in text.splitlines()}
