"""The on-pod hidden eval: its config, the request the workers publish, grading, the estimate, the
train backend's eval phase (pure decisions and billing labels), and one Runpod backend against the
fake server whose fake pod runs the real pod side (metarl.backends.runpod.pod.eval_server.EvalServer, torch engine).

Also the pod's generate step (metarl/backends/runpod/pod/scoring.py): its vLLM path against a stand-in with vLLM's
call shape, its torch path against the CPU scorer, and the LoRA merge (metarl/backends/runpod/pod/lora_merge.py).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from metarl.backends.runpod.config import PodVllmEvalBackend, RunpodTrainBackend
from metarl.backends.runpod.eval import (
    PASS_K_TEMPERATURE,
    PodVllmEval,
    baseline_path,
    completion_budget,
    estimate_eval_seconds,
    eval_request,
    grade,
    hidden_items,
)
from metarl.backends.runpod.pod.eval_server import REQUEST_FILE, EvalRequest, EvalResult, TargetOutput, items_digest
from metarl.backends.runpod.pod.manifest import EXIT_FILE
from metarl.backends.runpod.pod.protocol import ExitReport
from metarl.backends.runpod.pods import pod_charges
from metarl.backends.runpod.provider import PodState
from metarl.backends.runpod.train import RunpodTrain
from metarl.backends.runpod.verdicts import eval_refusal, eval_targets, judge_eval
from metarl.errors import PermanentBackendError
from metarl.interfaces import CostItem, EpisodeContext
from schemas.base import load_toml_model
from schemas.job import JobModel, JobSpec
from schemas.run_config import BudgetConfig, RunConfig
from schemas.task_spec import TaskSpec
from tests.conftest import REPO
from tests.fakes.runpod_server import FakeRunpod

RUN_ID = "0a1b2c3d-0000-4000-8000-000000000002"
TINY_SCALE = 0.01


def small_task(n_items: int = 16) -> TaskSpec:
    task = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")
    return task.model_copy(update={"hidden_eval": task.hidden_eval.model_copy(update={"n_items": n_items})})


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from metarl.learning.models import ensure_base_model

    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=TINY_SCALE)


# --- config, request, grading, estimate --------------------------------------------------------


def run_config(train: str, evaluate: str) -> dict[str, Any]:
    return {
        "run": {"name": "x", "tasks": ["addition"]},
        "backends": {"agent": {"type": "sim"}, "train": json.loads(train), "eval": json.loads(evaluate), "outer": {"type": "sim"}},
    }


def test_pod_eval_needs_runpod_training() -> None:
    runpod = json.dumps({"type": "runpod", "image": "img:1"})
    config = RunConfig.model_validate(run_config(runpod, '{"type": "pod_vllm"}'))
    assert isinstance(config.backends.eval, PodVllmEvalBackend) and config.backends.eval.chat
    with pytest.raises(ValidationError, match='"pod_vllm" cannot score what backends.train.type = "sim" trains'):
        RunConfig.model_validate(run_config('{"type": "sim"}', '{"type": "pod_vllm"}'))
    with pytest.raises(ValidationError):
        PodVllmEvalBackend(type="pod_vllm", gpu_memory_utilization=1.5)


def test_the_request_carries_prompts_but_no_answers_and_the_scorers_rules() -> None:
    from metarl.learning.registry import get_family
    from metarl.learning.scoring import PASS_K_TEMPERATURE as SCORING_TEMPERATURE
    from metarl.learning.scoring import format_prompt, max_completion_tokens, pass_k_seed

    task = small_task()
    config = PodVllmEvalBackend(type="pod_vllm", seed=7)
    request = eval_request(task, config, request_id="metarl-0a1b2c3d-1:a0", targets=["trained", "base"], published_at=1.0)
    items, prompts = hidden_items(task)
    assert request.prompts == [format_prompt(example) for example in items] == prompts
    assert request.max_tokens == max_completion_tokens(get_family(task.family)) == completion_budget(task)
    assert request.temperature == SCORING_TEMPERATURE == PASS_K_TEMPERATURE and request.seed == pass_k_seed(7, 0)
    assert "answer" not in request.model_dump_json() and set(EvalRequest.model_fields) >= set(json.loads(request.model_dump_json()))
    with pytest.raises(ValidationError, match="digest"):
        EvalRequest.model_validate({**request.model_dump(), "prompts": prompts[:-1]})


def test_grading_uses_the_tasks_answers_and_refuses_other_prompts() -> None:
    task = small_task()
    items, prompts = hidden_items(task)
    right = TargetOutput(model="m", prompt_format="raw", completions=[[example.answer] for example in items], load_s=1, generate_s=1)
    wrong = right.model_copy(update={"completions": [["?"] for _ in items]})
    assert grade(task, right, items_digest(prompts)).mean == 1.0 and grade(task, wrong, items_digest(prompts)).mean == 0.0
    with pytest.raises(PermanentBackendError, match="other prompts"):
        grade(task, right, items_digest(prompts[:-1]))


def test_eval_seconds_estimate() -> None:
    task = small_task(200)
    config = PodVllmEvalBackend(type="pod_vllm", engine_start_s=100, tokens_per_s=1000)
    per_engine = 100 + 200 * (64 + completion_budget(task)) / 1000
    assert estimate_eval_seconds(task, config, score_base=False) == pytest.approx(per_engine)
    assert estimate_eval_seconds(task, config) == pytest.approx(2 * per_engine)


# --- the train backend's eval phase (pure) ------------------------------------------------------


def result(request_id: str = "j:a0", error: str | None = None) -> EvalResult:
    return EvalResult(request_id=request_id, digest="0" * 64, error=error, started_at=1, finished_at=2, request_deleted=True)


def test_eval_phase_verdicts_in_order() -> None:
    base = dict(pod_state=PodState.running, result=None, request_id="j:a0", waited_s=10, timeout_s=100, job_cost=1, max_job_usd=5, stop_for_run_cap=False)
    assert judge_eval(**base).action == "running"
    assert judge_eval(**{**base, "result": result()}).action == "succeeded"
    assert judge_eval(**{**base, "result": result(error="vllm died")}).action == "failed"
    assert judge_eval(**{**base, "result": result("j:a1")}).action == "failed"
    assert judge_eval(**{**base, "pod_state": PodState.terminated}).action == "abort"
    assert judge_eval(**{**base, "pod_state": None, "result": result()}).action == "succeeded"  # the result is in storage: the pod may go
    assert judge_eval(**{**base, "stop_for_run_cap": True}).action == "abort"
    assert judge_eval(**{**base, "job_cost": 5}).action == "abort"
    assert "eval_timeout_s" in (judge_eval(**{**base, "waited_s": 101}).reason or "")
    report = ExitReport(
        succeeded=True, reason="completed", prime_rl_tag="v0.8.0", started_at=0, finished_at=1, duration_s=1, agent_stopped=True, eval_on_pod=True
    )
    assert eval_refusal(report) is None
    assert "did not succeed" in (eval_refusal(report.model_copy(update={"succeeded": False, "reason": "rl_failed"})) or "")
    assert "agent's processes" in (eval_refusal(report.model_copy(update={"agent_stopped": False})) or "")
    assert eval_refusal(report.model_copy(update={"eval_on_pod": False})) is not None
    assert eval_targets(trained_is_base=False, base_known=False) == ["trained", "base"]
    assert eval_targets(trained_is_base=False, base_known=True) == ["trained"]
    assert eval_targets(trained_is_base=True, base_known=False) == ["base"]
    assert eval_targets(trained_is_base=True, base_known=True) == []


def test_intervals_after_the_eval_request_are_billed_as_eval_under_the_same_keys() -> None:
    items = pod_charges("pod1", "2x A40", 3.6, [(0, 60), (1, 60), (2, 60), (3, 5)], 60, eval_from_s=100, job_name="metarl-x-1")
    assert [item.key for item in items] == ["runpod:pod1:0", "runpod:pod1:1", "runpod:pod1:2", "runpod:pod1:3"]
    assert [item.source for item in items] == ["runpod", "runpod", "runpod_eval", "runpod_eval"]
    assert "hidden eval of metarl-x-1" in items[2].description and items[3].quantity == 5.0
    assert all(item.source == "runpod" for item in pod_charges("pod1", "2x A40", 3.6, [(0, 60)], 60))


# --- the pod's generate step and the LoRA merge -------------------------------------------------


@dataclass
class Sample:
    index: int
    token_ids: list[int]


@dataclass
class Output:
    outputs: list[Sample]


class SamplingParamsStandIn:
    """Records the keyword arguments a vllm.SamplingParams would be built with."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs


