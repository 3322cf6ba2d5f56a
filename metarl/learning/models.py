"""Local stand-ins for the Qwen3 base models: tiny Qwen3 configs, briefly pretrained, cached on disk.

``ensure_base_model`` builds a model deterministically on first use (supervised next-token
training on a mix of the enabled families' formats; a family sits out while its validation
accuracy is at the recipe's target, and the checkpoint kept is the one nearest the recipe's accuracy
band, so every family starts weak but not hopeless), saves it
with ``save_pretrained`` next to the tokenizer files, and reuses it afterwards. The cache key
is a content hash of the architecture, the pretraining recipe, ``RECIPE_VERSION`` and the
enabled families' content (``family_set_content``: a digest of each family's name, description
and a deterministic sample of its items, and whether their text needs the tokenizer's byte
fallback). Builds go to a temporary folder renamed into place, under a file lock, so concurrent
callers build once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from metarl.learning.families import Example, TaskFamily
from metarl.learning.registry import FAMILIES
from metarl.learning.runtime import configure_torch_threads, quiet_transformers
from metarl.learning.tokenizer import (
    CHARACTERS,
    EOS_TOKEN,
    SPECIAL_TOKENS,
    build_tokenizer,
    needs_byte_fallback,
    save_tokenizer,
    vocabulary,
)

RECIPE_VERSION = "2"
"""Bump to force a rebuild of every cached base model."""

SOURCES_IN_BUILD_KEY = ("families.py", "models.py", "tokenizer.py", "scoring.py", "sampling.py")
"""Modules whose source text is part of the cache key: editing any of them rebuilds the models."""

CACHE_DIR_ENV = "METARL_CACHE_DIR"
DEFAULT_CACHE_DIR = Path("~/.cache/metarl/models")
BUILD_INFO_FILE = "metarl_build.json"

FINGERPRINT_ITEMS = 64
"""Items drawn (deterministically, difficulties spread over [0, 1]) into each family's content digest."""


class ArchitectureSpec(BaseModel):
    """Qwen3 architecture of one local base model."""

    model_config = ConfigDict(frozen=True)

    hidden_size: int = Field(ge=16, le=1024, description="Width of the residual stream.")
    num_hidden_layers: int = Field(ge=1, le=24, description="Number of decoder layers.")
    num_attention_heads: int = Field(ge=1, le=32, description="Query heads per layer.")
    num_key_value_heads: int = Field(ge=1, le=32, description="Key/value heads per layer (grouped-query attention).")
    head_dim: int = Field(ge=8, le=128, description="Width of one attention head.")
    intermediate_size: int = Field(ge=16, le=8192, description="Hidden width of the MLP.")
    max_position_embeddings: int = Field(default=64, ge=32, le=4096, description="Longest sequence supported.")


class PretrainRecipe(BaseModel):
    """Short supervised pretraining that leaves a base model weak but not hopeless."""

    model_config = ConfigDict(frozen=True)

    steps: int = Field(ge=1, le=100_000, description="Most optimizer steps at scale 1.")
    check_every: int = Field(ge=1, le=10_000, description="Steps between checks of per-family validation accuracy.")
    target_accuracy: float = Field(gt=0.0, le=1.0, description="A family leaves the mix while its validation accuracy is at or above this.")
    ceiling_accuracy: float = Field(
        gt=0.0, le=1.0, description="Highest validation accuracy a family may keep: the build keeps the checkpoint nearest [target, ceiling] for every family."
    )
    validation_items: int = Field(ge=8, le=1024, description="Validation items per family (training partition).")
    batch_size: int = Field(ge=1, le=4096, description="Sequences per step.")
    learning_rate: float = Field(gt=0.0, le=1.0, description="Peak AdamW learning rate.")
    final_lr_fraction: float = Field(ge=0.0, le=1.0, description="Cosine decay from the peak to this fraction of it (1 keeps it constant).")
    warmup_steps: int = Field(ge=0, le=10_000, description="Linear warm-up steps.")
    weight_decay: float = Field(ge=0.0, le=1.0, description="AdamW weight decay.")
    difficulty_low: float = Field(ge=0.0, le=1.0, description="Lowest item difficulty in the mix.")
    difficulty_high: float = Field(ge=0.0, le=1.0, description="Highest item difficulty in the mix.")
    family_weights: dict[str, float] = Field(description="Relative share of each family in the mix.")
    seed: int = Field(ge=0, le=2**31 - 1, description="Seed of weights init and data order.")

    @model_validator(mode="after")
    def _ceiling_not_below_target(self) -> PretrainRecipe:
        if self.ceiling_accuracy < self.target_accuracy:
            raise ValueError(f"ceiling_accuracy ({self.ceiling_accuracy}) is below target_accuracy ({self.target_accuracy}); set it at or above the target")
        return self


