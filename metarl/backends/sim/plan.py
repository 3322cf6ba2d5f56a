"""The dry-run plan of the SIMULATOR backends: simulated prices, no charge for the agent's tokens unless priced. Pure."""

from __future__ import annotations

from metarl.backends.sim.config import SimAgentBackend, SimEvalBackend, SimOuterBackend, SimTrainBackend
from metarl.planning import CostLine, PlanInputs, StagePlan


def agent_plan(backend: SimAgentBackend, inputs: PlanInputs) -> StagePlan:
    """Simulated token cost of one attempt per episode (invalid jobs add attempts: no bound when tokens are priced)."""
    counts = inputs.counts
    usd = counts.total * backend.tokens_mean * backend.usd_per_million_tokens / 1e6
    upper = 0.0 if backend.usd_per_million_tokens == 0 else None
    basis = (
        f"[SIMULATOR] one attempt per episode of {backend.tokens_mean} tokens on average at ${backend.usd_per_million_tokens:g}/M (invalid jobs add attempts)"
    )
    return StagePlan(cost=CostLine(stage="agent", backend="sim", usd=usd, upper_usd=upper, kind="simulated", basis=basis))


def train_plan(backend: SimTrainBackend, inputs: PlanInputs) -> StagePlan:
    """One simulated job per episode at the simulated pod price."""
    counts, root = inputs.counts, inputs.config.artifacts.root
    per_s = backend.usd_per_hour / 3600.0
    usd = counts.total * backend.duration.median_s * per_s
    upper = counts.total * backend.duration.max_s * per_s
    basis = f"[SIMULATOR] one simulated job per episode, median {backend.duration.median_s:g} s (at most {backend.duration.max_s:g} s) at ${backend.usd_per_hour:.2f}/h"
    note = f"[SIMULATOR] a simulated GPU cloud (up to {backend.max_concurrent_jobs} jobs at once, records under {root}/sim-cloud); nothing is trained, no pods"
    return StagePlan(cost=CostLine(stage="train", backend="sim", usd=usd, upper_usd=upper, kind="simulated", basis=basis), local_note=note)


def eval_plan(backend: SimEvalBackend, inputs: PlanInputs) -> StagePlan:
    """No charge."""
    return StagePlan(cost=CostLine(stage="eval", backend="sim", usd=0.0, upper_usd=0.0, kind="not billed", basis="[SIMULATOR] no charge"))


def outer_plan(backend: SimOuterBackend, inputs: PlanInputs) -> StagePlan:
    """No charge."""
    return StagePlan(cost=CostLine(stage="outer", backend="sim", usd=0.0, upper_usd=0.0, kind="not billed", basis="[SIMULATOR] no charge"))
