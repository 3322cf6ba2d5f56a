"""Score a checkpoint on eval items: greedy pass@1 or seeded-sampling pass@k, with a 95% interval.

Only the generate step is torch-specific. Prompt text and token ids (``format_prompt``,
``prompt_token_ids``), the never-generated tokens (``forbidden_token_ids``), completion
post-processing (``completion_text``) and grading with aggregation (``score_completions``) are
pure functions that every evaluator (``metarl.backends.vllm.scoring`` too) calls unchanged, so both give
the same numbers on the same completions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from metarl.learning.families import Example, TaskFamily
from metarl.learning.registry import get_family
from metarl.learning.runtime import configure_torch_threads, quiet_transformers
from metarl.learning.sampling import (
    encode_prompts,
    sample_completions,
)
from metarl.learning.tokenizer import load_tokenizer

WILSON_Z_95 = 1.959963984540054
EVAL_BATCH_SIZE = 256
PASS_K_TEMPERATURE = 1.0


class EvalScore(BaseModel):
    """Hidden-eval result of one checkpoint: mean exact-match rate with a Wilson 95% interval."""

    mean: float = Field(ge=0.0, le=1.0, description="Fraction of items solved (pass@k, exact match).")
    ci_low: float = Field(ge=0.0, le=1.0, description="Lower end of the Wilson 95% interval of the mean.")
    ci_high: float = Field(ge=0.0, le=1.0, description="Upper end of the Wilson 95% interval of the mean.")
    n: int = Field(ge=0, description="Number of eval items scored.")
    pass_k: int = Field(ge=1, le=64, description="Samples per item; an item counts as solved when any is exact.")
    partial_mean: float = Field(ge=0.0, le=1.0, description="Mean grader score with partial credit (best of k).")


def format_prompt(example: Example) -> str:
    """The exact text given to the model for an item (the tokenizer adds BOS)."""
    return example.prompt


def prompt_token_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt as the model sees them (BOS first, no padding); torch left-pads these."""
    return [list(ids) for ids in tokenizer(prompts)["input_ids"]]


def forbidden_token_ids(tokenizer) -> tuple[int, ...]:
    """Tokens a scorer never generates (pad and BOS, where defined and not EOS), whichever engine samples."""
    special = (tokenizer.pad_token_id, tokenizer.bos_token_id)
    return tuple(token for token in special if token is not None and token != tokenizer.eos_token_id)


def completion_text(tokenizer, token_ids: Sequence[int]) -> str:
    """Text of one generated completion: its tokens up to and including the first EOS, special tokens dropped."""
    kept = list(token_ids)
    if tokenizer.eos_token_id in kept:
        kept = kept[: kept.index(tokenizer.eos_token_id) + 1]
    return tokenizer.decode(kept, skip_special_tokens=True)


def pass_k_seed(seed: int, sample_index: int) -> int:
    """Seed of the ``sample_index``-th sampling round of a pass@k score."""
    return seed * 1_000_003 + sample_index


def grade_completion(family: TaskFamily, example: Example, completion: str) -> tuple[bool, float]:
    """(exact match, partial-credit grade) of one completion."""
    return family.is_exact(example, completion), family.grade(example, completion)


def max_completion_tokens(family: TaskFamily) -> int:
    """Eval generation length: the longest answer plus EOS plus slack."""
    return family.max_answer_chars + 2


def wilson_interval(successes: int, n: int, z: float = WILSON_Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    proportion = successes / n
    denominator = 1 + z * z / n
    centre = (proportion + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(proportion * (1 - proportion) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half_width), min(1.0, centre + half_width)


def load_model(model_dir: Path):
    """Load a checkpoint folder (base model or trained) for CPU inference, offline."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32)
    model.eval()
    return model


def generate_texts(model, tokenizer, prompts: list[str], *, max_tokens: int, greedy: bool, temperature: float, seed: int) -> list[str]:
    """Completions for ``prompts`` in batches (greedy, or sampled from a generator seeded with ``seed``)."""
    generator = torch.Generator().manual_seed(seed)
    forbidden = forbidden_token_ids(tokenizer)
    texts: list[str] = []
    for start in range(0, len(prompts), EVAL_BATCH_SIZE):
        batch = encode_prompts(tokenizer, prompts[start : start + EVAL_BATCH_SIZE])
        completions = sample_completions(
            model,
            batch,
            max_tokens=max_tokens,
            eos_id=tokenizer.eos_token_id,
            pad_id=tokenizer.pad_token_id,
            forbidden_ids=forbidden,
            temperature=temperature,
            greedy=greedy,
            generator=generator,
        )
        texts.extend(completion_text(tokenizer, row) for row in completions.token_ids.tolist())
    return texts


def score_completions(family: TaskFamily, eval_items: list[Example], completions: Sequence[Sequence[str]], *, pass_k: int) -> EvalScore:
    """Grade and aggregate: ``completions[i]`` holds the ``pass_k`` completions of ``eval_items[i]``.

    An item is solved when any of its completions is exact; partial credit is its best grade.
    """
    if len(completions) != len(eval_items):
        raise ValueError(f"{len(completions)} completion lists for {len(eval_items)} eval items")
    solved: list[bool] = []
    best_grade: list[float] = []
    for example, texts in zip(eval_items, completions):
        if len(texts) != pass_k:
            raise ValueError(f"{len(texts)} completions for an item scored at pass@{pass_k}")
        grades = [grade_completion(family, example, text) for text in texts]
        solved.append(any(exact for exact, _ in grades))
        best_grade.append(max([0.0] + [grade for _, grade in grades]))
    n = len(eval_items)
    successes = sum(solved)
    ci_low, ci_high = wilson_interval(successes, n)
    return EvalScore(
        mean=successes / n if n else 0.0,
        ci_low=ci_low,
        ci_high=ci_high,
        n=n,
        pass_k=pass_k,
        partial_mean=sum(best_grade) / n if n else 0.0,
    )


def score_loaded_model(model, tokenizer, family: TaskFamily, eval_items: list[Example], *, pass_k: int = 1, seed: int = 0) -> EvalScore:
    """Score an already-loaded model; pass@1 is greedy, pass@k samples k completions per item."""
    prompts = [format_prompt(example) for example in eval_items]
    rounds = [
        generate_texts(
            model,
            tokenizer,
            prompts,
            max_tokens=max_completion_tokens(family),
            greedy=pass_k == 1,
            temperature=PASS_K_TEMPERATURE,
            seed=pass_k_seed(seed, sample_index),
        )
        for sample_index in range(pass_k)
    ]
    per_item = [list(texts) for texts in zip(*rounds)]
    return score_completions(family, eval_items, per_item, pass_k=pass_k)


def score_checkpoint(model_dir: Path | str, family: TaskFamily | str, eval_items: list[Example], *, pass_k: int = 1, seed: int = 0) -> EvalScore:
    """Load the checkpoint in ``model_dir`` and score it on ``eval_items`` of ``family``."""
    configure_torch_threads()
    resolved = get_family(family) if isinstance(family, str) else family
    model_path = Path(model_dir)
    return score_loaded_model(load_model(model_path), load_tokenizer(model_path), resolved, eval_items, pass_k=pass_k, seed=seed)