class LLMStandIn:
    """vllm.LLM's call shape: built with the engine keyword arguments; generate() echoes the token ids it is given.

    It answers every prompt with the prompt's own last tokens then EOS, so the completion texts are known."""

    built: list[dict[str, Any]] = []

    def __init__(self, **kwargs: Any):
        LLMStandIn.built.append(kwargs)
        self.eos = None

    def generate(self, prompts: list[dict[str, list[int]]], params: SamplingParamsStandIn, use_tqdm: bool = True) -> list[Output]:
        eos = params.kwargs["stop_token_ids"][0]
        return [Output([Sample(i, prompt["prompt_token_ids"][-2:] + [eos, 5]) for i in reversed(range(params.kwargs["n"]))]) for prompt in prompts]


def test_pod_scoring_vllm_path_builds_the_same_engine_and_sampling_as_the_gpu_pool(tiny_model_dir: Path) -> None:
    from metarl.backends.runpod.pod.scoring import score_request
    from metarl.backends.vllm.config import VllmEvalBackend
    from metarl.backends.vllm.scoring import engine_kwargs, sampling_kwargs
    from metarl.learning.registry import get_family
    from metarl.learning.tokenizer import load_tokenizer

    task = small_task(6)
    request = eval_request(task, PodVllmEvalBackend(type="pod_vllm", seed=3), request_id="j:a0", targets=["trained"], published_at=1.0).model_dump(mode="json")
    LLMStandIn.built.clear()
    out = score_request(request, str(tiny_model_dir), "vllm", llm_class=LLMStandIn, sampling_params_class=SamplingParamsStandIn)
    tokenizer = load_tokenizer(tiny_model_dir)
    # prompt "add A+B=": the stand-in answers with its last two characters, then EOS (and a token after EOS that must be cut)
    assert out["completions"] == [[prompt[-2:]] for prompt in request["prompts"]] and out["prompt_format"] == "raw"
    (built,) = LLMStandIn.built
    pool = VllmEvalBackend(type="vllm", seed=3)
    assert built == engine_kwargs(tiny_model_dir, pool, built["max_model_len"])
    assert built["max_model_len"] == max(len(row) for row in tokenizer(request["prompts"])["input_ids"]) + request["max_tokens"]
    # the sampling arguments equal the GPU pool's for the same family, pass@k and seed
    from metarl.backends.runpod.pod.scoring import forbidden_ids, generation_kwargs

    pod_kwargs = generation_kwargs(
        eos_id=tokenizer.eos_token_id,
        forbidden=forbidden_ids(tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id),
        vocab_size=len(tokenizer),
        max_tokens=request["max_tokens"],
        pass_k=1,
        temperature=request["temperature"],
        seed=request["seed"],
    )
    assert pod_kwargs == sampling_kwargs(tokenizer, get_family(task.family), pass_k=1, seed=3)


