"""Every combination of backend types the run config accepts runs end to end against the fakes (issue 42).

The combinations come from tests/unit/test_backend_matrix.py's enumeration of the registry. Each runs one
outer step of one task (two episodes) through the real command line and real worker pools: Runpod against
the fake GraphQL server and fake pods running the real pod code (tests/fakes/), vLLM through a fake `vllm`
package that generates with the torch sampler, everything else as it is. For each: the run finishes, every
episode that trained has its scores, the ledger has the charges of the billed backends, and nothing is left
running (no pod process, no worker). The Tinker combinations are listed and skipped with the reason: there
is no fake of the Tinker service on 127.0.0.1 for the worker processes (its fakes are in-process clients).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from sqlalchemy import select

from metarl.pools import WorkerPools, stop_process_group
from metarl.store.db import session_scope
from metarl.store.records import CostEntry, Evaluation, InnerJob, InnerJobStatus, Run, RunStatus
from tests.conftest import REPO
from tests.fakes.runpod_server import FakeRunpod, GpuOffer
from tests.integration.helpers import assert_exactly_once
from tests.unit.test_backend_matrix import accepted
from tests.unit.test_vllm_scoring import FAKE_VLLM

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

SCALE = 0.01
"""Pretraining scale of the local stand-in models here: small enough to build in seconds."""
GPUS = (GpuOffer("NVIDIA A40", "A40", 48, 3.6, 3.0),)

TABLES: dict[tuple[str, str], dict[str, Any]] = {
    ("agent", "sim"): {"type": "sim", "invalid_rate": 0.0, "duration": {"median_s": 0.05, "sigma": 0.1, "max_s": 1.0}},
    ("agent", "local"): {"type": "local"},
    ("train", "sim"): {"type": "sim", "failure_rate": 0.0, "duration": {"median_s": 0.2, "sigma": 0.1, "max_s": 1.0}, "poll_interval_s": 0.1},
    ("train", "local"): {"type": "local", "model_scale": SCALE, "poll_interval_s": 0.2},
    ("train", "runpod"): {
        "type": "runpod",
        "image": "ghcr.io/metarl/inner:prime-rl-0.8.0",
        "gpu_types": ["NVIDIA A40"],
        "max_pods": 2,
        "warm_pool_size": 0,
        "poll_interval_s": 0.3,
        "startup_timeout_s": 30,
        "hang_timeout_s": 30,
        "billing_interval_s": 1,
        "api_timeout_s": 2.0,
        "api_backoff_s": 0.05,
        "capacity_cooldown_s": 0,
        "reap_interval_s": 2,
    },
    ("eval", "sim"): {"type": "sim", "duration": {"median_s": 0.05, "sigma": 0.1, "max_s": 1.0}},
    ("eval", "local"): {"type": "local", "model_scale": SCALE},
    ("eval", "vllm"): {"type": "vllm", "model_scale": SCALE, "dtype": "float32", "timeout_s": 300},
    ("eval", "pod_vllm"): {"type": "pod_vllm", "eval_timeout_s": 120},
    ("outer", "sim"): {"type": "sim", "duration": {"median_s": 0.05, "sigma": 0.1, "max_s": 1.0}},
    ("outer", "local"): {"type": "local"},
}
"""A fast table of each backend type (Tinker's have none: see the module docstring)."""

BILLED_SOURCES = {"sim": "sim", "runpod": "runpod"}
"""Train types whose jobs put charges in the ledger, and the ledger source they use."""


def combination_id(types: tuple[str, ...]) -> str:
    return "-".join(types)


COMBINATIONS = sorted(accepted())


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small stand-in at this test's scale, built once into a cache the backends share (the fake pods score with it too)."""
    from metarl.learning.models import ensure_base_model

    return ensure_base_model("local-s", tmp_path_factory.mktemp("models"), scale=SCALE)


def specs_folder(tmp_path: Path) -> Path:
    """The addition spec with a 3 s training cap, the small model only and 8 hidden items."""
    spec = tomllib.loads((REPO / "tasks_specs" / "addition.toml").read_text())
    spec["budget"]["max_train_seconds"] = 3.0
    spec["budget"]["allowed_models"] = ["Qwen/Qwen3-0.6B"]
    spec["hidden_eval"]["n_items"] = 8
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "addition.toml").write_text(tomli_w.dumps(spec))
    return folder


