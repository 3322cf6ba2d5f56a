"""Two families this repository never had, from files alone, through the simulator loop on real
PostgreSQL, Redis and Celery workers: the data-defined `capitals` (JSONL pool and hidden eval,
tests/fixtures/families/capitals) and the plugin family `vowel_count` (an entry point of the package
in tests/fixtures/families/plugin_site, found through the workers' PYTHONPATH).

The same run checks the hidden-eval secret (metarl/learning/eval_secret.py): none is given, so the
workers create it under the artifacts root, and it appears nowhere else: not in any file of the
artifacts root (workspaces, transcripts, report), the worker and orchestrator logs, the database
(`pg_dump --data-only`) or the `metarl report` output.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from metarl.learning.eval_secret import EVAL_SECRET_ENV, EVAL_SECRET_FILE_ENV, SECRET_FILE
from metarl.pools import WorkerPools
from metarl.store.db import session_scope
from metarl.store.records import Episode, Reward, Run, RunStatus, Stage
from tests.conftest import REPO, metarl_cli
from tests.integration.helpers import assert_exactly_once
from tests.integration.secret_leaks import assert_secret_stays_put, files_holding, secret_forms

pytestmark = pytest.mark.integration

FIXTURES = REPO / "tests" / "fixtures" / "families"
PLUGIN_SITE = FIXTURES / "plugin_site"
NEW_TASKS = ("capitals", "vowel_count")


def new_family_specs(folder: Path) -> Path:
    """A task-specs folder holding only the two new families (the data files beside the data-defined spec)."""
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "capitals" / "capitals.toml", folder / "capitals.toml")
    shutil.copytree(FIXTURES / "capitals" / "data", folder / "data")
    shutil.copy(PLUGIN_SITE / "vowel_count.toml", folder / "vowel_count.toml")
    return folder


def sim_run_config(tmp_path: Path) -> Path:
    specs = new_family_specs(tmp_path / "specs")
    path = tmp_path / "new-families.toml"
    path.write_text(
        f"""
[run]
name = "new-families"
seed = 11
tasks = {list(NEW_TASKS)!r}
task_specs_dir = "{specs}"
max_outer_steps = 2

[backends.agent]
type = "sim"
duration = {{ median_s = 0.05, sigma = 0.3, max_s = 5.0 }}
invalid_rate = 0.0

[backends.train]
type = "sim"
duration = {{ median_s = 0.2, sigma = 0.3, max_s = 5.0 }}
failure_rate = 0.0
poll_interval_s = 0.2

[backends.eval]
type = "sim"
duration = {{ median_s = 0.05, sigma = 0.3, max_s = 5.0 }}

[backends.outer]
type = "sim"
duration = {{ median_s = 0.05, sigma = 0.1, max_s = 1.0 }}

[window]
in_flight = 8
tick_s = 0.2

[outer]
group_size = 2
groups_per_batch = 2

[artifacts]
root = "{tmp_path / "artifacts"}"

[retries]
lease_s = 5
redispatch_after_s = 5
"""
    )
    return path


@pytest.fixture
def plugin_env(service_env: dict[str, str]) -> dict[str, str]:
    """The services' environment with the plugin package importable and no hidden-eval secret given."""
    env = {key: value for key, value in service_env.items() if key not in (EVAL_SECRET_ENV, EVAL_SECRET_FILE_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN_SITE), str(REPO), service_env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def plugin_pools(pg_url: str, redis_url: str, plugin_env: dict[str, str], tmp_path: Path) -> Iterator[WorkerPools]:
    """One worker per pool, each able to import the plugin family and holding no secret but the artifacts root's."""
    pools = WorkerPools(pg_url, redis_url, tmp_path / "logs")
    pools.env = dict(plugin_env)
    pools.start()
    yield pools
    pools.stop()


def test_new_families_run_through_the_sim_loop_and_the_secret_stays_put(
    tmp_path: Path, plugin_env: dict[str, str], plugin_pools: WorkerPools, pg_url: str
) -> None:
    config = sim_run_config(tmp_path)
    logs = tmp_path / "logs"
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], plugin_env, timeout=240)
    (logs / "orchestrator.stdout").write_text(done.stdout)
    (logs / "orchestrator.stderr").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]

    with session_scope(pg_url) as session:
        run = session.execute(select(Run)).scalar_one()
        assert run.status == RunStatus.finished
        rewarded = dict(
            session.execute(
                select(Episode.task_id, func.count(Reward.episode_id))
                .join(Reward, Reward.episode_id == Episode.id)
                .where(Episode.run_id == run.id, Episode.stage == Stage.done)
                .group_by(Episode.task_id)
            ).all()
        )
        assert set(rewarded) == set(NEW_TASKS) and all(count >= 2 for count in rewarded.values()), rewarded
        assert_exactly_once(session, run.id, tmp_path / "artifacts")

    report = metarl_cli(["report", run.id], dict(plugin_env, METARL_HOME=str(tmp_path / "home")), timeout=120)
    (logs / "report.stdout").write_text(report.stdout)
    (logs / "report.stderr").write_text(report.stderr)
    assert report.returncode == 0, report.stderr[-3000:]

    assert_secret_stays_put(tmp_path, tmp_path / "artifacts" / SECRET_FILE, pg_url)


def test_the_leak_check_finds_the_secret_in_each_form(tmp_path: Path) -> None:
    secret = "00ff" * 16
    (tmp_path / "secret.key").write_text(secret)
    forms = secret_forms(secret)
    for index, form in enumerate(forms):
        (tmp_path / "deep" / str(index)).mkdir(parents=True)
        (tmp_path / "deep" / str(index) / "log.txt").write_text(f"prefix {form} suffix")
    found = files_holding(tmp_path, forms, skip={(tmp_path / "secret.key").resolve()})
    assert {line.split(":")[0] for line in found} == {f"deep/{index}/log.txt" for index in range(len(forms))}
    assert len(forms) >= 5