def test_pod_scoring_torch_path_matches_the_cpu_scorer(tiny_model_dir: Path) -> None:
    from metarl.backends.runpod.pod.scoring import score_request
    from metarl.learning.scoring import load_model, score_loaded_model
    from metarl.learning.tokenizer import load_tokenizer

    task = small_task(12)
    request = eval_request(task, PodVllmEvalBackend(type="pod_vllm"), request_id="j:a0", targets=["trained"], published_at=1.0)
    out = score_request(request.model_dump(mode="json"), str(tiny_model_dir), "torch")
    output = TargetOutput.model_validate(out)
    items, _ = hidden_items(task)
    from metarl.learning.registry import get_family

    expected = score_loaded_model(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), get_family(task.family), items)
    assert grade(task, output, request.digest) == expected


def test_chat_formatted_prompts_and_think_blocks(tiny_model_dir: Path) -> None:
    from metarl.backends.runpod.pod.scoring import completion_text, prompt_token_rows, uses_chat
    from metarl.learning.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    assert not uses_chat(tokenizer, True)
    tokenizer.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    assert uses_chat(tokenizer, True) and not uses_chat(tokenizer, False)
    (row,) = prompt_token_rows(tokenizer, ["add 1+2="], chat=True)
    assert tokenizer.decode(row) == "[add 1+2=]>"
    ids = tokenizer("3", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert completion_text(tokenizer, ids, chat=True) == "3"


def test_the_merge_adds_the_scaled_adapter_to_the_targeted_weights(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from metarl.backends.runpod.pod.lora_merge import MergeError, adapter_pairs, merge_folder

    step = tmp_path / "step_3"
    (step / "lora_adapters").mkdir(parents=True)
    weight = torch.randn(6, 4).to(torch.bfloat16)
    save_file({"model.layers.0.mlp.up_proj.weight": weight, "model.norm.weight": torch.ones(4)}, str(step / "model.safetensors"), metadata={"format": "pt"})
    lora_a, lora_b = torch.randn(2, 4), torch.randn(6, 2)
    save_file(
        {"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": lora_a, "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": lora_b},
        str(step / "lora_adapters" / "adapter_model.safetensors"),
    )
    (step / "lora_adapters" / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4.0}))
    (step / "config.json").write_text("{}")
    (step / "STABLE").touch()
    record = merge_folder(step, tmp_path / "merged")
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    expected = (weight.float() + 2.0 * lora_b @ lora_a).to(torch.bfloat16)
    assert merged["model.layers.0.mlp.up_proj.weight"].equal(expected) and merged["model.norm.weight"].equal(torch.ones(4))
    assert record["merged_modules"] == 1 and record["scaling"] == 2.0
    assert (tmp_path / "merged" / "config.json").is_file() and (tmp_path / "merged" / "STABLE").is_file()
    with pytest.raises(MergeError, match="needs both"):
        adapter_pairs(["base_model.model.x.lora_A.weight"])
    (step / "lora_adapters" / "adapter_config.json").write_text(json.dumps({"r": 0, "lora_alpha": 4.0}))
    with pytest.raises(MergeError, match="r >= 1"):
        merge_folder(step, tmp_path / "again")


