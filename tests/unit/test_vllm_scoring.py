"""The vLLM scorer shares the local scorer's prompts, stop handling and grading; only generation differs.

vllm is not installed here (and there is no GPU): a fake generator with ``vllm.LLM.generate``'s call
shape, returning objects shaped like vLLM's ``RequestOutput``/``CompletionOutput``, is fed the exact
token ids the torch scorer generated for a tiny model. The scores must be equal, field for field.
``scripts/check_vllm_gpu.py`` checks real vLLM against the torch scorer on a GPU host.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from metarl import composition as registry
from metarl.backends.local.config import LocalEvalBackend
from metarl.backends.local.train import LocalEval
from metarl.backends.vllm.config import VllmEvalBackend
from metarl.backends.vllm.eval import VllmEval, checkpoint_folder
from metarl.backends.vllm.scoring import (
    completions_from_outputs,
    engine_kwargs,
    resolve_model_len,
    sampling_kwargs,
    score_with_llm,
    vllm_prompts,
)
from metarl.errors import PermanentBackendError
from metarl.learning import scoring
from metarl.learning.models import ensure_base_model
from metarl.learning.registry import get_family
from metarl.learning.sampling import CompletionBatch, decode_completions, mask_after_eos
from metarl.learning.scoring import (
    PASS_K_TEMPERATURE,
    format_prompt,
    load_model,
    max_completion_tokens,
    pass_k_seed,
    score_loaded_model,
)
from metarl.learning.tokenizer import load_tokenizer
from schemas.base import ConfigError, load_toml_model
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

TINY_SCALE = 0.01
REPO = Path(__file__).resolve().parents[2]
N_ITEMS = 40


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-s base model pretrained for a handful of steps (same cache as test_learning_models)."""
    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=TINY_SCALE)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path):
    """(model, tokenizer) of the tiny base model."""
    return load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)


@dataclass
class FakeCompletionOutput:
    """Shaped like ``vllm.CompletionOutput`` (only the fields the scorer may read)."""

    index: int
    token_ids: list[int]
    text: str = "(vLLM's own detokenisation; the scorer decodes token_ids itself)"
    finish_reason: str = "stop"


