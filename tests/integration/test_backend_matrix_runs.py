"""Every combination of backend types the run config accepts runs end to end against the fakes (issue 42).

The combinations come from tests/unit/test_backend_matrix.py's enumeration of the registry. Each runs one
outer step of one task (two episodes) through the real command line and real worker pools: Runpod against
the fake GraphQL server and fake pods running the real pod code (tests/fakes/), vLLM through a fake `vllm`
package that generates with the torch sampler, everything else as it is. For each: the run finishes, every
episode that trained has its scores, the ledger has the charges of the billed backends, and nothing is left
running (no pod process, no worker). Tinker through the real `tinker` SDK in the worker processes against
the fake Tinker service on 127.0.0.1 (tests/fakes/tinker_server.py), whose tokenizer is a local folder and whose
sampler answers the scripted agent of :data:`ADDITION_SCRIPT`; for those the outer update also took an optim
step on the fake and published its saved state as the new policy version.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from sqlalchemy import select

from metarl.backends.local.agent import environment_source
from metarl.backends.local.train import dataset_text
from metarl.backends.tinker.client import TinkerPolicyRef
from metarl.backends.tinker.config import TINKER_CONTEXT_WINDOWS
from metarl.pools import WorkerPools, stop_process_group
from metarl.store.db import session_scope
from metarl.store.records import CostEntry, Evaluation, InnerJob, InnerJobStatus, PolicyVersion, Run, RunStatus
from schemas.base import dump_toml_model
from schemas.job import JobDataset, JobModel, JobSpec, JobTraining
from tests.conftest import REPO
from tests.fakes.runpod_server import FakeRunpod, GpuOffer
from tests.fakes.tinker_server import FakeTinker, scripted, write_chat_tokenizer
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
    ("agent", "tinker"): {
        "type": "tinker",
        "base_model": "Qwen/Qwen3-8B",
        "renderer": "qwen3",
        "max_turns": 4,
        "max_tokens_per_turn": 12_000,
        "usd_per_million_prompt_tokens": 0.1,
        "usd_per_million_cached_prompt_tokens": 0.05,
        "usd_per_million_sample_tokens": 0.2,
        "timeout_s": 60,
    },
    ("outer", "tinker"): {"type": "tinker", "lora_rank": 8, "usd_per_million_train_tokens": 0.1, "timeout_s": 60},
}
"""A fast table of each backend type; the Tinker tables get `base_url` (the fake's) in :func:`run_config`."""

BILLED_SOURCES = {"sim": "sim", "runpod": "runpod"}
"""Train types whose jobs put charges in the ledger, and the ledger source they use."""


def tool_call(name: str, **arguments: str) -> str:
    """One JSON tool call block, as metarl/backends/tinker/agent.py parses it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def thinking(seed: int | None) -> str:
    """A thinking block whose length follows the seed: the two episodes of a group spend different token counts, so
    their rewards (the efficiency credit) differ and the outer update has a signal to step on."""
    rng = random.Random(seed)
    return "<think>\n" + " ".join(rng.choice(("plan", "the", "job", "for", "addition")) for _ in range(rng.randrange(1, 400))) + "\n</think>\n\n"


def write_job_turn(seed: int | None) -> str:
    """Turn 1: job.toml (the small model, a short run) and the environment module the local agent writes."""
    job = JobSpec(
        model=JobModel(name="Qwen/Qwen3-0.6B"),
        training=JobTraining(max_steps=4, batch_size=8, group_size=4, seed=(seed or 0) % 1000),
        dataset=JobDataset(size=64, difficulty=0.5),
    )
    return (
        thinking(seed)
        + "I write the job and its environment first.\n"
        + tool_call("write_file", path="job.toml", content=dump_toml_model(job))
        + "\n"
        + tool_call("write_file", path="environment.py", content=environment_source({"correctness": 1.0}, "addition"))
    )


def write_dataset_turn(seed: int | None) -> str:
    """Turn 2: the 64-item dataset job.toml names, then submit."""
    return thinking(seed) + tool_call("write_file", path="dataset.jsonl", content=dataset_text("addition", 64, 0.5, seed or 0)) + "\n" + tool_call("submit")


ADDITION_SCRIPT = scripted(write_job_turn, write_dataset_turn)
"""The fake Tinker sampler's replies: a valid job for the addition task of :func:`specs_folder` in two turns."""


@dataclass
class Fakes:
    """The fakes a combination runs against (None: not used)."""

    runpod: FakeRunpod | None = None
    tinker: FakeTinker | None = None


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


def run_config(tmp_path: Path, types: tuple[str, ...], cache: Path, tinker_url: str | None) -> Path:
    backends = {}
    for stage, kind in zip(("agent", "train", "eval", "outer"), types):
        table = dict(TABLES[(stage, kind)])
        if kind in ("local", "vllm") and stage in ("train", "eval"):
            table["model_cache_dir"] = str(cache)
        if kind == "tinker":
            table["base_url"] = tinker_url
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
def fakes(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_model: Path) -> Iterator[Fakes]:
    """The outside systems a combination needs, on 127.0.0.1 or on PYTHONPATH, set in the environment the pools inherit."""
    types: tuple[str, ...] = request.param
    train, evaluate = types[1], types[2]
    running = Fakes()
    if evaluate == "vllm":
        site = tmp_path / "fake-site"
        (site / "vllm").mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text(FAKE_VLLM, encoding="utf-8")
        monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{REPO}")
    if train == "runpod":
        key = f"rpa_FAKESECRET_{uuid.uuid4().hex}"
        # 3 steps of 0.5 s: the fake bills whole seconds from creation (tests/fakes/runpod_server.py), so a pod
        # that trains and settles (or publishes its eval) within its first second would owe no training charge
        image_env = {"FAKE_TRAIN_STEPS": "3", "FAKE_STEP_S": "0.5", "FAKE_POD_MAX_S": "200"}
        if evaluate == "pod_vllm":
            image_env["FAKE_POD_MODEL"] = str(small_model)
        running.runpod = FakeRunpod(
            key, [sys.executable, "-m", "tests.fakes.pod_runner"], tmp_path / "cloud", pod_cwd=REPO, image_env=image_env, gpus=GPUS, boot_s=0.2
        )
        running.runpod.start()
        monkeypatch.setenv("RUNPOD_API_BASE_URL", running.runpod.url)
        monkeypatch.setenv("RUNPOD_API_KEY", key)
    if "tinker" in types:
        key = f"tml-FAKESECRET-{uuid.uuid4().hex}"
        window = TINKER_CONTEXT_WINDOWS[TABLES[("agent", "tinker")]["base_model"]]
        running.tinker = FakeTinker(key, write_chat_tokenizer(tmp_path / "tinker-tokenizer"), ADDITION_SCRIPT, context_window=window).start()
        monkeypatch.setenv("TINKER_API_KEY", key)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield running
    if running.tinker is not None:
        running.tinker.stop()
        assert running.tinker.errors == [], running.tinker.errors
        assert running.tinker.auth_failures == 0
    if running.runpod is not None:
        running.runpod.stop()
        assert running.runpod.pod_processes_alive() == [], "a pod process outlived the run"


@pytest.mark.parametrize("fakes", COMBINATIONS, ids=combination_id, indirect=True)
def test_an_accepted_combination_runs_one_outer_step(
    fakes: Fakes, request: pytest.FixtureRequest, tmp_path: Path, small_model: Path, pg_url: str, redis_url: str
) -> None:
    types: tuple[str, ...] = request.node.callspec.params["fakes"]
    config = run_config(tmp_path, types, small_model.parent, fakes.tinker.url if fakes.tinker is not None else None)
    env = {**os.environ, "METARL_DATABASE_URL": pg_url, "METARL_BROKER_URL": redis_url, "METARL_HOME": str(tmp_path / "metarl-home")}
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
        versions = session.execute(select(PolicyVersion).where(PolicyVersion.run_id == run.id).order_by(PolicyVersion.version)).scalars().all()
    billed = BILLED_SOURCES.get(types[1])
    if billed is not None:
        assert billed in sources, sources
    if types[2] == "pod_vllm":
        assert "runpod_eval" in sources, sources
    if fakes.tinker is not None:
        assert "tinker" in sources, sources
        assert fakes.tinker.optim_steps >= 1, dict(fakes.tinker.ops)
        assert [version.version for version in versions] == [0, 1]
        assert {turn.turn for turn in fakes.tinker.sample_turns} == {0, 1}, "the agent sampled both turns of the script"
        published = TinkerPolicyRef.parse(versions[-1].state_uri)
        state, sampler = fakes.tinker.saved_state(published.state_path), fakes.tinker.saved_state(published.sampler_path)
        assert state is not None and state.kind == "state" and state.steps == 1, state
        assert sampler is not None and sampler.kind == "sampler" and sampler.steps == 1, sampler