class BaseModelSpec(BaseModel):
    """A named local base model: architecture plus pretraining recipe."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, max_length=64, description="Local model name, e.g. 'local-s'.")
    stands_in_for: str = Field(min_length=1, max_length=128, description="The hub model this one replaces.")
    architecture: ArchitectureSpec = Field(description="Qwen3 architecture.")
    recipe: PretrainRecipe = Field(description="Pretraining recipe at scale 1.")


EVEN_MIX = {name: 1.0 for name in FAMILIES}

BASE_MODELS: dict[str, BaseModelSpec] = {
    "local-s": BaseModelSpec(
        name="local-s",
        stands_in_for="Qwen/Qwen3-0.6B",
        architecture=ArchitectureSpec(
            hidden_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            intermediate_size=256,
        ),
        recipe=PretrainRecipe(
            steps=1500,
            check_every=10,
            target_accuracy=0.12,
            ceiling_accuracy=0.4,
            validation_items=64,
            batch_size=64,
            learning_rate=2e-3,
            final_lr_fraction=1.0,
            warmup_steps=30,
            weight_decay=0.01,
            difficulty_low=0.0,
            difficulty_high=1.0,
            family_weights=EVEN_MIX,
            seed=1,
        ),
    ),
    "local-l": BaseModelSpec(
        name="local-l",
        stands_in_for="Qwen/Qwen3-1.7B",
        architecture=ArchitectureSpec(
            hidden_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=384,
        ),
        recipe=PretrainRecipe(
            steps=1500,
            check_every=10,
            target_accuracy=0.2,
            ceiling_accuracy=0.5,
            validation_items=32,
            batch_size=64,
            learning_rate=1e-3,
            final_lr_fraction=1.0,
            warmup_steps=30,
            weight_decay=0.01,
            difficulty_low=0.0,
            difficulty_high=1.0,
            family_weights=EVEN_MIX,
            seed=2,
        ),
    ),
}
"""Local base models by name."""

MODEL_CATALOG: dict[str, str] = {spec.stands_in_for: name for name, spec in BASE_MODELS.items()}
"""Hub model names a job may use, mapped to their local stand-ins."""


def resolve_model_name(name: str) -> str:
    """The local model name for a local name or a catalogued hub name; ``KeyError`` listing valid names."""
    if name in BASE_MODELS:
        return name
    if name in MODEL_CATALOG:
        return MODEL_CATALOG[name]
    valid = sorted(BASE_MODELS) + sorted(MODEL_CATALOG)
    raise KeyError(f"unknown base model {name!r}; valid names: {', '.join(valid)}")


def qwen3_config(architecture: ArchitectureSpec, byte_fallback: bool = False):
    """The ``Qwen3Config`` of an architecture over the character vocabulary (with the byte tokens when ``byte_fallback``)."""
    from transformers import Qwen3Config

    vocab = vocabulary(byte_fallback)
    return Qwen3Config(
        vocab_size=len(vocab),
        hidden_size=architecture.hidden_size,
        intermediate_size=architecture.intermediate_size,
        num_hidden_layers=architecture.num_hidden_layers,
        num_attention_heads=architecture.num_attention_heads,
        num_key_value_heads=architecture.num_key_value_heads,
        head_dim=architecture.head_dim,
        max_position_embeddings=architecture.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=vocab[SPECIAL_TOKENS[0]],
        bos_token_id=vocab[SPECIAL_TOKENS[1]],
        eos_token_id=vocab[EOS_TOKEN],
        use_cache=True,
    )


def scaled_recipe(recipe: PretrainRecipe, scale: float) -> PretrainRecipe:
    """The recipe with steps and warm-up multiplied by ``scale`` (at least one step)."""
    return recipe.model_copy(
        update={
            "steps": max(1, round(recipe.steps * scale)),
            "warmup_steps": round(recipe.warmup_steps * scale),
        }
    )


def source_digest() -> str:
    """Hash of the source of the modules that determine a built model's weights."""
    package_dir = Path(__file__).parent
    digest = hashlib.sha256()
    for name in SOURCES_IN_BUILD_KEY:
        digest.update(name.encode())
        digest.update((package_dir / name).read_bytes())
    return digest.hexdigest()