@dataclass
class FakeRequestOutput:
    """Shaped like ``vllm.RequestOutput``."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput]
    finished: bool = True


@dataclass
class FakeSamplingParams:
    """Records the keyword arguments a ``vllm.SamplingParams`` would be built with."""

    kwargs: dict[str, Any]

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs


@dataclass
class FakeLLM:
    """Stands in for ``vllm.LLM``: answers each prompt with the completions the torch scorer generated for it."""

    torch_prompts: list[list[int]]
    torch_completions: list[list[list[int]]]
    received_prompts: list[Any] = field(default_factory=list)
    received_params: list[Any] = field(default_factory=list)

    def generate(self, prompts, sampling_params, use_tqdm: bool = True):
        self.received_prompts = list(prompts)
        self.received_params.append(sampling_params)
        outputs = []
        for number, prompt in enumerate(prompts):
            ids = prompt["prompt_token_ids"]
            assert ids == self.torch_prompts[number], "vLLM must get the torch scorer's prompt token ids"
            samples = [FakeCompletionOutput(index=index, token_ids=row) for index, row in enumerate(self.torch_completions[number])]
            assert len(samples) == sampling_params.kwargs["n"]
            outputs.append(FakeRequestOutput(request_id=str(number), prompt_token_ids=ids, outputs=samples[::-1]))
        return outputs


def vllm_style(row: list[int], eos_id: int) -> list[int]:
    """A torch completion row as vLLM returns it: tokens up to and including EOS, no padding after."""
    return row[: row.index(eos_id) + 1] if eos_id in row else row


def with_answers(result: CompletionBatch, tokenizer, items, every: int) -> CompletionBatch:
    """``result`` with every ``every``-th row replaced by the item's answer and EOS (so some items are solved)."""
    rows = result.token_ids.tolist()
    for index in range(0, len(rows), every):
        rows[index] = tokenizer(items[index].answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    width = max(len(row) for row in rows)
    token_ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    mask = mask_after_eos(token_ids, tokenizer.eos_token_id)
    return CompletionBatch(token_ids=token_ids, logprobs=torch.zeros(token_ids.shape), mask=mask)


def record_torch_run(monkeypatch: pytest.MonkeyPatch, model, tokenizer, family, items, pass_k: int, answer_every: int | None = None):
    """Run the local scorer while recording the prompt ids it fed and the completion ids it generated.

    With ``answer_every``, every so many items get their right answer instead (a tiny model solves
    almost nothing), so exact-match counting is exercised too.
    """
    calls: list[tuple[Any, Any]] = []
    real = scoring.sample_completions

    def recording(model_, prompts, **kwargs):
        result = real(model_, prompts, **kwargs)
        if answer_every is not None:
            result = with_answers(result, tokenizer, items, answer_every + len(calls))
        calls.append((prompts, result))
        return result

    monkeypatch.setattr(scoring, "sample_completions", recording)
    score = score_loaded_model(model, tokenizer, family, items, pass_k=pass_k, seed=7)
    monkeypatch.setattr(scoring, "sample_completions", real)
    assert len(calls) == pass_k, "one batch per round (the eval is smaller than EVAL_BATCH_SIZE)"
    prompt_ids = [[token for token, keep in zip(row, mask) if keep] for row, mask in zip(calls[0][0].input_ids.tolist(), calls[0][0].attention_mask.tolist())]
    rounds = [[vllm_style(row, tokenizer.eos_token_id) for row in result.token_ids.tolist()] for _, result in calls]
    per_item = [[rounds[index][item] for index in range(pass_k)] for item in range(len(items))]
    return score, prompt_ids, per_item, calls


@pytest.mark.parametrize("family_name, pass_k, answer_every", [("addition", 1, None), ("reversal", 1, 3), ("date_format", 1, 2), ("sorting", 3, 4)])
def test_vllm_path_scores_the_torch_completions_exactly_like_the_local_scorer(
    monkeypatch: pytest.MonkeyPatch, loaded, family_name: str, pass_k: int, answer_every: int | None
) -> None:
    model, tokenizer = loaded
    family = get_family(family_name)
    items = family.hidden_eval(N_ITEMS, 1)
    local, torch_prompts, torch_completions, _ = record_torch_run(monkeypatch, model, tokenizer, family, items, pass_k, answer_every)
    if answer_every is not None:
        assert 0.0 < local.mean < 1.0
    llm = FakeLLM(torch_prompts=torch_prompts, torch_completions=torch_completions)

    score = score_with_llm(llm, tokenizer, family, items, pass_k=pass_k, seed=7, sampling_params_class=FakeSamplingParams)

    assert score == local
    assert score.model_dump() == local.model_dump()
    assert [prompt["prompt_token_ids"] for prompt in llm.received_prompts] == torch_prompts
    assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in torch_prompts] == [format_prompt(item) for item in items]
    assert all(ids[0] == tokenizer.bos_token_id for ids in torch_prompts)
    assert llm.received_params[0].kwargs == sampling_kwargs(tokenizer, family, pass_k=pass_k, seed=7)


def test_completions_are_decoded_by_the_torch_scorers_rule_with_or_without_the_eos_id(monkeypatch: pytest.MonkeyPatch, loaded) -> None:
    model, tokenizer = loaded
    family = get_family("caesar")
    items = family.hidden_eval(N_ITEMS, 1)
    _, _, per_item, calls = record_torch_run(monkeypatch, model, tokenizer, family, items, 1)
    torch_texts = decode_completions(tokenizer, calls[0][1])
    with_eos = [FakeRequestOutput(str(i), [], [FakeCompletionOutput(0, rows[0])]) for i, rows in enumerate(per_item)]
    without_eos = [
        FakeRequestOutput(str(i), [], [FakeCompletionOutput(0, [t for t in rows[0] if t != tokenizer.eos_token_id])]) for i, rows in enumerate(per_item)
    ]
    assert completions_from_outputs(tokenizer, with_eos, n_items=len(items), pass_k=1) == [[text] for text in torch_texts]
    assert completions_from_outputs(tokenizer, without_eos, n_items=len(items), pass_k=1) == [[text] for text in torch_texts]


def test_a_short_or_ragged_vllm_answer_is_an_error_not_a_wrong_score(loaded) -> None:
    _, tokenizer = loaded
    one = FakeRequestOutput("0", [], [FakeCompletionOutput(0, [tokenizer.eos_token_id])])
    with pytest.raises(ValueError, match="2 prompts"):
        completions_from_outputs(tokenizer, [one], n_items=2, pass_k=1)
    with pytest.raises(ValueError, match="pass@3"):
        completions_from_outputs(tokenizer, [one], n_items=1, pass_k=3)