# --- one backend against the fake server, its fake pod running the real pod side ----------------


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> Iterator[FakeRunpod]:
    key = f"rpa_TEST_{uuid.uuid4().hex}"
    server = FakeRunpod(
        key,
        [sys.executable, "-m", "tests.fakes.pod_runner"],
        tmp_path / "cloud",
        pod_cwd=REPO,
        image_env={
            "FAKE_TRAIN_STEPS": "3",
            "FAKE_STEP_S": "0.2",
            "FAKE_POD_MAX_S": "180",
            "FAKE_POD_MODEL": str(tiny_model_dir),
            "FAKE_POD_TIMELINE": str(tmp_path / "timeline"),
            "FAKE_POD_NO_SIGNAL_SUFFIX": "-3",
            "FAKE_POD_TAMPERED_SUFFIX": "-4",
        },
        boot_s=0.05,
        max_requests=3000,
    )
    server.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    monkeypatch.delenv("METARL_DATABASE_URL", raising=False)
    yield server
    server.stop()
    assert not server.overflowed
    assert server.pod_processes_alive() == []


def timeline(tmp_path: Path) -> list[dict[str, Any]]:
    rows = []
    for path in (tmp_path / "timeline").glob("*.jsonl"):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(rows, key=lambda row: row["t"])


