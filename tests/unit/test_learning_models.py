"""Tokenizer, base-model cache, sampler, LoRA and scorer on tiny (fast-scale) local models."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest
import torch

from metarl.learning import models as models_module
from metarl.learning.families import Example, TaskFamily
from metarl.learning.grpo import token_logprobs
from metarl.learning.lora import adapters_disabled, apply_lora, merge_lora
from metarl.learning.models import (
    BASE_MODELS,
    BUILD_INFO_FILE,
    MODEL_CATALOG,
    build_info,
    build_key,
    default_cache_dir,
    ensure_base_model,
    resolve_model_name,
)
from metarl.learning.registry import FAMILIES, get_family
from metarl.learning.runtime import threads_per_job
from metarl.learning.sampling import (
    completion_logits,
    decode_completions,
    encode_prompts,
    sample_completions,
)
from metarl.learning.scoring import (
    EvalScore,
    format_prompt,
    load_model,
    score_checkpoint,
    score_loaded_model,
    wilson_interval,
)
from metarl.learning.tokenizer import (
    UNK_TOKEN,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
)

TINY_SCALE = 0.01


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local-s base model pretrained for a handful of steps, shared by the session."""
    return ensure_base_model("local-s", tmp_path_factory.getbasetemp() / "metarl-models", scale=TINY_SCALE)


def test_tokenizer_round_trips_every_family_and_loads_with_auto_tokenizer(tmp_path: Path) -> None:
    save_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    unk_id = tokenizer.convert_tokens_to_ids(UNK_TOKEN)
    rng = random.Random(0)
    for family in FAMILIES.values():
        for _ in range(50):
            example = family.generate(rng, rng.random())
            for text in (example.prompt, example.answer):
                ids = tokenizer(text)["input_ids"]
                assert ids[0] == tokenizer.bos_token_id
                assert unk_id not in ids
                assert len(ids) == len(text) + 1
                assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_left_pads() -> None:
    tokenizer = build_tokenizer()
    batch = encode_prompts(tokenizer, ["add 1+2=", "rev ab>"])
    assert batch.attention_mask[1, 0].item() == 0
    assert batch.input_ids[1, 0].item() == tokenizer.pad_token_id


def test_model_names_and_catalog() -> None:
    assert MODEL_CATALOG == {"Qwen/Qwen3-0.6B": "local-s", "Qwen/Qwen3-1.7B": "local-l"}
    assert resolve_model_name("Qwen/Qwen3-1.7B") == "local-l"
    assert resolve_model_name("local-s") == "local-s"
    with pytest.raises(KeyError) as raised:
        resolve_model_name("gpt2")
    assert "local-s" in str(raised.value) and "Qwen/Qwen3-0.6B" in str(raised.value)


def test_build_key_depends_on_model_and_scale() -> None:
    small = BASE_MODELS["local-s"]
    assert build_key(small, 1.0) == build_key(small, 1.0)
    assert build_key(small, 1.0) != build_key(small, 0.5)
    assert build_key(small, 1.0) != build_key(BASE_MODELS["local-l"], 1.0)


class ShoutFamily(TaskFamily):
    """A family this repo never had: upper-case a word, with characters outside the tokenizer's own."""

    name = "shout"
    description = "Shout a word: 'crie WORD→' answers the word in upper case with an exclamation mark."
    max_answer_chars = 8
    grader = {"kind": "positional", "max_chars": 8}

    def __init__(self, mark: str = "!") -> None:
        self.mark = mark

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        word = "".join(rng.choice("abcdeé") for _ in range(2 + round(difficulty * 3)))
        return Example(prompt=f"crie {word}→", answer=word.upper() + self.mark)

    def item_key(self, prompt: str) -> str:
        return prompt


def test_build_key_follows_the_families_content() -> None:
    small = BASE_MODELS["local-s"]
    six = models_module.family_set_content(FAMILIES)
    assert not six.byte_fallback and sorted(six.digests) == sorted(FAMILIES)
    assert build_key(small, 1.0) == build_key(small, 1.0, six)
    assert models_module.base_model_build("local-s") == f"local-s-{build_key(small, 1.0, six)}"
    with_shout = models_module.family_set_content({**FAMILIES, "shout": ShoutFamily()})
    assert with_shout.byte_fallback and with_shout.digests["addition"] == six.digests["addition"]
    other_items = models_module.family_set_content({**FAMILIES, "shout": ShoutFamily(mark="?")})
    described = ShoutFamily()
    described.description = "Another description."
    other_text = models_module.family_set_content({**FAMILIES, "shout": described})
    keys = {build_key(small, 1.0, content) for content in (six, with_shout, other_items, other_text)}
    assert len(keys) == 4
    assert build_key(small, 1.0, with_shout) == build_key(small, 1.0, models_module.family_set_content({**FAMILIES, "shout": ShoutFamily()}))


