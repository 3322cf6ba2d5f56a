"""The generate step of the hidden eval, for one model: prompts in, completion texts out (no answers, no grading).

It runs on the inner job's pod, started by the pod runner (``metarl.backends.runpod.pod.eval_server``) with the pod
image's Python, which has vLLM at the prime-rl pin, torch and transformers; it imports nothing of
metarl (the image's runner code is not on that interpreter's path), so it is run by file path::

    python scoring.py --request REQUEST.json --model MODEL --out OUT.json [--engine vllm|torch]

REQUEST is the ``eval/request.json`` the train backend published (``metarl.backends.runpod.pod.eval_server.EvalRequest``):
the hidden prompts, the completion budget, pass@k, seeds and engine settings. MODEL is a Hugging
Face weights folder or a hub id already in the pod's cache (the base model). OUT gets
``{"model", "prompt_format", "completions", "load_s", "generate_s"}``: ``pass_k`` completion
texts per prompt, in prompt order. Grading happens on the workers, which hold the answers. With
``--download-to DIR`` a hub MODEL is downloaded afresh into DIR first (the runner does this for
the base model, so nothing the agent's code could have left in the pod's cache is scored).

The rules are those of the CPU scorer (``metarl.learning.scoring``): prompt token ids as the
model's tokenizer gives them, pad and BOS never generated, stop at EOS, the completion decoded
from its token ids up to its first EOS with special tokens dropped; pass@1 is greedy, pass@k
samples ``n = k`` at the request's temperature and seed. One difference: when the model's
tokenizer has a chat template and the request asks for it, the prompt is the chat-formatted user
message with thinking off (what ``[orchestrator.renderer] name = "qwen3"``, ``enable_thinking =
false`` trains on) and a leading ``<think>...</think>`` block is dropped from the completion.
``metarl.backends.vllm.scoring`` builds its vLLM calls with :func:`generation_kwargs` and
:func:`engine_kwargs` from here, so both vLLM scorers sample alike.

Engines: ``vllm`` (the pod's) and ``torch`` (transformers ``generate`` on the CPU, for hosts
without a GPU and for tests; same prompts, masks and stops).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

THINK_BLOCK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def forbidden_ids(pad_id: int | None, bos_id: int | None, eos_id: int | None) -> tuple[int, ...]:
    """Tokens never generated: pad and BOS, where defined and not EOS (``metarl.learning.scoring.forbidden_token_ids``)."""
    return tuple(token for token in (pad_id, bos_id) if token is not None and token != eos_id)


def generation_kwargs(*, eos_id: int, forbidden: Sequence[int], vocab_size: int, max_tokens: int, pass_k: int, temperature: float, seed: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams``: greedy single completion for pass@1, ``n = pass_k`` seeded samples otherwise."""
    banned = set(forbidden)
    common: dict[str, Any] = {"max_tokens": max_tokens, "stop_token_ids": [eos_id], "skip_special_tokens": True}
    if banned:
        common["allowed_token_ids"] = [token for token in range(vocab_size) if token not in banned]
    if pass_k == 1:
        return {**common, "n": 1, "temperature": 0.0}
    return {**common, "n": pass_k, "temperature": temperature, "top_p": 1.0, "seed": seed}


def engine_kwargs(model: str, *, dtype: str, gpu_memory_utilization: float, max_model_len: int, seed: int, tensor_parallel_size: int = 1) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for a weights folder or cached hub id (vLLM's own sampling defaults, not the folder's)."""
    return {
        "model": model,
        "tokenizer": model,
        "dtype": dtype,
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "seed": seed,
        "generation_config": "vllm",
    }


def uses_chat(tokenizer: Any, want_chat: bool) -> bool:
    """Whether prompts are chat-formatted: asked for, and the tokenizer has a chat template."""
    return bool(want_chat and getattr(tokenizer, "chat_template", None))


def prompt_token_rows(tokenizer: Any, prompts: Sequence[str], chat: bool) -> list[list[int]]:
    """Token ids of each prompt: the raw text as the tokenizer encodes it (BOS where it adds one), or the chat-formatted user turn."""
    if not chat:
        return [list(ids) for ids in tokenizer(list(prompts))["input_ids"]]
    rows = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False)
        rows.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return rows


def completion_text(tokenizer: Any, token_ids: Sequence[int], chat: bool) -> str:
    """One completion's text: its tokens up to and including the first EOS, special tokens dropped (and a leading think block in chat)."""
    kept = list(token_ids)
    if tokenizer.eos_token_id in kept:
        kept = kept[: kept.index(tokenizer.eos_token_id) + 1]
    text = tokenizer.decode(kept, skip_special_tokens=True)
    return THINK_BLOCK.sub("", text, count=1) if chat else text


def needed_model_len(prompt_rows: Sequence[Sequence[int]], max_tokens: int, configured: int | None) -> int:
    """The engine's context length: the longest prompt plus the completion budget, or the configured one if it fits."""
    needed = max((len(row) for row in prompt_rows), default=1) + max_tokens
    if configured is None:
        return needed
    if configured < needed:
        raise ValueError(f"max_model_len = {configured} is below what the hidden eval needs ({needed}: longest prompt plus completion budget)")
    return configured