def test_sampling_params_greedy_and_pass_k(loaded) -> None:
    _, tokenizer = loaded
    family = get_family("date_format")
    greedy = sampling_kwargs(tokenizer, family, pass_k=1, seed=5)
    assert greedy["n"] == 1 and greedy["temperature"] == 0.0 and "seed" not in greedy
    for kwargs in (greedy, sampling_kwargs(tokenizer, family, pass_k=4, seed=5)):
        assert kwargs["max_tokens"] == max_completion_tokens(family)
        assert kwargs["stop_token_ids"] == [tokenizer.eos_token_id]
        allowed = set(kwargs["allowed_token_ids"])
        assert tokenizer.pad_token_id not in allowed and tokenizer.bos_token_id not in allowed
        assert allowed == set(range(len(tokenizer))) - {tokenizer.pad_token_id, tokenizer.bos_token_id}
    sampled = sampling_kwargs(tokenizer, family, pass_k=4, seed=5)
    assert sampled["n"] == 4 and sampled["temperature"] == PASS_K_TEMPERATURE and sampled["top_p"] == 1.0
    # vLLM seeds child i of an n>1 request with seed + i: the torch scorer's round-i seeds.
    assert [sampled["seed"] + index for index in range(4)] == [pass_k_seed(5, index) for index in range(4)]
    assert sampling_kwargs(tokenizer, family, pass_k=4, seed=6)["seed"] != sampled["seed"]


def test_engine_settings_come_from_the_config_and_the_context_fits_the_eval(tiny_model_dir: Path) -> None:
    config = VllmEvalBackend(type="vllm", dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=2, seed=3)
    kwargs = engine_kwargs(tiny_model_dir, config, 40)
    assert kwargs == {
        "model": str(tiny_model_dir),
        "tokenizer": str(tiny_model_dir),
        "dtype": "float32",
        "gpu_memory_utilization": 0.5,
        "max_model_len": 40,
        "tensor_parallel_size": 2,
        "seed": 3,
        "generation_config": "vllm",
    }
    assert resolve_model_len(config, 37) == 37
    assert resolve_model_len(config.model_copy(update={"max_model_len": 64}), 37) == 64
    with pytest.raises(ValueError, match="backends.eval.max_model_len"):
        resolve_model_len(config.model_copy(update={"max_model_len": 20}), 37)


def test_vllm_prompts_are_token_prompts_of_the_formatted_items(loaded) -> None:
    _, tokenizer = loaded
    items = get_family("max_of_list").hidden_eval(8, 1)
    prompts = vllm_prompts(tokenizer, items)
    assert [set(prompt) for prompt in prompts] == [{"prompt_token_ids"}] * len(items)
    assert [tokenizer.decode(prompt["prompt_token_ids"][1:]) for prompt in prompts] == [format_prompt(item) for item in items]


# -- config and backend ---------------------------------------------------------------------------


def run_config(eval_table: dict[str, Any]) -> dict[str, Any]:
    """A small run config (simulated agent and outer, local training: vLLM scores its checkpoints) with the given eval backend table."""
    return {
        "run": {"name": "vllm-eval", "tasks": ["addition"]},
        "backends": {"agent": {"type": "sim"}, "train": {"type": "local"}, "eval": eval_table, "outer": {"type": "sim"}},
    }