def test_backend_publishes_the_eval_after_training_and_the_pod_scores_it(cloud: FakeRunpod, tmp_path: Path) -> None:
    ledger: list[tuple[int | None, CostItem]] = []
    config = RunpodTrainBackend(
        type="runpod",
        image="ghcr.io/metarl/inner:0.8.0",
        max_pods=2,
        warm_pool_size=1,
        poll_interval_s=0.1,
        startup_timeout_s=30,
        hang_timeout_s=30,
        billing_interval_s=1,
        api_timeout_s=2.0,
        api_backoff_s=0.01,
        capacity_cooldown_s=0.0,
    )
    pod_eval = PodVllmEvalBackend(type="pod_vllm", eval_timeout_s=150)
    artifacts = str(tmp_path / "artifacts")
    backend = RunpodTrain(config, artifacts, BudgetConfig(), ledger=lambda run, episode, items: ledger.extend((episode, i) for i in items), pod_eval=pod_eval)
    task = small_task(8)
    job = JobSpec(model=JobModel(name="Qwen/Qwen3-0.6B"))
    evaluator = PodVllmEval(pod_eval, artifacts)
    with pytest.raises(PermanentBackendError, match="no pod has scored"):
        evaluator.score_base(task, "Qwen/Qwen3-0.6B")

    polled, adopted = [], []
    for episode in (1, 2, 3, 4):
        ctx = EpisodeContext(run_id=RUN_ID, episode_id=episode, task=task, policy_version=0, probe_attempt=1, seed=1, artifacts_root=artifacts)
        launched = backend.launch(ctx, job, f"metarl-0a1b2c3d-{episode}")
        state, deadline = launched.state, time.monotonic() + 150
        attempt_dir = Path(artifacts) / "runpod" / "jobs" / f"metarl-0a1b2c3d-{episode}" / "a0"
        while time.monotonic() < deadline:
            # any poll before the request may publish it: the pod is frozen over that poll and the re-poll below, so that it
            # cannot answer (and delete the request) in between, and its exit report is read only once it is frozen (the
            # pod cannot write it between this read and the poll)
            frozen = state.get("eval_requested_at") is None and state.get("pod_id") is not None
            if frozen:
                cloud.hang(state["pod_id"])
            exit_written = (attempt_dir / EXIT_FILE).exists()
            result = backend.poll(ctx, job, launched.external_id, state)
            ledger.extend((episode, item) for item in result.costs)
            if state.get("eval_requested_at") is None and result.state.get("eval_requested_at") is not None:
                assert frozen and exit_written, "the eval request was published before the pod's exit report was written"
                # a worker that published and died before recording it: the next poll adopts the request, never writes another
                request_file = attempt_dir / REQUEST_FILE
                written = request_file.stat().st_mtime_ns
                again = backend.poll(ctx, job, launched.external_id, state)
                assert again.state["eval_requested_at"] == result.state["eval_requested_at"] and request_file.stat().st_mtime_ns == written
                adopted.append(episode)
            if frozen:
                cloud.thaw(state["pod_id"])
            state = result.state
            if result.status != "running":
                break
            time.sleep(0.1)
        polled.append((ctx, result))

    assert [outcome.status for _, outcome in polled] == ["succeeded"] * 3 + ["failed"], [outcome.error for _, outcome in polled]
    assert adopted == [1, 2, 4]  # every job whose eval was requested (job 3 needed none)
    (first_ctx, first), (second_ctx, second), (third_ctx, third), (_, fourth) = polled
    # job 4's pod could not check its scoring stack: no completions, the job fails, and the pod takes no next job
    assert "on-pod eval failed" in (fourth.error or "") and "cannot check the scoring stack" in (fourth.error or "")
    assert cloud.pods[fourth.state["pod_id"]].terminated
    assert first.state["eval_targets"] == ["trained", "base"] and second.state["eval_targets"] == ["trained"]  # the base was kept after the first
    # job 3 had no learning signal and saved nothing: its trained model is the base, whose completions are kept: no request at all
    assert third.state["trained_is_base"] and third.state["eval_targets"] == [] and third.checkpoint_uri is None
    assert second.state["pod_id"] == first.state["pod_id"], "the warm pod was not reused"
    trained = evaluator.score_trained(first_ctx, job, first.checkpoint_uri, first.state)
    base = evaluator.score_base(task, "Qwen/Qwen3-0.6B")
    assert trained.n_items == 8 and trained == base  # the fake's "trained" weights are a copy of the base model
    assert evaluator.score_trained(second_ctx, job, second.checkpoint_uri, second.state) == trained
    assert evaluator.score_trained(third_ctx, job, third.checkpoint_uri, third.state) == base
    assert not (Path(artifacts) / "runpod" / "jobs" / "metarl-0a1b2c3d-3" / "a0" / "eval").exists()
    assert Path(baseline_path(evaluator.store, task, "Qwen/Qwen3-0.6B")).is_file()
    for _, outcome in polled[:2]:
        attempt = Path(artifacts) / "runpod" / "jobs" / outcome.state["job_name"] / "a0"
        assert not (attempt / "eval" / "request.json").exists() and (attempt / "eval" / "result.json").is_file()

    # the pod's own record: no request while it trained; read only after exit.json; deleted after scoring
    events = timeline(tmp_path)
    for name in ("metarl-0a1b2c3d-1", "metarl-0a1b2c3d-2"):
        mine = [row for row in events if row["job"] == name]
        kinds = [row["event"] for row in mine]
        assert kinds[-4:] == ["training_ended", "exit_written", "request_read", "result_written"], kinds
        assert not any(row.get("request_present") for row in mine)
        assert mine[-1]["request_deleted"] and mine[-1]["error"] is None

    # eval seconds are billed as pod seconds of their own source, and every pod second exactly once
    backend.release_run(RUN_ID)
    assert cloud.live_pods() == []
    unique: dict[str, CostItem] = {}
    for _, item in ledger:
        unique.setdefault(item.key, item)  # the ledger keeps the first row of a key (ON CONFLICT DO NOTHING)
    assert any(item.source == "runpod_eval" for item in unique.values())
    billed: dict[str, float] = {}
    for item in unique.values():
        billed[item.key.split(":")[1]] = billed.get(item.key.split(":")[1], 0.0) + item.quantity
    assert billed == {row["pod_id"]: float(row["seconds"]) for row in cloud.billing() if row["seconds"]}


