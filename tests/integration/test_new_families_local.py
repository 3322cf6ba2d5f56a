"""The two families this repository never had (the data-defined `capitals`, the plugin `vowel_count`)
through the LOCAL loop on real services: the local policy writes each job into its workspace, the
probe runs it in the sandbox, GRPO trains the stand-in model, the local scorer grades the hidden eval
with the family's grader, and the local outer update takes a step.

The run creates its hidden-eval secret under the artifacts root; no workspace, job file, checkpoint
folder, log, report or database row holds it, and no file the run wrote holds a hidden-eval prompt.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import tomli_w
from sqlalchemy import select

from metarl.learning.data_families import family_for
from metarl.learning.eval_secret import SECRET_FILE
from metarl.pools import WorkerPools
from metarl.runconfig import load_task_spec
from metarl.store.db import session_scope
from metarl.store.records import Episode, Evaluation, InnerJob, InnerJobStatus, OuterStatus, OuterStep, ProbeAttempt, Reward, Run, RunStatus, Stage
from tests.conftest import metarl_cli
from tests.integration.helpers import assert_exactly_once
from tests.integration.secret_leaks import assert_secret_stays_put
from tests.integration.test_new_families_sim import NEW_TASKS, PLUGIN_SITE, new_family_specs, plugin_env, plugin_pools  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAIN_SECONDS = 5.0


def short_budget_specs(folder: Path) -> Path:
    """The two new families' specs with a few seconds of training each."""
    new_family_specs(folder)
    for task_id in NEW_TASKS:
        path = folder / f"{task_id}.toml"
        spec = tomllib.loads(path.read_text())
        spec.setdefault("budget", {})["max_train_seconds"] = TRAIN_SECONDS
        path.write_text(tomli_w.dumps(spec))
    return folder


def local_run_config(tmp_path: Path) -> Path:
    specs = short_budget_specs(tmp_path / "specs")
    path = tmp_path / "new-families-local.toml"
    path.write_text(
        f"""
[run]
name = "new-families-local"
seed = 5
tasks = {list(NEW_TASKS)!r}
task_specs_dir = "{specs}"
max_outer_steps = 1

[backends.agent]
type = "local"

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
type = "local"

[window]
in_flight = 4
tick_s = 0.3

[outer]
group_size = 2
groups_per_batch = 2

[retries]
lease_s = 60
redispatch_after_s = 60

[artifacts]
root = "{tmp_path / "artifacts"}"
"""
    )
    return path


def hidden_prompts(specs: Path, secret: bytes) -> set[str]:
    """Every hidden-eval prompt of the two families, the plugin's drawn under the run's secret."""
    prompts: set[str] = set()
    for task_id in NEW_TASKS:
        spec = load_task_spec(specs / f"{task_id}.toml")
        prompts |= {item.prompt for item in family_for(spec).hidden_eval(spec.hidden_eval.n_items, spec.hidden_eval.version, secret)}
    return prompts


def files_with_prompts(root: Path, prompts: set[str]) -> list[str]:
    """Files under ``root`` (the run's artifacts) holding a hidden prompt as a JSON string or a whole line."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in (".jsonl", ".json", ".toml", ".py", ".md", ".txt"):
            continue
        text = path.read_text(errors="replace")
        quoted = {json.dumps(prompt) for prompt in prompts}
        lines = {line.strip() for line in text.splitlines()}
        hits = {prompt for prompt in prompts if prompt in lines} | {json.loads(q) for q in quoted if q in text}
        if hits:
            found.append(f"{path.relative_to(root)}: {sorted(hits)[:3]}")
    return found


def test_new_families_run_through_the_local_loop(
    tmp_path: Path,
    plugin_env: dict[str, str],
    plugin_pools: WorkerPools,
    pg_url: str,
    plugin_installed: None,
) -> None:
    config = local_run_config(tmp_path)
    logs = tmp_path / "logs"
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], plugin_env, timeout=900)
    (logs / "orchestrator.stdout").write_text(done.stdout)
    (logs / "orchestrator.stderr").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    run_id = re.search(r"run ([0-9a-f\-]{36})", done.stdout).group(1)  # type: ignore[union-attr]

    with session_scope(pg_url) as session:
        run = session.get(Run, run_id)
        assert run is not None and run.status == RunStatus.finished
        assert_exactly_once(session, run_id)  # inner jobs on the local backend: no simulated cloud to compare
        attempts = session.execute(select(ProbeAttempt).join(Episode, Episode.id == ProbeAttempt.episode_id).where(Episode.run_id == run_id)).scalars().all()
        assert attempts and all(attempt.agent_backend == "local" and attempt.policy_tokens for attempt in attempts)
        done_tasks: dict[str, int] = {}
        for episode, job, evaluation, reward in session.execute(
            select(Episode, InnerJob, Evaluation, Reward)
            .join(InnerJob, InnerJob.episode_id == Episode.id)
            .join(Evaluation, Evaluation.episode_id == Episode.id)
            .join(Reward, Reward.episode_id == Episode.id)
            .where(Episode.run_id == run_id, Episode.stage == Stage.done)
        ).all():
            assert job.backend == "local" and not job.simulated and job.status == InnerJobStatus.succeeded, job.error
            assert evaluation.backend == "local" and not evaluation.simulated
            assert 0.0 <= evaluation.base_score <= 1.0 and 0.0 <= evaluation.trained_score <= 1.0 and reward.total is not None
            done_tasks[episode.task_id] = done_tasks.get(episode.task_id, 0) + 1
        assert set(done_tasks) == set(NEW_TASKS), f"episodes trained, scored and rewarded per task: {done_tasks}"
        evaluations = session.execute(
            select(Episode.task_id, Evaluation.n_items).join(Evaluation, Evaluation.episode_id == Episode.id).where(Episode.run_id == run_id)
        )
        evaluated_items = dict(evaluations.all())
        steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id)).scalars().all()
        assert [step.status for step in steps] == [OuterStatus.done], [(step.status, step.error) for step in steps]
    specs = tmp_path / "specs"
    expected_items = {task_id: load_task_spec(specs / f"{task_id}.toml").hidden_eval.n_items for task_id in NEW_TASKS}
    assert evaluated_items == expected_items, "each hidden eval is scored on its own n_items"

    report = metarl_cli(["report", run_id], dict(plugin_env, METARL_HOME=str(tmp_path / "home")), timeout=180)
    (logs / "report.stdout").write_text(report.stdout)
    (logs / "report.stderr").write_text(report.stderr)
    assert report.returncode == 0, report.stderr[-3000:]

    secret_file = tmp_path / "artifacts" / SECRET_FILE
    workspaces = tmp_path / "artifacts" / "workspaces"
    assert any(workspaces.rglob("job.toml")) and any(workspaces.rglob("transcript.jsonl")), "no workspace or transcript to search"
    assert_secret_stays_put(tmp_path, secret_file, pg_url)
    leaked = files_with_prompts(tmp_path / "artifacts", hidden_prompts(specs, secret_file.read_text().strip().encode()))
    assert leaked == [], f"hidden-eval prompts in files the run wrote: {leaked}"