def test_a_family_may_add_its_own_content_digest() -> None:
    class FromFiles(ShoutFamily):
        def __init__(self, files_hash: str) -> None:
            super().__init__()
            self.files_hash = files_hash

        def content_digest(self) -> str:
            return self.files_hash

    assert models_module.family_content_digest(FromFiles("a")) != models_module.family_content_digest(FromFiles("b"))


def test_the_recipe_keeps_the_six_families_and_weighs_a_new_one_like_them() -> None:
    recipe = BASE_MODELS["local-s"].recipe
    assert models_module.recipe_for_families(recipe, sorted(FAMILIES)) is recipe
    with_shout = models_module.recipe_for_families(recipe, [*FAMILIES, "shout"])
    assert with_shout.family_weights == {**recipe.family_weights, "shout": 1.0}
    assert models_module.recipe_for_families(recipe, ["shout"]).family_weights == {"shout": 1.0}
    with pytest.raises(ValueError):
        models_module.family_set_content({})


def test_a_base_model_for_a_new_family_uses_the_byte_fallback(tmp_path: Path) -> None:
    families = {"addition": FAMILIES["addition"], "shout": ShoutFamily()}
    model_dir = ensure_base_model("local-s", tmp_path, scale=0.005, families=families)
    assert model_dir.name == models_module.base_model_build("local-s", 0.005, families)
    assert model_dir != ensure_base_model("local-s", tmp_path, scale=0.005, families={"addition": FAMILIES["addition"]})
    info = build_info(model_dir)
    assert info["families"]["byte_fallback"] and sorted(info["recipe"]["family_weights"]) == ["addition", "shout"]
    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir)
    assert model.config.vocab_size == len(tokenizer) == 4 + 50 + 256
    example = ShoutFamily().generate(random.Random(0), 1.0)
    ids = tokenizer(example.prompt)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == example.prompt
    score = score_loaded_model(model, tokenizer, ShoutFamily(), [example] * 4)
    assert 0.0 <= score.mean <= 1.0


