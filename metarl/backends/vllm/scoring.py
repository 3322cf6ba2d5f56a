"""Hidden-eval scoring with vLLM on a GPU: the local scorer's prompts, stop handling and graders, another engine.

This is the only module that imports ``vllm``, and only inside the functions that need it, so the
package imports and tests without it. Everything but the generate step comes from
``metarl.learning.scoring``: prompt text and token ids, the never-generated tokens, completion
post-processing, grading and aggregation. vLLM gets the prompt *token ids* the torch scorer feeds
its model (BOS included), stops at the same EOS after the same completion budget, and its output
token ids are decoded by the same function, so on the same completions both give the same
``EvalScore``.

Run as ``python -m metarl.backends.vllm.scoring`` (see ``main``) it scores one checkpoint on one family's
hidden eval and writes the score as JSON; the vLLM eval backend runs it in a subprocess, so the
GPU memory is freed when it ends and vLLM may start its own engine process (a Celery pool child
may not).

The ``SamplingParams`` and ``LLM`` arguments come from ``metarl.backends.runpod.pod.scoring`` (the generate step
the on-pod eval runs), so the GPU eval pool and the on-pod eval sample alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from metarl.backends.runpod.pod.scoring import engine_kwargs as pod_engine_kwargs
from metarl.backends.runpod.pod.scoring import generation_kwargs
from metarl.backends.vllm.config import VLLM_EXTRA_FIX, VllmEvalBackend
from metarl.learning.data_families import family_for
from metarl.learning.families import Example, TaskFamily
from metarl.learning.registry import get_family
from metarl.learning.scoring import (
    PASS_K_TEMPERATURE,
    EvalScore,
    completion_text,
    forbidden_token_ids,
    format_prompt,
    max_completion_tokens,
    pass_k_seed,
    prompt_token_ids,
    score_completions,
)
from schemas.task_spec import TaskSpec


class VllmUnavailable(RuntimeError):
    """vllm is not importable in this Python environment."""


def vllm_available() -> bool:
    """True when ``vllm`` can be imported here (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raise ``VllmUnavailable`` with the fix when vllm is not installed."""
    if not vllm_available():
        raise VllmUnavailable(f"vllm is not installed in this Python environment; {VLLM_EXTRA_FIX}")


def vllm_prompts(tokenizer, eval_items: Sequence[Example]) -> list[dict[str, list[int]]]:
    """vLLM token prompts (``TokensPrompt`` dicts) holding exactly the token ids the torch scorer feeds its model."""
    ids = prompt_token_ids(tokenizer, [format_prompt(example) for example in eval_items])
    return [{"prompt_token_ids": row} for row in ids]


def required_model_len(tokenizer, family: TaskFamily, eval_items: Sequence[Example]) -> int:
    """Context length the eval needs: the longest prompt (BOS included) plus the completion budget."""
    prompts = prompt_token_ids(tokenizer, [format_prompt(example) for example in eval_items])
    return max((len(row) for row in prompts), default=1) + max_completion_tokens(family)


def sampling_kwargs(tokenizer, family: TaskFamily, *, pass_k: int, seed: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` matching the torch scorer's generation.

    Both: the family's completion budget, stop at EOS (the EOS token id is kept in the output ids),
    pad and BOS never generated. Pass@1 is greedy (``temperature=0``, one completion: ``n>1`` at
    temperature 0 only repeats it). Pass@k draws ``n=k`` completions at the pass@k temperature with
    a request seed; vLLM gives child ``i`` the seed ``seed + i``, which is ``pass_k_seed(seed, i)``,
    the seed of the torch scorer's round ``i`` (the engines' random streams still differ, so
    sampled completions agree in distribution, not token for token).
    """
    return generation_kwargs(
        eos_id=tokenizer.eos_token_id,
        forbidden=forbidden_token_ids(tokenizer),
        vocab_size=len(tokenizer),
        max_tokens=max_completion_tokens(family),
        pass_k=pass_k,
        temperature=PASS_K_TEMPERATURE,
        seed=pass_k_seed(seed, 0),
    )


def completions_from_outputs(tokenizer, outputs: Sequence[Any], *, n_items: int, pass_k: int) -> list[list[str]]:
    """Per-item completion texts from vLLM ``RequestOutput``s (in prompt order), decoded from token ids."""
    if len(outputs) != n_items:
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {n_items} prompts")
    completions: list[list[str]] = []
    for request in outputs:
        samples = sorted(request.outputs, key=lambda sample: sample.index)
        if len(samples) != pass_k:
            raise ValueError(f"vLLM returned {len(samples)} completions for a prompt scored at pass@{pass_k}")
        completions.append([completion_text(tokenizer, sample.token_ids) for sample in samples])
    return completions


def completions_with_llm(
    llm, tokenizer, family: TaskFamily, eval_items: list[Example], *, pass_k: int = 1, seed: int = 0, sampling_params_class=None
) -> list[list[str]]:
    """The generate step: ``pass_k`` completion texts per item from a loaded ``vllm.LLM`` (or its call shape).

    ``sampling_params_class`` defaults to ``vllm.SamplingParams``; tests pass a stand-in.
    """
    if sampling_params_class is None:
        from vllm import SamplingParams

        sampling_params_class = SamplingParams
    params = sampling_params_class(**sampling_kwargs(tokenizer, family, pass_k=pass_k, seed=seed))
    outputs = llm.generate(vllm_prompts(tokenizer, eval_items), params, use_tqdm=False)
    return completions_from_outputs(tokenizer, outputs, n_items=len(eval_items), pass_k=pass_k)


def score_with_llm(llm, tokenizer, family: TaskFamily, eval_items: list[Example], *, pass_k: int = 1, seed: int = 0, sampling_params_class=None) -> EvalScore:
    """Score ``eval_items`` with a loaded ``vllm.LLM``: its completions, graded by the local scorer's ``score_completions``."""
    completions = completions_with_llm(llm, tokenizer, family, eval_items, pass_k=pass_k, seed=seed, sampling_params_class=sampling_params_class)
    return score_completions(family, eval_items, completions, pass_k=pass_k)


def engine_kwargs(model_dir: Path, config: VllmEvalBackend, max_model_len: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for a Hugging Face weights folder (config, safetensors, tokenizer)."""
    return pod_engine_kwargs(
        str(model_dir),
        dtype=config.dtype,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=max_model_len,
        seed=config.seed,
        tensor_parallel_size=config.tensor_parallel_size,
    )


def resolve_model_len(config: VllmEvalBackend, needed: int) -> int:
    """The engine's context length: the configured one, which must fit the eval, or what the eval needs."""
    if config.max_model_len is None:
        return needed
    if config.max_model_len < needed:
        raise ValueError(
            f"backends.eval.max_model_len = {config.max_model_len} is below what the hidden eval needs ({needed}: "
            f"longest prompt plus completion budget); raise it or leave it unset"
        )
    return config.max_model_len


def load_llm(model_dir: Path, config: VllmEvalBackend, max_model_len: int):
    """Start a vLLM engine on the checkpoint in ``model_dir`` (vLLM's own sampling defaults, not the folder's)."""
    require_vllm()
    from vllm import LLM

    return LLM(**engine_kwargs(model_dir, config, max_model_len))


def score_checkpoint_vllm(
    model_dir: Path | str, family: TaskFamily | str, eval_items: list[Example], config: VllmEvalBackend, *, pass_k: int = 1
) -> tuple[EvalScore, dict[str, float]]:
    """Load the checkpoint in ``model_dir`` into vLLM and score it; returns the score and load/generate seconds."""
    from metarl.learning.tokenizer import load_tokenizer

    resolved = get_family(family) if isinstance(family, str) else family
    path = Path(model_dir)
    tokenizer = load_tokenizer(path)
    max_model_len = resolve_model_len(config, required_model_len(tokenizer, resolved, eval_items))
    started = time.perf_counter()
    llm = load_llm(path, config, max_model_len)
    loaded = time.perf_counter()
    score = score_with_llm(llm, tokenizer, resolved, eval_items, pass_k=pass_k, seed=config.seed)
    return score, {"load_s": round(loaded - started, 3), "generate_s": round(time.perf_counter() - loaded, 3)}


def main(argv: list[str] | None = None) -> int:
    """Score one checkpoint on a family's hidden eval with vLLM and write ``{"score": ..., "timing": ...}`` to --out."""
    parser = argparse.ArgumentParser(prog="python -m metarl.backends.vllm.scoring", description=main.__doc__)
    parser.add_argument("--model-dir", required=True, help="Hugging Face weights folder (config.json, safetensors, tokenizer)")
    parser.add_argument("--request", required=True, help="JSON file: the task spec and its hidden-eval items (drawn by the caller)")
    parser.add_argument("--pass-k", type=int, default=1, help="Completions per item (1 = greedy)")
    parser.add_argument("--config", required=True, help="The [backends.eval] table as JSON (type = vllm)")
    parser.add_argument("--out", required=True, help="Where to write the JSON result")
    args = parser.parse_args(argv)
    config = VllmEvalBackend.model_validate_json(args.config)
    request = json.loads(Path(args.request).read_text(encoding="utf-8"))
    family = family_for(TaskSpec.model_validate(request["task"]))
    items = [Example.model_validate(item) for item in request["items"]]
    score, timing = score_checkpoint_vllm(args.model_dir, family, items, config, pass_k=args.pass_k)
    out = Path(args.out)
    temporary = out.with_suffix(".tmp")
    temporary.write_text(json.dumps({"score": score.model_dump(mode="json"), "timing": timing}), encoding="utf-8")
    temporary.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