# --- what the agent's code could have left on the pod -------------------------------------------


def test_the_scoring_stack_is_checked_against_the_images_manifest(tmp_path: Path) -> None:
    from metarl.backends.runpod.pod.eval_server import verify_manifest, write_manifest

    venv = tmp_path / "venv" / "site-packages"
    (venv / "vllm" / "__pycache__").mkdir(parents=True)
    (venv / "vllm" / "__init__.py").write_text("real = True\n")
    (venv / "vllm" / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"compiled")
    (venv / "vllm" / "kernel.so").write_bytes(b"\x7fELF")
    (venv / "libcuda.so.1").symlink_to(venv / "vllm" / "kernel.so")
    manifest = tmp_path / "stack.json"
    assert write_manifest([tmp_path / "venv"], manifest) == 3  # __pycache__ is never recorded (the scoring has its own)
    assert verify_manifest(manifest) == []
    # what a job legitimately adds: its package and dist-info, bytecode, data files
    package = venv / "metarl_env_0123456789ab"
    package.mkdir()
    (package / "__init__.py").write_text("import os\n")
    (venv / "metarl_env_0123456789ab-0.1.0.dist-info").mkdir()
    (venv / "metarl_env_0123456789ab-0.1.0.dist-info" / "RECORD").write_text("")
    (venv / "vllm" / "__pycache__" / "other.cpython-312.pyc").write_bytes(b"planted, but never read")
    (venv / "notes.json").write_text("{}")
    assert verify_manifest(manifest) == []
    # what it must not: change a recorded file, add an importable one, a start-up hook, re-point a link
    (venv / "vllm" / "__init__.py").write_text("real = False\n")
    (venv / "flash_attn.py").write_text("print('optional import hijacked')\n")
    (venv / "zz.pth").write_text("import os\n")
    (venv / "libcuda.so.1").unlink()
    (venv / "libcuda.so.1").symlink_to(venv / "notes.json")
    problems = verify_manifest(manifest)
    assert len(problems) == 4 and any("vllm/__init__.py: content changed" in p for p in problems)
    assert (
        any("flash_attn.py: new importable file" in p for p in problems) and any("zz.pth" in p for p in problems) and any("link changed" in p for p in problems)
    )