def test_vllm_eval_config_parses_with_bounds(tmp_path: Path) -> None:
    import tomli_w

    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(run_config({"type": "vllm", "dtype": "float32", "max_model_len": 128})), encoding="utf-8")
    config = load_toml_model(RunConfig, path)
    assert isinstance(config.backends.eval, VllmEvalBackend)
    assert config.backends.eval.gpu_memory_utilization == 0.85 and config.backends.eval.tensor_parallel_size == 1
    path.write_text(tomli_w.dumps(run_config({"type": "vllm", "gpu_memory_utilization": 1.5, "dtype": "int3"})), encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_toml_model(RunConfig, path)
    assert {problem.field for problem in error.value.problems} == {"backends.eval.gpu_memory_utilization", "backends.eval.dtype"}


def test_selecting_vllm_without_vllm_installed_names_the_field_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import metarl.backends.vllm.scoring

    monkeypatch.setattr(metarl.backends.vllm.scoring, "vllm_available", lambda: False)
    config = RunConfig.model_validate(run_config({"type": "vllm"}))
    with pytest.raises(ConfigError) as error:
        registry.eval_backend(config)
    assert error.value.problems[0].field == "backends.eval.type"
    assert "pip install -e .[gpu]" in error.value.problems[0].fix
    monkeypatch.setattr(metarl.backends.vllm.scoring, "vllm_available", lambda: True)
    assert isinstance(registry.eval_backend(config), VllmEval)


def test_checkpoints_must_be_local_weight_folders(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert checkpoint_folder(str(tiny_model_dir)) == tiny_model_dir
    assert checkpoint_folder(tiny_model_dir.as_uri()) == tiny_model_dir
    with pytest.raises(PermanentBackendError, match="local folders only"):
        checkpoint_folder("s3://bucket/run/checkpoint")
    with pytest.raises(PermanentBackendError, match="config.json"):
        checkpoint_folder(str(tmp_path))


FAKE_VLLM = textwrap.dedent(
    '''
    """A stand-in ``vllm`` package for one test: LLM.generate runs the torch sampler on the given token ids."""
    import os

    import torch

    from metarl.learning.sampling import PromptBatch, sample_completions
    from metarl.learning.scoring import load_model
    from metarl.learning.tokenizer import load_tokenizer


    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)


    class _Out:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)


    class LLM:
        def __init__(self, model, **kwargs):
            assert kwargs["generation_config"] == "vllm"
            assert "SOME_API_KEY" not in os.environ, "secrets are not passed to the scoring subprocess"
            self.model = load_model(model)
            self.tokenizer = load_tokenizer(model)

        def generate(self, prompts, params, use_tqdm=True):
            assert params.n == 1 and params.temperature == 0.0
            ids = [prompt["prompt_token_ids"] for prompt in prompts]
            width = max(len(row) for row in ids)
            pad = self.tokenizer.pad_token_id
            batch = PromptBatch(
                input_ids=torch.tensor([[pad] * (width - len(row)) + row for row in ids]),
                attention_mask=torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids]),
            )
            allowed = set(params.allowed_token_ids)
            forbidden = tuple(token for token in range(len(self.tokenizer)) if token not in allowed)
            result = sample_completions(
                self.model, batch, max_tokens=params.max_tokens, eos_id=params.stop_token_ids[0], pad_id=pad,
                forbidden_ids=forbidden, greedy=True,
            )
            return [
                _Out(request_id=str(i), prompt_token_ids=ids[i], outputs=[_Out(index=0, token_ids=row, text="")])
                for i, row in enumerate(result.token_ids.tolist())
            ]
    '''
)


def test_backend_scores_in_a_subprocess_and_matches_the_local_backend(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, tmp_path: Path) -> None:
    """End to end through `python -m metarl.backends.vllm.scoring`, with a fake vllm package on PYTHONPATH."""
    fake_root = tmp_path / "fake-site"
    (fake_root / "vllm").mkdir(parents=True)
    (fake_root / "vllm" / "__init__.py").write_text(FAKE_VLLM, encoding="utf-8")
    monkeypatch.syspath_prepend(str(fake_root))
    monkeypatch.setenv("PYTHONPATH", f"{fake_root}:{REPO}")
    monkeypatch.setenv("SOME_API_KEY", "must-not-reach-the-subprocess")
    sys.modules.pop("vllm", None)
    spec = load_toml_model(TaskSpec, REPO / "tasks_specs" / "addition.toml")
    task = spec.model_copy(update={"hidden_eval": spec.hidden_eval.model_copy(update={"n_items": 24})})
    cache = str(tiny_model_dir.parent)

    vllm_score = VllmEval(VllmEvalBackend(type="vllm", model_scale=TINY_SCALE, model_cache_dir=cache)).score_base(task, "local-s")
    local_score = LocalEval(LocalEvalBackend(type="local", model_scale=TINY_SCALE, model_cache_dir=cache)).score_base(task, "local-s")

    assert vllm_score == local_score

    # a Runpod job without learning signal that saved no weights: its trained model is the base
    from metarl.interfaces import EpisodeContext
    from schemas.job import JobModel, JobSpec

    ctx = EpisodeContext(run_id="r", episode_id=1, task=task, policy_version=0, probe_attempt=1, seed=0, artifacts_root=str(tmp_path))
    job = JobSpec(model=JobModel(name="Qwen/Qwen3-0.6B"))  # stands in as local-s
    backend = VllmEval(VllmEvalBackend(type="vllm", model_scale=TINY_SCALE, model_cache_dir=cache))
    assert backend.score_trained(ctx, job, None, {"trained_is_base": True}) == vllm_score
    with pytest.raises(PermanentBackendError, match="no checkpoint"):
        backend.score_trained(ctx, job, None, {})