def generate_vllm(llm: Any, prompt_rows: list[list[int]], kwargs: dict[str, Any], sampling_params_class: Any = None) -> list[list[list[int]]]:
    """Completion token ids per prompt (``n`` each, in sample order) from a loaded ``vllm.LLM`` (or its call shape)."""
    if sampling_params_class is None:
        from vllm import SamplingParams

        sampling_params_class = SamplingParams
    outputs = llm.generate([{"prompt_token_ids": row} for row in prompt_rows], sampling_params_class(**kwargs), use_tqdm=False)
    if len(outputs) != len(prompt_rows):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(prompt_rows)} prompts")
    rows = []
    for request in outputs:
        samples = sorted(request.outputs, key=lambda sample: sample.index)
        if len(samples) != kwargs["n"]:
            raise ValueError(f"vLLM returned {len(samples)} completions for a prompt scored with n = {kwargs['n']}")
        rows.append([list(sample.token_ids) for sample in samples])
    return rows


def generate_torch(model: Any, prompt_rows: list[list[int]], kwargs: dict[str, Any], pad_id: int | None) -> list[list[list[int]]]:
    """The same generation with transformers on the CPU: one prompt at a time, the same banned tokens, stop and seeds."""
    import torch

    banned = sorted(set(range(model.config.vocab_size)) - set(kwargs.get("allowed_token_ids", range(model.config.vocab_size))))
    eos = kwargs["stop_token_ids"][0]
    rows = []
    for prompt in prompt_rows:
        samples = []
        for index in range(kwargs["n"]):
            options: dict[str, Any] = {
                "max_new_tokens": kwargs["max_tokens"],
                "eos_token_id": eos,
                "pad_token_id": pad_id if pad_id is not None else eos,
                "bad_words_ids": [[token] for token in banned] or None,
            }
            if kwargs["temperature"] == 0.0:
                options["do_sample"] = False
            else:
                torch.manual_seed(kwargs["seed"] + index)
                options.update(do_sample=True, temperature=kwargs["temperature"], top_p=kwargs.get("top_p", 1.0), top_k=0)
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones((1, len(prompt)), dtype=torch.long), **options)
            samples.append(out[0, len(prompt) :].tolist())
        rows.append(samples)
    return rows


MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
"""What a fresh download of a hub model fetches (weights, config, tokenizer, chat template)."""


def download_model(model: str, target: Path) -> str:
    """Download a hub model's current files into ``target`` (a private folder) and return it."""
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=model, local_dir=str(target), allow_patterns=MODEL_FILES)


def score_request(request: dict[str, Any], model: str, engine: str, *, llm_class: Any = None, sampling_params_class: Any = None) -> dict[str, Any]:
    """Completions of ``model`` on the request's prompts: ``{"model", "prompt_format", "completions", "load_s", "generate_s"}``."""
    from transformers import AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    chat = uses_chat(tokenizer, bool(request.get("chat", True)))
    prompt_rows = prompt_token_rows(tokenizer, request["prompts"], chat)
    kwargs = generation_kwargs(
        eos_id=tokenizer.eos_token_id,
        forbidden=forbidden_ids(tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id),
        vocab_size=len(tokenizer),
        max_tokens=int(request["max_tokens"]),
        pass_k=int(request["pass_k"]),
        temperature=float(request["temperature"]),
        seed=int(request["seed"]),
    )
    settings = request["engine"]
    if engine == "vllm":
        if llm_class is None:
            from vllm import LLM

            llm_class = LLM
        max_model_len = needed_model_len(prompt_rows, kwargs["max_tokens"], settings.get("max_model_len"))
        llm = llm_class(
            **engine_kwargs(
                model, dtype=settings["dtype"], gpu_memory_utilization=settings["gpu_memory_utilization"], max_model_len=max_model_len, seed=settings["seed"]
            )
        )
        loaded = time.perf_counter()
        token_rows = generate_vllm(llm, prompt_rows, kwargs, sampling_params_class)
    elif engine == "torch":
        from transformers import AutoModelForCausalLM

        torch_model = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype="float32")
        torch_model.eval()
        loaded = time.perf_counter()
        token_rows = generate_torch(torch_model, prompt_rows, kwargs, tokenizer.pad_token_id)
    else:
        raise ValueError(f"unknown engine {engine!r}; use vllm or torch")
    completions = [[completion_text(tokenizer, row, chat) for row in samples] for samples in token_rows]
    return {
        "model": model,
        "prompt_format": "chat" if chat else "raw",
        "completions": completions,
        "load_s": round(loaded - started, 3),
        "generate_s": round(time.perf_counter() - loaded, 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Generate one model's completions for an eval request and write them as JSON to --out."""
    parser = argparse.ArgumentParser(prog="scoring.py", description=main.__doc__)
    parser.add_argument("--request", required=True, help="eval request JSON (prompts, budget, pass@k, engine settings)")
    parser.add_argument("--model", required=True, help="Hugging Face weights folder or cached hub id")
    parser.add_argument("--out", required=True, help="where to write the completions JSON")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "torch"), help="generation engine (torch: CPU, no vLLM)")
    parser.add_argument("--download-to", help="download the hub model MODEL afresh into this folder and score that copy")
    args = parser.parse_args(argv)
    request = json.loads(Path(args.request).read_text(encoding="utf-8"))
    model = download_model(args.model, Path(args.download_to)) if args.download_to else args.model
    result = score_request(request, model, args.engine)
    result["model"] = args.model
    out = Path(args.out)
    temporary = out.with_suffix(".tmp")
    temporary.write_text(json.dumps(result), encoding="utf-8")
    temporary.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
