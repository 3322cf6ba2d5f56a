"""Group-relative advantages, defined once (metarl.domain.advantages) for the outer update and the local inner trainer."""

from __future__ import annotations

import math
import random

import pytest
import torch

from metarl.domain.advantages import group_advantages
from metarl.learning.grpo import group_advantages as tensor_group_advantages


def test_advantages_are_group_relative():
    advantages = group_advantages([[1.0, 0.0, 0.0, 1.0], [0.2, 0.5, 0.8]])
    assert advantages[0] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert advantages[1] == pytest.approx([-0.3, 0.0, 0.3])
    assert all(abs(sum(group)) < 1e-9 for group in advantages)


def test_equal_rewards_and_singletons_give_zeros():
    assert group_advantages([[0.3, 0.3, 0.3], [0.7], []]) == [[0.0, 0.0, 0.0], [0.0], []]
    assert group_advantages([[0.3] * 4], normalize_std=True) == [[0.0] * 4]


def test_std_normalisation_and_mapping_input():
    advantages = group_advantages({7: [1.0, 0.0], 9: [2.0, 2.0]}, normalize_std=True)
    assert set(advantages) == {7, 9}
    assert advantages[7] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert advantages[9] == [0.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        group_advantages([[1.0, math.nan]])


def test_the_trainers_tensor_form_is_the_same_rule() -> None:
    """The local trainer's (groups, group_size) tensor gets the std-normalised rule, (r - mean) / (std + eps)."""
    rng = random.Random(0)
    for groups, size in ((1, 1), (3, 5), (8, 4)):
        rows = [[rng.choice((0.0, 0.25, 1.0)) if rng.random() < 0.5 else rng.uniform(-2.0, 2.0) for _ in range(size)] for _ in range(groups)]
        rows[0] = [0.7] * size  # a flat group
        rewards = torch.tensor(rows, dtype=torch.float32)
        tensor = tensor_group_advantages(rewards, eps=1e-6)
        assert tensor.shape == rewards.shape and tensor.dtype == torch.float32
        plain = group_advantages(rewards.tolist(), normalize_std=True, eps=1e-6)
        assert torch.allclose(tensor, torch.tensor(plain), atol=1e-6)
        assert torch.equal(tensor[0], torch.zeros(size))
        formula = (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True, unbiased=False) + 1e-6)
        assert torch.allclose(tensor[1:], formula[1:], atol=1e-5)
