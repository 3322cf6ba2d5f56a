"""The dry-run plan of the vLLM eval pool: your GPU eval hosts, which have no price here; the local base models it scores. Pure."""

from __future__ import annotations

from metarl.backends.vllm.config import VllmEvalBackend
from metarl.planning import CostLine, LocalModelUser, PlanInputs, StagePlan


def eval_plan(backend: VllmEvalBackend, inputs: PlanInputs) -> StagePlan:
    """Not in the ledger and not estimated (no price for the eval hosts is configured)."""
    basis = "vLLM on your GPU eval hosts: not in the ledger and not estimated (no price for those hosts is configured)"
    return StagePlan(
        cost=CostLine(stage="eval", backend="vllm", usd=0.0, upper_usd=0.0, kind="not billed", basis=basis),
        local_models=[LocalModelUser(who="eval (vllm: base scores, on the eval hosts)", cache_dir=backend.model_cache_dir, scale=backend.model_scale)],
    )
