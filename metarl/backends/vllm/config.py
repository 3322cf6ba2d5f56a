"""Config model of the `vllm` eval backend (hidden-eval scoring with vLLM on GPU eval workers)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from schemas.backend_config import EvalBackendConfig

VLLM_EXTRA_FIX = "install the GPU extra on the GPU eval host: pip install -e .[gpu]"
"""How to get vllm where `backends.eval.type = "vllm"` runs (it is not installed by default)."""


class VllmEvalBackend(EvalBackendConfig):
    """Hidden-eval scoring with vLLM on a GPU eval worker: the local scorer's prompts, stop tokens and graders, another engine.

    Needs the `gpu` extra (`pip install -e .[gpu]`) on the host that runs the eval pool. Pass@1 is
    greedy; pass@k samples k completions per item at temperature 1 with per-request seeds.
    """

    type: Literal["vllm"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.vllm.eval:VllmEval"
    planner: ClassVar[str] = "metarl.backends.vllm.plan:eval_plan"
    scores: ClassVar[frozenset[str]] = frozenset({"local"})
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weight and activation dtype in vLLM (float32 matches the CPU scorer most closely)"
    )
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=0.99, description="Fraction of GPU memory vLLM may claim (weights plus KV cache)")
    max_model_len: int | None = Field(
        default=None, ge=16, le=1_048_576, description="Context length of the engine (default: the longest eval prompt plus the eval's completion budget)"
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs one model is sharded over")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the engine and of pass@k sampling")
    timeout_s: float = Field(default=1800.0, ge=10.0, le=86_400.0, description="Longest one scoring subprocess may run (engine start included)")
    model_scale: float = Field(default=1.0, gt=0.0, le=10.0, description="Pretraining scale of the local base models it scores; must match the train backend's")
    model_cache_dir: str | None = Field(default=None, max_length=4096, description="Base-model cache (default METARL_CACHE_DIR or ~/.cache/metarl/models)")


CONFIGS = (VllmEvalBackend,)
