"""The dry-run plan of the local backends: nothing billed; which local stand-in models they load, and what runs on this machine. Pure."""

from __future__ import annotations

from metarl.backends.local.config import LocalAgentBackend, LocalEvalBackend, LocalOuterBackend, LocalTrainBackend
from metarl.planning import CostLine, LocalModelUser, PlanInputs, StagePlan
from schemas.job import train_defaults


def agent_plan(backend: LocalAgentBackend, inputs: PlanInputs) -> StagePlan:
    """The local torch policy: not billed."""
    cost = CostLine(stage="agent", backend="local", usd=0.0, upper_usd=0.0, kind="not billed", basis="the local torch policy on this machine's CPU")
    return StagePlan(cost=cost, local_note="the trainer agent as the local torch policy")


def train_plan(backend: LocalTrainBackend, inputs: PlanInputs) -> StagePlan:
    """GRPO processes on this machine's CPU: not billed."""
    cost = CostLine(stage="train", backend="local", usd=0.0, upper_usd=0.0, kind="not billed", basis="GRPO processes on this machine's CPU")
    note = f"inner jobs as local GRPO processes (up to {backend.max_concurrent_jobs} at once, job folders under {inputs.config.artifacts.root}/jobs); no pods"
    return StagePlan(
        cost=cost,
        job_defaults=train_defaults("local"),
        local_models=[LocalModelUser(who="train (local)", cache_dir=backend.model_cache_dir, scale=backend.model_scale)],
        local_note=note,
    )


def eval_plan(backend: LocalEvalBackend, inputs: PlanInputs) -> StagePlan:
    """Scoring on this machine's CPU: not billed."""
    cost = CostLine(stage="eval", backend="local", usd=0.0, upper_usd=0.0, kind="not billed", basis="scoring on this machine's CPU")
    return StagePlan(
        cost=cost,
        local_models=[LocalModelUser(who="eval (local)", cache_dir=backend.model_cache_dir, scale=backend.model_scale)],
        local_note="hidden-eval scoring on the CPU",
    )


def outer_plan(backend: LocalOuterBackend, inputs: PlanInputs) -> StagePlan:
    """The local policy update: not billed."""
    return StagePlan(
        cost=CostLine(stage="outer", backend="local", usd=0.0, upper_usd=0.0, kind="not billed", basis="the local policy update on this machine's CPU")
    )