class FamilySetContent(BaseModel):
    """What the enabled task families contribute to a base model's build key and tokenizer."""

    model_config = ConfigDict(frozen=True)

    digests: dict[str, str] = Field(min_length=1, max_length=256, description="Content digest of each enabled family, by family name.")
    byte_fallback: bool = Field(description="True when some family's items hold characters outside the tokenizer's own characters.")


def enabled_families() -> dict[str, TaskFamily]:
    """The families every base model is built for (today the built-in ones of ``metarl.learning.families``)."""
    return dict(FAMILIES)


def family_sample(family: TaskFamily, n: int = FINGERPRINT_ITEMS) -> list[Example]:
    """``n`` training items drawn from a seed of the family's name, difficulties evenly spread over [0, 1]."""
    rng = random.Random(f"family-content\x1f{family.name}")
    return [family.generate(rng, index / max(1, n - 1)) for index in range(n)]


def family_content_digest(family: TaskFamily, sample: Sequence[Example] | None = None) -> str:
    """Digest of what a family is to a model: name, description, answer limit and a deterministic sample of its items.

    A family may also define ``content_digest() -> str`` (for example a hash of its spec and data
    files) to cover what the sample misses; it joins the digest.
    """
    digest = hashlib.sha256()
    for part in (family.name, family.description, str(family.max_answer_chars)):
        digest.update(part.encode())
        digest.update(b"\x1f")
    own_digest = getattr(family, "content_digest", None)
    if callable(own_digest):
        digest.update(str(own_digest()).encode())
        digest.update(b"\x1f")
    for example in family_sample(family) if sample is None else sample:
        digest.update(f"{example.prompt}\x1f{example.answer}\x1e".encode())
    return digest.hexdigest()[:16]


def family_set_content(families: Mapping[str, TaskFamily]) -> FamilySetContent:
    """The content of a family set: each family's digest, and whether its sampled items need the byte fallback."""
    if not families:
        raise ValueError("a base model needs at least one task family")
    samples = {name: family_sample(family) for name, family in families.items()}
    texts = [text for sample in samples.values() for example in sample for text in (example.prompt, example.answer)]
    return FamilySetContent(
        digests={name: family_content_digest(family, samples[name]) for name, family in sorted(families.items())},
        byte_fallback=needs_byte_fallback(texts),
    )


def recipe_for_families(recipe: PretrainRecipe, names: list[str]) -> PretrainRecipe:
    """The recipe over exactly these families: a family keeps its weight in the recipe, a new one gets 1.0."""
    weights = {name: recipe.family_weights.get(name, 1.0) for name in sorted(names)}
    if weights == recipe.family_weights:
        return recipe
    return recipe.model_copy(update={"family_weights": weights})


