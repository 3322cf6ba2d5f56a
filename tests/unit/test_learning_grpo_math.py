"""Pure GRPO maths: advantages, clipped loss, KL, masking, rewards, config validation."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from metarl.learning.families import Example
from metarl.learning.grpo import (
    LocalTrainConfig,
    PromptSampler,
    RewardComponentWeights,
    clipped_policy_loss,
    group_advantages,
    k3_kl,
    masked_mean,
    rollout_reward,
    token_entropy,
    token_logprobs,
    warmup_learning_rate,
)
from metarl.learning.registry import get_family
from metarl.learning.sampling import mask_after_eos, position_ids_from_mask


def test_group_advantages_are_standardised_per_group() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4, 0.6, 0.8]])
    advantages = group_advantages(rewards)
    assert torch.allclose(advantages.mean(dim=1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(advantages.std(dim=1, unbiased=False), torch.ones(2), atol=1e-4)
    assert advantages[0, 0] > 0 > advantages[0, 1]


def test_group_advantages_are_zero_for_uniform_groups_and_group_size_one() -> None:
    assert torch.equal(group_advantages(torch.full((3, 5), 0.7)), torch.zeros(3, 5))
    assert torch.equal(group_advantages(torch.tensor([[0.1], [0.9]])), torch.zeros(2, 1))


def test_masked_mean_ignores_masked_positions() -> None:
    values = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_clipped_loss_on_policy_equals_negative_mean_advantage() -> None:
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    mask = torch.tensor([[1, 1], [1, 0]])
    advantages = torch.tensor([1.0, -2.0])
    loss, clip_fraction = clipped_policy_loss(logprobs, logprobs.clone(), advantages, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-(1.0 + 1.0 - 2.0) / 3)
    assert clip_fraction.item() == 0.0


def test_clipped_loss_clips_large_ratios_for_positive_advantage() -> None:
    old = torch.tensor([[math.log(0.1)]])
    new = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, clip_fraction = clipped_policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), clip_eps=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert clip_fraction.item() == 1.0
    loss.backward()
    assert new.grad is not None and new.grad.abs().sum().item() == 0.0


def test_clipped_loss_keeps_gradient_when_ratio_moves_against_negative_advantage() -> None:
    old = torch.tensor([[math.log(0.1)]])
    new = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, _ = clipped_policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 1), clip_eps=0.2)
    assert loss.item() == pytest.approx(5.0)
    loss.backward()
    assert new.grad.item() > 0


def test_loss_gradient_raises_logprob_of_positive_advantage_tokens() -> None:
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    tokens = torch.tensor([[2]])
    logprobs = token_logprobs(logits, tokens, temperature=1.0)
    loss, _ = clipped_policy_loss(logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 1), 0.2)
    loss.backward()
    assert logits.grad[0, 0, 2] < 0
    assert all(logits.grad[0, 0, index] > 0 for index in (0, 1, 3))


def test_k3_kl_is_zero_at_equality_and_positive_otherwise() -> None:
    logprobs = torch.tensor([-1.0, -2.0, -0.3])
    assert torch.allclose(k3_kl(logprobs, logprobs), torch.zeros(3))
    assert (k3_kl(logprobs, logprobs - 0.5) > 0).all()
    assert (k3_kl(logprobs, logprobs + 0.5) > 0).all()


def test_token_logprobs_and_entropy_respect_temperature() -> None:
    logits = torch.tensor([[[2.0, 0.0, 0.0]]])
    tokens = torch.tensor([[0]])
    sharp = token_logprobs(logits, tokens, temperature=0.5)
    flat = token_logprobs(logits, tokens, temperature=2.0)
    assert sharp.item() > flat.item()
    uniform = token_entropy(torch.zeros(1, 1, 3), temperature=1.0)
    assert uniform.item() == pytest.approx(math.log(3))
    assert token_entropy(logits, 0.5).item() < token_entropy(logits, 2.0).item()


def test_masked_logprobs_and_entropy_stay_finite_with_forbidden_tokens() -> None:
    logits = torch.tensor([[[float("-inf"), 1.0, 0.0], [float("-inf"), 0.5, 0.5]]], requires_grad=True)
    tokens = torch.tensor([[1, 0]])
    mask = torch.tensor([[1, 0]])
    logprobs = token_logprobs(logits, tokens, 1.0, mask)
    assert logprobs[0, 1].item() == 0.0 and torch.isfinite(logprobs).all()
    assert torch.isfinite(token_entropy(logits, 1.0)).all()
    kl = masked_mean(k3_kl(logprobs, logprobs.detach() - 0.1), mask)
    kl.backward()
    assert torch.isfinite(logits.grad).all()


def test_mask_after_eos_keeps_eos_and_drops_the_rest() -> None:
    eos = 2
    tokens = torch.tensor([[5, 6, 2, 0, 0], [5, 2, 7, 2, 0], [5, 6, 7, 8, 9]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert torch.equal(mask_after_eos(tokens, eos), expected)


def test_position_ids_ignore_left_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_warmup_learning_rate() -> None:
    assert warmup_learning_rate(0, 1e-3, 10) == pytest.approx(1e-4)
    assert warmup_learning_rate(9, 1e-3, 10) == pytest.approx(1e-3)
    assert warmup_learning_rate(50, 1e-3, 10) == pytest.approx(1e-3)
    assert warmup_learning_rate(0, 1e-3, 0) == pytest.approx(1e-3)


def test_rollout_reward_combines_components() -> None:
    family = get_family("addition")
    example = Example(prompt="add 15+27=", answer="42")
    config = LocalTrainConfig(max_tokens=4, rewards=RewardComponentWeights(correctness=1.0, exact=2.0, format=0.5, length_penalty=1.0))
    reward, exact = rollout_reward(family, example, "42", completion_tokens=3, config=config)
    assert exact
    assert reward == pytest.approx(1.0 + 2.0 + 0.5 - 0.75)
    reward, exact = rollout_reward(family, example, "zz", completion_tokens=3, config=config)
    assert not exact
    assert reward == pytest.approx(0.0 + 0.0 + 0.0 - 0.75)


def test_config_bounds_and_reward_validation() -> None:
    with pytest.raises(ValidationError):
        LocalTrainConfig(learning_rate=0.0)
    with pytest.raises(ValidationError):
        LocalTrainConfig(group_size=0)
    with pytest.raises(ValidationError):
        LocalTrainConfig(unknown_field=1)
    with pytest.raises(ValidationError):
        LocalTrainConfig(rewards=RewardComponentWeights(correctness=0.0, exact=0.0, format=0.0, length_penalty=1.0))
    for name, field in LocalTrainConfig.model_fields.items():
        assert field.description, name


def test_prompt_sampler_cycles_through_shuffled_epochs() -> None:
    dataset = [Example(prompt=f"p{index}", answer="a") for index in range(5)]
    sampler = PromptSampler(dataset, seed=3)
    first_epoch = sampler.next_batch(5)
    assert sorted(example.prompt for example in first_epoch) == sorted(example.prompt for example in dataset)
    again = PromptSampler(dataset, seed=3)
    assert again.next_batch(7)[:5] == first_epoch
    with pytest.raises(ValueError):
        PromptSampler([], seed=0)