def test_a_modified_stack_is_refused_and_the_prompts_still_deleted(tmp_path: Path) -> None:
    from metarl.backends.runpod.pod.eval_server import EvalServer, EvalSettings, write_manifest
    from metarl.backends.runpod.pod.storage import Storage

    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "vllm.py").write_text("ok\n")
    write_manifest([stack], tmp_path / "stack.json")
    (stack / "vllm.py").write_text("tampered\n")
    results = tmp_path / "results"
    request = eval_request(small_task(8), PodVllmEvalBackend(type="pod_vllm"), request_id="j:a0", targets=["trained"], published_at=1.0)
    (results / "eval").mkdir(parents=True)
    (results / REQUEST_FILE).write_text(request.model_dump_json())
    settings = EvalSettings(
        python_command=[sys.executable, "-c", "raise SystemExit('the scoring must not run')"],
        poll_s=0.05,
        wait_s=5,
        stack_manifest=str(tmp_path / "stack.json"),
    )
    served = EvalServer(Storage(str(results)), settings, tmp_path / "scratch", {}).serve(tmp_path, "Qwen/Qwen3-0.6B")
    assert served is not None and served.outputs == {} and "differs from the image" in (served.error or "")
    assert not (results / REQUEST_FILE).exists() and not (tmp_path / "scratch").exists()


def test_the_scoring_runs_with_private_caches(tmp_path: Path) -> None:
    from metarl.backends.runpod.pod.eval_server import private_environment

    env = private_environment({"PATH": "/bin", "HF_HOME": "/home/appuser/.cache/hf", "HF_HUB_OFFLINE": "1"}, tmp_path, fresh_hub_cache=True)
    assert env["PATH"] == "/bin" and env["HOME"].startswith(str(tmp_path)) and env["PYTHONPYCACHEPREFIX"].startswith(str(tmp_path))
    assert all(env[name].startswith(str(tmp_path)) for name in ("XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME"))
    assert "HF_HUB_OFFLINE" not in env
    kept = private_environment({"HF_HOME": "/cache/hf"}, tmp_path, fresh_hub_cache=False)
    assert kept["HF_HOME"] == "/cache/hf"


def test_base_scores_on_the_pod_are_keyed_by_the_hub_model_and_the_engine_settings() -> None:
    from metarl import composition as registry
    from metarl.runconfig import load_run
    from tests.conftest import REPO

    config, specs = load_run(REPO / "examples" / "runpod.toml")
    assert config.backends.eval.type == "pod_vllm"
    key = registry.base_score_key(config, specs["addition"], "Qwen/Qwen3-0.6B")
    assert key.model_build == "Qwen/Qwen3-0.6B@main" and key.backend == "pod_vllm"
    other = config.model_copy(update={"backends": config.backends.model_copy(update={"eval": config.backends.eval.model_copy(update={"dtype": "float16"})})})
    assert registry.base_score_key(other, specs["addition"], "Qwen/Qwen3-0.6B") != key
