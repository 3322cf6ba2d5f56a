"""The dry-run plan of the Tinker backends: token-cost upper bounds from the configured turn and context caps. Pure."""

from __future__ import annotations

from metarl.backends.tinker.config import TinkerAgentBackend, TinkerOuterBackend
from metarl.planning import CostLine, PlanInputs, StagePlan
from schemas.backend_config import expect_config


def tinker_attempt_tokens(agent: TinkerAgentBackend) -> tuple[int, int]:
    """(prompt, sampled) tokens of one attempt at most: every turn re-sends a full context and samples its cap."""
    prompt = agent.max_turns * agent.context_window()
    sampled = min(agent.max_turns * agent.max_tokens_per_turn, agent.context_window())
    return prompt, sampled


def tinker_attempt_usd(agent: TinkerAgentBackend) -> float:
    """Most one Tinker agent attempt can cost at the configured prices."""
    prompt, sampled = tinker_attempt_tokens(agent)
    return (prompt * agent.usd_per_million_prompt_tokens + sampled * agent.usd_per_million_sample_tokens) / 1e6


def tinker_update_tokens(outer: TinkerOuterBackend, agent: TinkerAgentBackend, batch_episodes: int, max_attempts: int) -> int:
    """Most tokens one outer update sends through the model: every attempt a full context (the built-in loss needs one pass)."""
    return batch_episodes * max_attempts * agent.context_window()


def agent_plan(backend: TinkerAgentBackend, inputs: PlanInputs) -> StagePlan:
    """Cost of the trainer agent's attempts (up to retries.max_probe_attempts per episode): an upper bound."""
    counts, attempts = inputs.counts, inputs.config.retries.max_probe_attempts
    prompt, sampled = tinker_attempt_tokens(backend)
    usd = counts.total * attempts * tinker_attempt_usd(backend)
    basis = (
        f"upper bound: {counts.total} episodes x {attempts} attempts (retries.max_probe_attempts), each {backend.max_turns} turns re-sending a full "
        f"{backend.max_context_tokens}-token context ({prompt} prompt tokens at ${backend.usd_per_million_prompt_tokens:g}/M) and sampling {sampled} tokens "
        f"(at ${backend.usd_per_million_sample_tokens:g}/M): the bound assumes every attempt uses every turn at the full context"
    )
    return StagePlan(cost=CostLine(stage="agent", backend="tinker", usd=usd, upper_usd=usd, kind="upper bound", basis=basis))


def outer_plan(backend: TinkerOuterBackend, inputs: PlanInputs) -> StagePlan:
    """Cost of the outer updates (one per outer step, on the training episodes of its batch): an upper bound."""
    config = inputs.config
    agent = expect_config(config.backends.agent, TinkerAgentBackend)
    batch = config.outer.groups_per_batch * config.outer.group_size
    tokens = tinker_update_tokens(backend, agent, batch, config.retries.max_probe_attempts)
    usd = inputs.counts.max_outer_steps * tokens * backend.usd_per_million_train_tokens / 1e6
    basis = (
        f"upper bound: {inputs.counts.max_outer_steps} updates x {tokens} tokens ({batch} episodes x {config.retries.max_probe_attempts} attempts x "
        f"{agent.max_context_tokens} tokens) at ${backend.usd_per_million_train_tokens:g}/M; "
        "a recovery after a failed update trains again"
    )
    return StagePlan(cost=CostLine(stage="outer", backend="tinker", usd=usd, upper_usd=usd, kind="upper bound", basis=basis))
