"""Check the vLLM scorer against the torch scorer on a GPU host: one checkpoint, one hidden eval, both engines.

On a GPU host after ``pip install -e .[gpu]``::

    python scripts/check_vllm_gpu.py --family addition --model local-s
    python scripts/check_vllm_gpu.py --model-dir /path/to/weights/step_40 --family sorting --dtype bfloat16 --tolerance 0.05

It builds (or reuses) the local base model unless ``--model-dir`` names a Hugging Face weights folder,
scores the family's hidden eval greedily with the torch scorer (CPU) and with vLLM (GPU), and prints
both scores, the items whose greedy completions differ, and the seconds each engine took. With
``--pass-k K`` it also prints both pass@K scores (sampled: they agree in distribution only, so they
are shown, not checked). Exit 0 when the greedy scores agree within ``--tolerance`` (a fraction of
items), 1 when they do not, 2 when vllm is not installed.
"""

from __future__ import annotations

import argparse
import sys
import time

from metarl.backends.vllm.config import VLLM_EXTRA_FIX, VllmEvalBackend
from metarl.backends.vllm.scoring import (
    completions_with_llm,
    load_llm,
    required_model_len,
    resolve_model_len,
    score_with_llm,
    vllm_available,
)
from metarl.learning.eval_secret import add_artifacts_argument, install_eval_secret
from metarl.learning.models import BASE_MODELS, ensure_base_model
from metarl.learning.registry import FAMILIES, get_family
from metarl.learning.runtime import configure_torch_threads
from metarl.learning.scoring import (
    PASS_K_TEMPERATURE,
    EvalScore,
    format_prompt,
    generate_texts,
    load_model,
    max_completion_tokens,
    pass_k_seed,
    score_completions,
    score_loaded_model,
)
from metarl.learning.tokenizer import load_tokenizer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="addition", choices=sorted(FAMILIES), help="Task family whose hidden eval is scored")
    parser.add_argument("--model", default="local-s", choices=sorted(BASE_MODELS), help="Local base model to build or reuse")
    parser.add_argument("--scale", type=float, default=1.0, help="Pretraining scale of the base model")
    parser.add_argument("--cache-dir", default=None, help="Base-model cache (default METARL_CACHE_DIR or ~/.cache/metarl/models)")
    add_artifacts_argument(parser)
    parser.add_argument("--model-dir", default=None, help="Score this Hugging Face weights folder instead of a base model")
    parser.add_argument("--n-items", type=int, default=200, help="Hidden-eval items")
    parser.add_argument("--eval-version", type=int, default=1, help="Hidden-eval version")
    parser.add_argument("--pass-k", type=int, default=1, help="Also compare pass@K (sampled; shown, not checked) when K > 1")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the engines and of pass@K sampling")
    parser.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float16", "float32"], help="vLLM dtype")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="Fraction of GPU memory vLLM may claim")
    parser.add_argument("--tolerance", type=float, default=0.02, help="Largest fraction of items whose greedy completions may differ")
    return parser.parse_args(argv)


def row(engine: str, score: EvalScore, seconds: str) -> str:
    """One line of the comparison table."""
    return f"{engine:<14} {score.mean:>6.3f}  [{score.ci_low:.3f}, {score.ci_high:.3f}]  {score.partial_mean:>7.3f}  {seconds}"


def main(argv: list[str] | None = None) -> int:
    """Score with both engines, print them side by side, and gate on greedy agreement."""
    args = parse_args(argv)
    install_eval_secret(args.artifacts)
    if not vllm_available():
        print(f"vllm is not installed: {VLLM_EXTRA_FIX}", file=sys.stderr)
        return 2
    configure_torch_threads()
    family = get_family(args.family)
    started = time.perf_counter()
    model_dir = args.model_dir or ensure_base_model(args.model, args.cache_dir, scale=args.scale)
    print(f"checkpoint {model_dir} ({time.perf_counter() - started:.1f} s to build or find)")
    items = family.hidden_eval(args.n_items, args.eval_version)
    tokenizer = load_tokenizer(model_dir)

    started = time.perf_counter()
    model = load_model(model_dir)
    torch_load = time.perf_counter() - started
    started = time.perf_counter()
    prompts = [format_prompt(item) for item in items]
    torch_texts = generate_texts(
        model, tokenizer, prompts, max_tokens=max_completion_tokens(family), greedy=True, temperature=PASS_K_TEMPERATURE, seed=pass_k_seed(args.seed, 0)
    )
    torch_greedy = score_completions(family, items, [[text] for text in torch_texts], pass_k=1)
    torch_generate = time.perf_counter() - started

    config = VllmEvalBackend(type="vllm", dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed)
    started = time.perf_counter()
    llm = load_llm(model_dir, config, resolve_model_len(config, required_model_len(tokenizer, family, items)))
    vllm_load = time.perf_counter() - started
    started = time.perf_counter()
    vllm_texts = [texts[0] for texts in completions_with_llm(llm, tokenizer, family, items, pass_k=1, seed=args.seed)]
    vllm_greedy = score_completions(family, items, [[text] for text in vllm_texts], pass_k=1)
    vllm_generate = time.perf_counter() - started

    print(f"\n{family.name}: {len(items)} hidden-eval items, vLLM dtype {args.dtype}")
    print(f"{'engine':<14} {'mean':>6}  {'95% interval':<16}  {'partial':>7}  seconds")
    print(row("torch greedy", torch_greedy, f"load {torch_load:.1f}, generate {torch_generate:.1f}"))
    print(row("vllm greedy", vllm_greedy, f"load {vllm_load:.1f}, generate {vllm_generate:.1f}"))
    differing = [index for index, (left, right) in enumerate(zip(torch_texts, vllm_texts)) if left != right]
    for index in differing[:5]:
        print(f"  differs: {prompts[index]!r}: torch {torch_texts[index]!r}, vllm {vllm_texts[index]!r}")

    if args.pass_k > 1:
        started = time.perf_counter()
        torch_sampled = score_loaded_model(model, tokenizer, family, items, pass_k=args.pass_k, seed=args.seed)
        torch_seconds = time.perf_counter() - started
        started = time.perf_counter()
        vllm_sampled = score_with_llm(llm, tokenizer, family, items, pass_k=args.pass_k, seed=args.seed)
        vllm_seconds = time.perf_counter() - started
        print(row(f"torch pass@{args.pass_k}", torch_sampled, f"generate {torch_seconds:.1f}"))
        print(row(f"vllm pass@{args.pass_k}", vllm_sampled, f"generate {vllm_seconds:.1f}"))

    fraction = len(differing) / max(1, len(items))
    gap = abs(torch_greedy.mean - vllm_greedy.mean)
    agree = fraction <= args.tolerance and gap <= args.tolerance
    print(f"\ngreedy completions differ on {len(differing)}/{len(items)} items ({fraction:.3f}); mean gap {gap:.3f}; tolerance {args.tolerance}")
    print("AGREE" if agree else "DISAGREE")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