def build_key(spec: BaseModelSpec, scale: float, content: FamilySetContent | None = None) -> str:
    """Content hash naming a built model: architecture, scaled recipe, vocabulary, code version and the families' content."""
    content = content if content is not None else family_set_content(enabled_families())
    recipe = recipe_for_families(scaled_recipe(spec.recipe, scale), list(content.digests))
    payload = {
        "architecture": spec.architecture.model_dump(),
        "recipe": recipe.model_dump(),
        "characters": CHARACTERS,
        "special_tokens": list(SPECIAL_TOKENS),
        "recipe_version": RECIPE_VERSION,
        "sources": source_digest(),
        "families": content.model_dump(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def base_model_build(name: str, scale: float = 1.0, families: Mapping[str, TaskFamily] | None = None) -> str:
    """The identity of the built model ``name`` (local or catalogued hub name) at ``scale``: ``<local name>-<build key>``.

    It is the model's cache folder name and changes with anything that changes the weights (the
    families' content, the tokenizer, the recipe, the scale, ``RECIPE_VERSION``); cached base
    scores are keyed by it (``metarl.store.baselines``). ``families`` defaults to
    ``enabled_families()``. ``KeyError`` for an unknown model name.
    """
    spec = BASE_MODELS[resolve_model_name(name)]
    content = family_set_content(families if families is not None else enabled_families())
    return f"{spec.name}-{build_key(spec, scale, content)}"


def default_cache_dir() -> Path:
    """``$METARL_CACHE_DIR`` when set, else ``~/.cache/metarl/models``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_CACHE_DIR.expanduser()


def pretraining_batch(rng: random.Random, recipe: PretrainRecipe, active_families: list[str], families: Mapping[str, TaskFamily] = FAMILIES) -> list[Example]:
    """One batch from the weighted mix of the active families (never hidden-eval items)."""
    chosen_from: list[TaskFamily] = [families[name] for name in active_families]
    weights = [recipe.family_weights[name] for name in active_families]
    chosen = rng.choices(chosen_from, weights=weights, k=recipe.batch_size)
    return [family.generate(rng, rng.uniform(recipe.difficulty_low, recipe.difficulty_high)) for family in chosen]


def validation_sets(recipe: PretrainRecipe, families: Mapping[str, TaskFamily] = FAMILIES) -> dict[str, list[Example]]:
    """Per-family validation items drawn from the training partition with their own seed."""
    rng = random.Random(f"pretrain-validation\x1f{recipe.seed}")
    return {name: [families[name].generate(rng, rng.uniform(0.0, 1.0)) for _ in range(recipe.validation_items)] for name in sorted(recipe.family_weights)}


def validation_accuracy(model, tokenizer, validation: dict[str, list[Example]], families: Mapping[str, TaskFamily] = FAMILIES) -> dict[str, float]:
    """Greedy exact-match accuracy of the model on each family's validation items."""
    from metarl.learning.scoring import score_loaded_model

    model.eval()
    accuracy = {name: score_loaded_model(model, tokenizer, families[name], items).mean for name, items in validation.items()}
    model.train()
    return accuracy


def supervised_batch(tokenizer, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels) for answer-only next-token loss; right padded."""
    eos = tokenizer.eos_token_id
    prompt_ids = tokenizer([example.prompt for example in examples])["input_ids"]
    answer_ids = tokenizer([example.answer for example in examples], add_special_tokens=False)["input_ids"]
    sequences = [prompt + answer + [eos] for prompt, answer in zip(prompt_ids, answer_ids)]
    length = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), length), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    labels = torch.full((len(sequences), length), -100, dtype=torch.long)
    for row, (prompt, sequence) in enumerate(zip(prompt_ids, sequences)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
        labels[row, len(prompt) : len(sequence)] = torch.tensor(sequence[len(prompt) :])
    return input_ids, attention_mask, labels


def learning_rate_at(step: int, recipe: PretrainRecipe) -> float:
    """Linear warm-up, then cosine decay to ``final_lr_fraction`` of the peak."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    floor = recipe.final_lr_fraction
    return recipe.learning_rate * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


class PretrainReport(BaseModel):
    """What a pretraining run did."""

    steps: int = Field(ge=0, description="Optimizer steps taken.")
    kept_step: int = Field(ge=0, description="Optimizer steps of the checkpoint kept (nearest the accuracy band).")
    within_band: bool = Field(description="Every family's validation accuracy of the kept checkpoint is within [target, ceiling].")
    validation_accuracy: dict[str, float] = Field(description="Per-family validation accuracy of the kept checkpoint.")


def distance_outside_band(accuracy: Mapping[str, float], low: float, high: float) -> float:
    """How far the families' accuracies lie outside [low, high], summed: 0 when every family is inside."""
    return sum(max(0.0, low - value) + max(0.0, value - high) for value in accuracy.values())


def families_below_target(accuracy: Mapping[str, float], target: float) -> list[str]:
    """The families still in the pretraining mix: those whose accuracy is below ``target``."""
    return [name for name in sorted(accuracy) if accuracy[name] < target]


class _Checkpoint(BaseModel):
    """A pretraining checkpoint: its weights, step, validation accuracy and distance from the band."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    state: dict[str, torch.Tensor] = Field(description="A copy of the model's state dict.")
    step: int = Field(ge=0, description="Optimizer steps taken when it was saved.")
    accuracy: dict[str, float] = Field(description="Per-family validation accuracy at that step.")
    distance: float = Field(ge=0.0, description="distance_outside_band of that accuracy.")


def _checkpoint(model, tokenizer, validation: dict[str, list[Example]], families: Mapping[str, TaskFamily], recipe: PretrainRecipe, step: int) -> _Checkpoint:
    """Measure the model's validation accuracy and copy its weights."""
    accuracy = validation_accuracy(model, tokenizer, validation, families)
    return _Checkpoint(
        state={name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
        step=step,
        accuracy=accuracy,
        distance=distance_outside_band(accuracy, recipe.target_accuracy, recipe.ceiling_accuracy),
    )


def pretrain(spec: BaseModelSpec, recipe: PretrainRecipe, tokenizer, families: Mapping[str, TaskFamily] = FAMILIES, byte_fallback: bool = False):
    """Initialise the model from its seed and pretrain it on the recipe's families; returns (model, report).

    Every ``check_every`` steps each family's validation accuracy is measured; families at or
    above ``target_accuracy`` sit out until they drop below it. Accuracy swings widely between
    checks (a family can go from 0.03 to 0.98 in ten steps), so the build keeps the checkpoint
    whose accuracies lie nearest [target, ceiling] (``distance_outside_band``; the later one on a
    tie) and stops at the first check where every family is inside it, when no family is below
    target, or after ``steps``.
    """
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(recipe.seed)
    model = Qwen3ForCausalLM(qwen3_config(spec.architecture, byte_fallback))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    rng = random.Random(f"pretrain\x1f{recipe.seed}")
    validation = validation_sets(recipe, families)
    active_families = sorted(recipe.family_weights)
    best: _Checkpoint | None = None
    step = 0
    while True:
        if step == recipe.steps or (step > 0 and step % recipe.check_every == 0):
            latest = _checkpoint(model, tokenizer, validation, families, recipe, step)
            best = latest if best is None or latest.distance <= best.distance else best
            active_families = families_below_target(latest.accuracy, recipe.target_accuracy)
            if step == recipe.steps or latest.distance == 0.0 or not active_families:
                break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(step, recipe)
        input_ids, attention_mask, labels = supervised_batch(tokenizer, pretraining_batch(rng, recipe, active_families, families))
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
    assert best is not None  # the loop ends at a check
    model.load_state_dict(best.state)
    model.eval()
    report = PretrainReport(steps=step, kept_step=best.step, within_band=best.distance == 0.0, validation_accuracy=best.accuracy)
    return model, report


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` for the duration of the block."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_into(target: Path, spec: BaseModelSpec, scale: float, families: Mapping[str, TaskFamily], content: FamilySetContent) -> None:
    """Pretrain and save the model, tokenizer and build info into a temp folder, then rename it to ``target``."""
    configure_torch_threads()
    quiet_transformers()
    started = time.monotonic()
    recipe = recipe_for_families(scaled_recipe(spec.recipe, scale), list(content.digests))
    tokenizer = build_tokenizer(content.byte_fallback)
    model, report = pretrain(spec, recipe, tokenizer, families, content.byte_fallback)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(str(staging))
        save_tokenizer(staging, content.byte_fallback)
        info = {
            "name": spec.name,
            "stands_in_for": spec.stands_in_for,
            "scale": scale,
            "build_key": target.name,
            "parameters": sum(parameter.numel() for parameter in model.parameters()),
            "build_seconds": round(time.monotonic() - started, 2),
            "recipe": recipe.model_dump(),
            "families": content.model_dump(),
            "pretrain": report.model_dump(),
        }
        (staging / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2))
        staging.chmod(0o755)
        os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def ensure_base_model(name: str, cache_dir: Path | str | None = None, *, scale: float = 1.0, families: Mapping[str, TaskFamily] | None = None) -> Path:
    """Path of the built base model ``name`` (local or catalogued hub name), building it on first use.

    ``cache_dir`` defaults to ``$METARL_CACHE_DIR`` or ``~/.cache/metarl/models``. ``scale`` multiplies
    the pretraining step budget: tests use a small scale for a fast, weaker model (its own cache entry).
    ``families`` (default ``enabled_families()``) are the families the model is pretrained on.
    """
    if not 0.0 < scale <= 10.0:
        raise ValueError(f"scale must be in (0, 10], got {scale}")
    spec = BASE_MODELS[resolve_model_name(name)]
    chosen = families if families is not None else enabled_families()
    content = family_set_content(chosen)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{spec.name}-{build_key(spec, scale, content)}"
    if (target / BUILD_INFO_FILE).exists():
        return target
    with _exclusive_lock(root / f"{target.name}.lock"):
        if not (target / BUILD_INFO_FILE).exists():
            _build_into(target, spec, scale, chosen, content)
    return target


def build_info(model_dir: Path) -> dict:
    """The build record saved next to a base model (name, scale, parameters, build seconds)."""
    return json.loads((Path(model_dir) / BUILD_INFO_FILE).read_text())