def test_default_cache_dir_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("METARL_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("METARL_CACHE_DIR")
    assert default_cache_dir() == Path("~/.cache/metarl/models").expanduser()


def test_model_sizes_are_in_range() -> None:
    from transformers import Qwen3ForCausalLM

    sizes = {
        name: sum(parameter.numel() for parameter in Qwen3ForCausalLM(models_module.qwen3_config(spec.architecture)).parameters())
        for name, spec in BASE_MODELS.items()
    }
    assert 150_000 <= sizes["local-s"] <= 320_000
    assert 1_000_000 <= sizes["local-l"] <= 2_000_000


def test_built_model_has_hugging_face_files(tiny_model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", BUILD_INFO_FILE):
        assert (tiny_model_dir / name).exists(), name
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    info = build_info(tiny_model_dir)
    assert info["name"] == "local-s" and info["scale"] == TINY_SCALE
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    AutoTokenizer.from_pretrained(str(tiny_model_dir), local_files_only=True)


def test_ensure_base_model_builds_once_under_concurrency(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    builds: list[str] = []
    real_build = models_module._build_into

    def counting_build(target: Path, spec, scale: float, *family_args) -> None:
        builds.append(target.name)
        real_build(target, spec, scale, *family_args)

    monkeypatch.setattr(models_module, "_build_into", counting_build)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_base_model("local-s", tmp_path, scale=TINY_SCALE))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert len(set(results)) == 1 and len(results) == 3
    assert ensure_base_model("Qwen/Qwen3-0.6B", tmp_path, scale=TINY_SCALE) == results[0]
    assert len(builds) == 1
    leftovers = [path.name for path in tmp_path.iterdir() if path.name.startswith(".")]
    assert leftovers == []


def test_ensure_base_model_rejects_bad_scale(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ensure_base_model("local-s", tmp_path, scale=0.0)


def test_sampler_masks_after_eos_and_never_samples_pad_or_bos(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = encode_prompts(tokenizer, ["add 1+2=", "rev abcdef>", "max 12,34="] * 4)
    completions = sample_completions(
        model,
        prompts,
        max_tokens=8,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        forbidden_ids=(tokenizer.pad_token_id, tokenizer.bos_token_id),
        temperature=1.5,
        generator=torch.Generator().manual_seed(0),
    )
    live_tokens = completions.token_ids[completions.mask.bool()]
    assert tokenizer.pad_token_id not in live_tokens.tolist()
    assert tokenizer.bos_token_id not in live_tokens.tolist()
    for row_tokens, row_mask in zip(completions.token_ids.tolist(), completions.mask.tolist()):
        if tokenizer.eos_token_id in row_tokens:
            eos_at = row_tokens.index(tokenizer.eos_token_id)
            assert row_mask[: eos_at + 1] == [1] * (eos_at + 1)
            assert sum(row_mask[eos_at + 1 :]) == 0
    assert (completions.logprobs[completions.mask == 0] == 0).all()
    assert (completions.logprobs[completions.mask == 1] < 0).all()


def test_sampled_logprobs_match_teacher_forced_logprobs(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = encode_prompts(tokenizer, ["add 1+2=", "rev abcdef>", "date 1999-01-02>"])
    completions = sample_completions(
        model,
        prompts,
        max_tokens=10,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        forbidden_ids=(tokenizer.pad_token_id, tokenizer.bos_token_id),
        temperature=0.8,
        generator=torch.Generator().manual_seed(1),
    )
    with torch.no_grad():
        logits = completion_logits(model, prompts, completions.token_ids, completions.mask, (tokenizer.pad_token_id, tokenizer.bos_token_id))
    recomputed = token_logprobs(logits, completions.token_ids, 0.8, completions.mask)
    assert torch.allclose(recomputed, completions.logprobs, atol=1e-3)


def test_greedy_output_does_not_depend_on_padding(tiny_model_dir: Path) -> None:
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    kwargs = {
        "max_tokens": 6,
        "eos_id": tokenizer.eos_token_id,
        "pad_id": tokenizer.pad_token_id,
        "forbidden_ids": (tokenizer.pad_token_id, tokenizer.bos_token_id),
        "greedy": True,
    }
    alone = sample_completions(model, encode_prompts(tokenizer, ["add 1+2="]), **kwargs)
    padded = sample_completions(model, encode_prompts(tokenizer, ["add 1+2=", "date 1999-01-02>"]), **kwargs)
    assert decode_completions(tokenizer, alone)[0] == decode_completions(tokenizer, padded)[0]


def test_lora_starts_as_identity_merges_exactly_and_can_be_disabled(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir)
    input_ids = torch.tensor([[1, 14, 17, 17, 40, 5, 41, 6, 43]])
    with torch.no_grad():
        reference = model(input_ids=input_ids).logits
    torch.manual_seed(0)
    trainable = apply_lora(model, rank=4, alpha=8.0)
    assert 0 < trainable < sum(parameter.numel() for parameter in model.parameters())
    with torch.no_grad():
        assert torch.allclose(model(input_ids=input_ids).logits, reference, atol=1e-6)
        for name, parameter in model.named_parameters():
            if name.endswith("lora_b"):
                parameter.normal_(0.0, 0.05)
        adapted = model(input_ids=input_ids).logits
        with adapters_disabled(model):
            assert torch.allclose(model(input_ids=input_ids).logits, reference, atol=1e-6)
    assert not torch.allclose(adapted, reference, atol=1e-4)
    merge_lora(model)
    assert not any("lora" in name for name, _ in model.named_parameters())
    with torch.no_grad():
        assert torch.allclose(model(input_ids=input_ids).logits, adapted, atol=1e-4)


def test_wilson_interval() -> None:
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-3) and high == pytest.approx(0.5962, abs=1e-3)
    assert wilson_interval(0, 20)[0] == 0.0
    assert wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_score_checkpoint_returns_bounded_deterministic_scores(tiny_model_dir: Path) -> None:
    family = get_family("caesar")
    items = family.hidden_eval(40)
    first = score_checkpoint(tiny_model_dir, "caesar", items)
    assert isinstance(first, EvalScore)
    assert first.n == 40 and first.pass_k == 1
    assert first.ci_low <= first.mean <= first.ci_high
    assert score_checkpoint(tiny_model_dir, family, items) == first
    sampled = score_checkpoint(tiny_model_dir, family, items, pass_k=3, seed=5)
    assert sampled == score_checkpoint(tiny_model_dir, family, items, pass_k=3, seed=5)
    assert sampled.pass_k == 3


def test_perfect_model_scores_one(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from metarl.learning import scoring

    family = get_family("addition")
    items = family.hidden_eval(10)
    answers = {example.prompt: example.answer for example in items}
    monkeypatch.setattr(scoring, "generate_texts", lambda model, tokenizer, prompts, **kwargs: [answers[p] for p in prompts])
    score = score_loaded_model(None, None, family, items)
    assert score.mean == 1.0 and score.partial_mean == 1.0


def test_format_prompt_is_the_prompt() -> None:
    assert format_prompt(Example(prompt="add 1+2=", answer="3")) == "add 1+2="


def test_threads_per_job_splits_the_cores_between_concurrent_trainers() -> None:
    assert threads_per_job(1, cores=2) == 2
    assert threads_per_job(2, cores=2) == 1
    assert threads_per_job(3, cores=8) == 2
    assert threads_per_job(4, cores=2) == 1  # never below one thread
    assert threads_per_job(2, requested=2, cores=2) == 2  # an explicit setting wins
    assert threads_per_job(1, requested=16, cores=2) == 2  # ... capped at the usable cores


def test_distance_outside_band_sums_each_familys_shortfall_and_overshoot() -> None:
    assert models_module.distance_outside_band({"a": 0.2, "b": 0.3}, 0.12, 0.4) == 0.0
    assert models_module.distance_outside_band({"a": 0.02, "b": 0.9}, 0.12, 0.4) == pytest.approx(0.1 + 0.5)
    assert models_module.families_below_target({"b": 0.05, "a": 0.12, "c": 0.0}, 0.12) == ["b", "c"]


def test_a_recipe_with_its_ceiling_below_its_target_is_refused() -> None:
    recipe = BASE_MODELS["local-s"].recipe.model_dump()
    with pytest.raises(ValueError, match="ceiling_accuracy"):
        models_module.PretrainRecipe(**{**recipe, "target_accuracy": 0.3, "ceiling_accuracy": 0.2})


def _scripted_pretrain(monkeypatch: pytest.MonkeyPatch, steps: int, accuracies: list[dict[str, float]]):
    """Pretrain a small local-s for ``steps`` steps with the validation accuracies of its checks scripted."""
    scripted = iter(accuracies)
    monkeypatch.setattr(models_module, "validation_accuracy", lambda *args, **kwargs: next(scripted))
    spec = BASE_MODELS["local-s"]
    recipe = spec.recipe.model_copy(update={"steps": steps, "check_every": 2, "batch_size": 4, "warmup_steps": 0})
    return models_module.pretrain(spec, recipe, build_tokenizer())


def test_pretraining_keeps_the_checkpoint_nearest_the_band_when_a_family_overshoots_later(monkeypatch: pytest.MonkeyPatch) -> None:
    low = {name: 0.05 for name in FAMILIES}
    near = {**low, "addition": 0.3}
    overshot = {**near, "date_format": 0.95}
    model, report = _scripted_pretrain(monkeypatch, 6, [low, near, overshot])
    reference, reference_report = _scripted_pretrain(monkeypatch, 4, [low, near])
    assert (report.steps, report.kept_step, report.within_band) == (6, 4, False)
    assert report.validation_accuracy == near == reference_report.validation_accuracy
    kept, expected = model.state_dict(), reference.state_dict()
    assert all(torch.equal(kept[name], expected[name]) for name in expected)


def test_pretraining_stops_at_the_first_check_with_every_family_in_the_band(monkeypatch: pytest.MonkeyPatch) -> None:
    in_band = {name: 0.2 for name in FAMILIES}
    _model, report = _scripted_pretrain(monkeypatch, 20, [{**in_band, "sorting": 0.0}, in_band])
    assert (report.steps, report.kept_step, report.within_band) == (4, 4, True)