def run_config(tmp_path: Path, types: tuple[str, ...], cache: Path) -> Path:
    backends = {}
    for stage, kind in zip(("agent", "train", "eval", "outer"), types):
        table = dict(TABLES[(stage, kind)])
        if kind in ("local", "vllm") and stage in ("train", "eval"):
            table["model_cache_dir"] = str(cache)
        backends[stage] = table
    config = {
        "run": {"name": f"matrix-{combination_id(types)}", "tasks": ["addition"], "task_specs_dir": str(specs_folder(tmp_path)), "max_outer_steps": 1},
        "backends": backends,
        "window": {"in_flight": 2, "tick_s": 0.2},
        "outer": {"group_size": 2, "groups_per_batch": 1},
        "retries": {"lease_s": 10, "redispatch_after_s": 10},
        "budget": {"max_job_usd": 1.0},
        "artifacts": {"root": str(tmp_path / "artifacts")},
    }
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(config))
    return path


@pytest.fixture
def fakes(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_model: Path) -> Iterator[FakeRunpod | None]:
    """The outside systems a combination needs, on 127.0.0.1 or on PYTHONPATH, set in the environment the pools inherit."""
    types: tuple[str, ...] = request.param
    train, evaluate = types[1], types[2]
    if evaluate == "vllm":
        site = tmp_path / "fake-site"
        (site / "vllm").mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text(FAKE_VLLM, encoding="utf-8")
        monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{REPO}")
    if train != "runpod":
        yield None
        return
    key = f"rpa_FAKESECRET_{uuid.uuid4().hex}"
    image_env = {"FAKE_TRAIN_STEPS": "3", "FAKE_STEP_S": "0.2", "FAKE_POD_MAX_S": "200"}
    if evaluate == "pod_vllm":
        image_env["FAKE_POD_MODEL"] = str(small_model)
    fake = FakeRunpod(key, [sys.executable, "-m", "tests.fakes.pod_runner"], tmp_path / "cloud", pod_cwd=REPO, image_env=image_env, gpus=GPUS, boot_s=0.2)
    fake.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    yield fake
    fake.stop()
    assert fake.pod_processes_alive() == [], "a pod process outlived the run"


@pytest.mark.parametrize("fakes", COMBINATIONS, ids=combination_id, indirect=True)
def test_an_accepted_combination_runs_one_outer_step(
    fakes: FakeRunpod | None, request: pytest.FixtureRequest, tmp_path: Path, small_model: Path, pg_url: str, redis_url: str
) -> None:
    types: tuple[str, ...] = request.node.callspec.params["fakes"]
    if "tinker" in types:
        pytest.skip("no fake of the Tinker service on 127.0.0.1 for worker processes (tests/unit/test_tinker_fakes.py fakes its clients in-process)")
    config = run_config(tmp_path, types, small_model.parent)
    env = {**os.environ, "METARL_DATABASE_URL": pg_url, "METARL_BROKER_URL": redis_url}
    pools = WorkerPools(pg_url, redis_url, tmp_path / "logs")
    pools.start()
    try:
        orchestrator = subprocess.Popen(
            [sys.executable, "-m", "metarl_cli.main", "run", str(config), "--no-workers", "--quiet"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = orchestrator.communicate(timeout=360)
        finally:
            stop_process_group(orchestrator)
        assert orchestrator.returncode == 0, output.decode(errors="replace")[-3000:]
    finally:
        pools.stop()
    assert pools.processes == {}, "a worker pool outlived the run"

    with session_scope(pg_url) as session:
        [run] = session.execute(select(Run)).scalars().all()
        assert run.status == RunStatus.finished, run.status_message
        assert_exactly_once(session, run.id)
        jobs = session.execute(select(InnerJob).where(InnerJob.run_id == run.id)).scalars().all()
        trained = [job for job in jobs if job.status == InnerJobStatus.succeeded]
        assert trained, f"no inner job trained: {[(job.name, job.status, job.error) for job in jobs]}"
        evaluations = {evaluation.episode_id: evaluation for evaluation in session.execute(select(Evaluation)).scalars().all()}
        for job in trained:
            evaluation = evaluations.get(job.episode_id)
            assert evaluation is not None and evaluation.trained_score is not None and evaluation.base_score is not None, job.name
            assert evaluation.backend == types[2]
        sources = {entry.source for entry in session.execute(select(CostEntry).where(CostEntry.run_id == run.id)).scalars().all()}
    billed = BILLED_SOURCES.get(types[1])
    if billed is not None:
        assert billed in sources, sources
    if types[2] == "pod_vllm":
        assert "runpod_eval" in sources, sources
