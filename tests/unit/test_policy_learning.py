"""Sanity: the local policy learns under importance-sampling GRPO (one step off-policy, truncated ratios)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metarl.domain.advantages import group_advantages
from metarl.outer_update import (
    build_datum,
    filter_stale,
    local_outer_step,
)
from metarl.policy import job_language as jl
from metarl.policy.local_policy import LocalPolicy
from schemas.base import load_toml_model
from schemas.task_spec import TaskSpec

GROUPS, GROUP_SIZE = 6, 8
CONTEXTS = [jl.context_for_task(load_toml_model(TaskSpec, path)) for path in sorted((Path(__file__).resolve().parents[2] / "tasks_specs").glob("*.toml"))]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_reward(job_tokens: list[int]) -> float:
    """+1 for the larger model with an explicit learning rate (the behaviours the reference learned)."""
    choice = jl.decode_job(job_tokens)
    return float(choice.model == "Qwen/Qwen3-1.7B" and choice.hyperparameters["training.learning_rate"] is not None)


def test_policy_learns_the_larger_model_and_an_explicit_learning_rate():
    started = time.monotonic()
    policy = LocalPolicy()
    optimizer = policy.make_optimizer(3e-3)
    pending: list[tuple[int, list]] = []  # (behaviour version, groups of (sample, reward))
    mean_rewards = []
    for version in range(40):
        groups = []
        for g in range(GROUPS):
            ctx = CONTEXTS[(version + g) % len(CONTEXTS)]
            seeds = [version * 1000 + g * GROUP_SIZE + i for i in range(GROUP_SIZE)]
            samples = policy.sample_batch([ctx] * GROUP_SIZE, seeds)
            groups.append([(sample, toy_reward(sample.job_tokens)) for sample in samples])
        mean_rewards.append(sum(r for group in groups for _, r in group) / (GROUPS * GROUP_SIZE))
        pending.append((version, groups))
        # train one version behind (asynchronous, off-policy), as the outer loop does
        if len(pending) < 2:
            continue
        behaviour_version, batch = pending.pop(0)
        tagged = [[{"policy_version": behaviour_version}] for _ in batch]
        kept, dropped = filter_stale(tagged, current_version=version, max_steps_off_policy=1)
        assert len(kept) == len(batch) and not dropped
        advantages = group_advantages([[r for _, r in group] for group in batch])
        datums = [
            build_datum(sample.prompt_tokens, sample.job_tokens, sample.logprobs, adv)
            for group, group_adv in zip(batch, advantages)
            for (sample, _), adv in zip(group, group_adv)
        ]
        metrics = local_outer_step(policy, optimizer, datums, ratio_cap=2.0, lr=3e-3)
        assert metrics["ratio_max"] <= 50 and metrics["frac_truncated"] <= 0.5
    first, last = sum(mean_rewards[:5]) / 5, sum(mean_rewards[-5:]) / 5
    assert first < 0.3, mean_rewards
    assert last > 0.7, mean_rewards
    assert last - first > 0.4
    assert time.monotonic() - started < 20
