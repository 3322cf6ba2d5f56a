"""The local inner trainer: real GRPO on a tiny causal LM on the CPU.

Per step: draw ``batch_size`` prompts, sample ``group_size`` completions each with the KV-cached
sampler (per-token logprobs come with the samples), score them (with the family's graders under
``RewardComponentWeights``, or with a pluggable batch reward function such as the agent's sandboxed
environment module, see :mod:`metarl.probe.reward_source`), turn
rewards into group-relative std-normalised advantages, and take ``updates_per_batch`` AdamW steps
on the PPO-clipped loss (plus an optional KL to the base model). One metrics row per step goes to
``metrics.jsonl``; the trained weights are saved in the base model's Hugging Face format.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from metarl.domain.advantages import group_advantages as domain_group_advantages
from metarl.learning.families import Example, TaskFamily
from metarl.learning.lora import adapters_disabled, apply_lora, merge_lora
from metarl.learning.reward_checks import BatchRewardFn, RewardBounds, RewardFunctionError, checked_rewards
from metarl.learning.runtime import configure_torch_threads
from metarl.learning.sampling import (
    CompletionBatch,
    PromptBatch,
    completion_logits,
    decode_completions,
    encode_prompts,
    sample_completions,
)
from metarl.learning.scoring import format_prompt, load_model
from metarl.learning.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ADVANTAGE_EPS = 1e-6
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoint"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class RewardComponentWeights(BaseModel):
    """Weights of an inner job's reward components (job.toml ``[reward.components]``, named by
    ``metarl.graders.REWARD_COMPONENTS``); a rollout's reward is their weighted sum.

    Not the outer episode reward's weights (``schemas.run_config.EpisodeRewardWeights``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    correctness: float = Field(default=1.0, ge=0.0, le=10.0, description="Weight of the grader score (partial credit).")
    exact: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight of 1 when the answer is exactly right.")
    format: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight of 1 when the answer is well formed.")
    length_penalty: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight of the penalty: completion tokens / max_tokens.")


class LocalTrainConfig(BaseModel):
    """Hyperparameters of one local GRPO inner job (the dataset is passed separately)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_model: str = Field(default="local-s", min_length=1, max_length=128, description="Local model name or catalogued hub name.")
    learning_rate: float = Field(default=3e-4, gt=0.0, le=1.0, description="Peak AdamW learning rate (after warm-up, constant).")
    max_steps: int = Field(default=150, ge=1, le=100_000, description="Most sampling+update steps to run.")
    batch_size: int = Field(default=32, ge=1, le=512, description="Prompts per step.")
    group_size: int = Field(default=8, ge=1, le=64, description="Completions sampled per prompt (1 gives no signal).")
    temperature: float = Field(default=1.0, ge=0.05, le=3.0, description="Sampling temperature of the rollouts.")
    max_tokens: int = Field(default=12, ge=1, le=64, description="Most completion tokens per rollout (EOS included).")
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight of the k3 KL penalty to the base model.")
    lora_rank: int = Field(default=0, ge=0, le=128, description="0 trains all weights; >0 trains LoRA adapters of this rank.")
    lora_alpha: float = Field(default=16.0, gt=0.0, le=1024.0, description="LoRA scale numerator (scale = alpha / rank).")
    clip_eps: float = Field(default=0.2, gt=0.0, le=10.0, description="PPO ratio clip range.")
    updates_per_batch: int = Field(default=1, ge=1, le=16, description="Optimizer steps on each sampled batch.")
    warmup_steps: int = Field(default=10, ge=0, le=10_000, description="Steps of linear learning-rate warm-up.")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    grad_clip: float = Field(default=1.0, gt=0.0, le=100.0, description="Global gradient-norm clip.")
    rewards: RewardComponentWeights = Field(default_factory=RewardComponentWeights, description="Reward component weights.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of data order, sampling and LoRA init.")
    time_budget_s: float = Field(default=60.0, gt=0.0, le=86_400.0, description="Wall-clock budget; no step starts that would overrun it.")

    @model_validator(mode="after")
    def _rewards_not_all_zero(self) -> LocalTrainConfig:
        weights = self.rewards
        if weights.correctness + weights.exact + weights.format == 0.0:
            raise ValueError("at least one of rewards.correctness, rewards.exact, rewards.format must be positive")
        return self


class StepMetrics(BaseModel):
    """One row of ``metrics.jsonl``."""

    step: int = Field(ge=0, description="0-based step index.")
    reward_mean: float = Field(description="Mean reward of the step's rollouts.")
    reward_std: float = Field(ge=0.0, description="Standard deviation of the step's rewards.")
    exact_rate: float = Field(ge=0.0, le=1.0, description="Fraction of rollouts exactly right.")
    zero_advantage_groups: float = Field(ge=0.0, le=1.0, description="Fraction of groups with identical rewards.")
    loss: float = Field(description="Policy loss (plus KL term) of the last update.")
    kl: float = Field(ge=0.0, description="Mean k3 KL estimate to the base (0 when kl_coef is 0).")
    entropy: float = Field(ge=0.0, description="Mean per-token entropy of the policy on the rollouts.")
    clip_fraction: float = Field(ge=0.0, le=1.0, description="Fraction of tokens whose ratio was clipped.")
    completion_tokens: float = Field(ge=0.0, description="Mean completion length in tokens.")
    wall_s: float = Field(ge=0.0, description="Seconds since training started.")


class TrainOutcome(BaseModel):
    """Result of one inner job."""

    checkpoint_dir: str = Field(description="Folder of the trained model in Hugging Face format.")
    metrics_path: str = Field(description="Path of metrics.jsonl.")
    steps_completed: int = Field(ge=0, description="Steps run.")
    stopped_by: Literal["max_steps", "time_budget"] = Field(description="What ended training.")
    wall_seconds: float = Field(ge=0.0, description="Training wall time (loading and saving excluded).")
    trainable_parameters: int = Field(ge=0, description="Parameters updated by the optimizer.")
    first_reward_mean: float = Field(description="Mean reward of the first step.")
    last_reward_mean: float = Field(description="Mean reward of the last step.")


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """Std-normalised group advantages (:func:`metarl.domain.advantages.group_advantages`) of a
    ``(groups, group_size)`` reward tensor, as a tensor of the same shape and dtype: ``(r - mean) / (std + eps)``,
    zeros for a group whose rewards are all equal (any group of size 1 included)."""
    return torch.tensor(domain_group_advantages(rewards.tolist(), normalize_std=True, eps=eps), dtype=rewards.dtype).view(rewards.shape)


def warmup_learning_rate(step: int, peak: float, warmup_steps: int) -> float:
    """Linear warm-up from ``peak / warmup_steps`` to ``peak``, then constant."""
    if warmup_steps == 0 or step >= warmup_steps:
        return peak
    return peak * (step + 1) / warmup_steps


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logprob of each token under ``softmax(logits / temperature)``; shapes ``(B, T, V)`` -> ``(B, T)``.

    Where ``mask`` is given, positions with mask 0 (after EOS) get logprob 0 and no gradient.
    """
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    picked = logprobs.gather(-1, token_ids[..., None]).squeeze(-1)
    if mask is None:
        return picked
    return picked.masked_fill(mask == 0, 0.0)


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` at each position; ``(B, T, V)`` -> ``(B, T)``.

    Columns at -inf (forbidden tokens) contribute nothing.
    """
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    terms = torch.where(torch.isfinite(logprobs), logprobs.exp() * logprobs, torch.zeros_like(logprobs))
    return -terms.sum(dim=-1)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clipped loss averaged over completion tokens, and the clipped-token fraction.

    ``logprobs``, ``old_logprobs`` and ``mask`` are ``(B, T)``; ``advantages`` is ``(B,)``.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    expanded = advantages[:, None].expand_as(ratio)
    unclipped = ratio * expanded
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * expanded
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask)
    clip_fraction = masked_mean((unclipped != clipped).float(), mask)
    return loss, clip_fraction


def k3_kl(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): ``exp(r - p) - (r - p) - 1`` (non-negative)."""
    log_ratio = reference_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def rollout_reward(family: TaskFamily, example: Example, completion: str, completion_tokens: int, config: LocalTrainConfig) -> tuple[float, bool]:
    """(weighted reward, exact) of one completion under the config's reward weights."""
    weights = config.rewards
    exact = family.is_exact(example, completion)
    reward = (
        weights.correctness * family.grade(example, completion)
        + weights.exact * float(exact)
        + weights.format * float(family.is_well_formed(completion))
        - weights.length_penalty * completion_tokens / config.max_tokens
    )
    return reward, exact


def external_rewards(
    reward_fn: BatchRewardFn,
    family: TaskFamily,
    examples: list[Example],
    texts: list[str],
    group_size: int,
    bounds: RewardBounds,
) -> list[tuple[float, bool]]:
    """(reward, exact) per rollout with the rewards from ``reward_fn`` (checked) and exact from the family's grader."""
    owners = [examples[index // group_size] for index in range(len(texts))]
    batch = [(example.prompt, text, example.answer) for example, text in zip(owners, texts)]
    rewards = checked_rewards(reward_fn(batch), batch, bounds)
    return [(reward, family.is_exact(example, text)) for reward, example, text in zip(rewards, owners, texts)]


def _repeat_prompts(prompts: PromptBatch, times: int) -> PromptBatch:
    """Each prompt row repeated ``times`` times in a row (group layout)."""
    return PromptBatch(
        input_ids=prompts.input_ids.repeat_interleave(times, dim=0),
        attention_mask=prompts.attention_mask.repeat_interleave(times, dim=0),
    )


class PromptSampler:
    """Seeded epoch-wise shuffling over the dataset."""

    def __init__(self, dataset: list[Example], seed: int) -> None:
        if not dataset:
            raise ValueError("the training dataset is empty")
        self._dataset = dataset
        self._rng = random.Random(f"grpo-data\x1f{seed}")
        self._order: list[int] = []

    def next_batch(self, size: int) -> list[Example]:
        """The next ``size`` examples, reshuffling at every epoch boundary."""
        batch: list[Example] = []
        while len(batch) < size:
            if not self._order:
                self._order = list(range(len(self._dataset)))
                self._rng.shuffle(self._order)
            batch.append(self._dataset[self._order.pop()])
        return batch


def _copy_tokenizer_files(source: Path, target: Path) -> None:
    """Copy the tokenizer files of a model folder into another."""
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)


@dataclass
class TrainerState:
    """Everything one GRPO step needs besides the config and the batch."""

    model: PreTrainedModel
    reference_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    parameters: list[torch.nn.Parameter]
    tokenizer: PreTrainedTokenizerBase
    generator: torch.Generator
    forbidden_ids: tuple[int, ...]


def _setup(config: LocalTrainConfig, base_dir: Path) -> tuple[TrainerState, int]:
    """Load the base model (with LoRA adapters or a frozen KL reference as configured); return state and trainable count."""
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(base_dir)
    model = load_model(base_dir)
    reference_model = None
    if config.lora_rank > 0:
        trainable = apply_lora(model, config.lora_rank, config.lora_alpha)
    else:
        trainable = sum(parameter.numel() for parameter in model.parameters())
        if config.kl_coef > 0:
            reference_model = copy.deepcopy(model).eval()
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    state = TrainerState(
        model=model,
        reference_model=reference_model,
        optimizer=torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=config.weight_decay),
        parameters=parameters,
        tokenizer=tokenizer,
        generator=torch.Generator().manual_seed(config.seed),
        forbidden_ids=(tokenizer.pad_token_id, tokenizer.bos_token_id),
    )
    return state, trainable


def train(
    config: LocalTrainConfig,
    dataset: list[Example],
    family: TaskFamily,
    base_model_dir: Path | str,
    out_dir: Path | str,
    *,
    after_step: Callable[[StepMetrics, torch.nn.Module], None] | None = None,
    reward_fn: BatchRewardFn | None = None,
    reward_bounds: RewardBounds | None = None,
) -> TrainOutcome:
    """Run GRPO from the base model on ``dataset``; write ``metrics.jsonl`` and ``checkpoint/`` in ``out_dir``.

    ``after_step(metrics, model)``, when given, is called after every step (for monitoring only).

    ``reward_fn``, when given, is the reward source: it gets each step's rollouts as
    ``(prompt, completion, answer)`` tuples and returns one reward per rollout, checked and clamped
    by :func:`metarl.probe.reward_source.checked_rewards` under ``reward_bounds``; ``config.rewards`` is
    then unused, and ``exact_rate`` still reports the family's exact-match grader (monitoring only).
    When it fails (or returns unusable rewards) training stops with :class:`RewardFunctionError`
    naming the step; the metrics of the steps before stay in ``metrics.jsonl`` and no checkpoint
    is written. Without it the built-in graders score the rollouts, exactly as before.
    """
    bounds = reward_bounds or RewardBounds()
    configure_torch_threads()
    base_dir = Path(base_model_dir)
    output_dir = Path(out_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    prompt_sampler = PromptSampler(dataset, config.seed)
    state, trainable = _setup(config, base_dir)
    metrics_path = output_dir / METRICS_FILE
    started = time.monotonic()
    rows: list[StepMetrics] = []
    stopped_by: Literal["max_steps", "time_budget"] = "max_steps"
    with open(metrics_path, "w") as metrics_file:
        for step in range(config.max_steps):
            elapsed = time.monotonic() - started
            mean_step_seconds = elapsed / step if step else 0.0
            if elapsed + mean_step_seconds > config.time_budget_s:
                stopped_by = "time_budget"
                break
            for group in state.optimizer.param_groups:
                group["lr"] = warmup_learning_rate(step, config.learning_rate, config.warmup_steps)
            batch = prompt_sampler.next_batch(config.batch_size)
            try:
                row = _grpo_step(step, config, state, family, batch, reward_fn, bounds)
            except RewardFunctionError as err:
                raise err.at_step(step) from None
            row = row.model_copy(update={"wall_s": round(time.monotonic() - started, 3)})
            rows.append(row)
            metrics_file.write(row.model_dump_json() + "\n")
            metrics_file.flush()
            if after_step is not None:
                after_step(row, state.model)
    wall_seconds = time.monotonic() - started
    checkpoint_dir = output_dir / CHECKPOINT_DIR
    if config.lora_rank > 0:
        merge_lora(state.model)
    state.model.save_pretrained(str(checkpoint_dir))
    _copy_tokenizer_files(base_dir, checkpoint_dir)
    (output_dir / "train_config.json").write_text(config.model_dump_json(indent=2))
    return TrainOutcome(
        checkpoint_dir=str(checkpoint_dir),
        metrics_path=str(metrics_path),
        steps_completed=len(rows),
        stopped_by=stopped_by,
        wall_seconds=round(wall_seconds, 3),
        trainable_parameters=trainable,
        first_reward_mean=rows[0].reward_mean if rows else 0.0,
        last_reward_mean=rows[-1].reward_mean if rows else 0.0,
    )


def _grpo_step(
    step: int,
    config: LocalTrainConfig,
    state: TrainerState,
    family: TaskFamily,
    examples: list[Example],
    reward_fn: BatchRewardFn | None = None,
    bounds: RewardBounds | None = None,
) -> StepMetrics:
    """Sample one batch of groups, score it (built-in graders, or ``reward_fn``), and run the clipped-loss updates on it."""
    group_size = config.group_size
    tokenizer, model = state.tokenizer, state.model
    prompts = _repeat_prompts(encode_prompts(tokenizer, [format_prompt(example) for example in examples]), group_size)
    model.eval()
    completions = sample_completions(
        model,
        prompts,
        max_tokens=config.max_tokens,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        forbidden_ids=state.forbidden_ids,
        temperature=config.temperature,
        generator=state.generator,
    )
    texts = decode_completions(tokenizer, completions)
    lengths = completions.mask.sum(dim=1).tolist()
    if reward_fn is None:
        scored = [rollout_reward(family, examples[index // group_size], text, int(length), config) for index, (text, length) in enumerate(zip(texts, lengths))]
    else:
        scored = external_rewards(reward_fn, family, examples, texts, group_size, bounds or RewardBounds())
    rewards = torch.tensor([reward for reward, _ in scored], dtype=torch.float32)
    grouped_rewards = rewards.view(len(examples), group_size)
    advantages = group_advantages(grouped_rewards).view(-1)
    mask = completions.mask
    reference_logprobs = None
    if config.kl_coef > 0:
        reference_logprobs = _reference_logprobs(state, prompts, completions, config.temperature)
    needs_update = bool(advantages.abs().sum() > 0) or config.kl_coef > 0
    model.train()
    loss_value, kl_value, entropy_value, clip_value = 0.0, 0.0, 0.0, 0.0
    for update in range(config.updates_per_batch if needs_update else 1):
        with torch.set_grad_enabled(needs_update):
            logits = completion_logits(model, prompts, completions.token_ids, mask, state.forbidden_ids)
            logprobs = token_logprobs(logits, completions.token_ids, config.temperature, mask)
            loss, clip_fraction = clipped_policy_loss(logprobs, completions.logprobs, advantages, mask, config.clip_eps)
            if reference_logprobs is not None:
                kl = masked_mean(k3_kl(logprobs, reference_logprobs), mask)
                loss = loss + config.kl_coef * kl
                kl_value = kl.item()
        if update == 0:
            entropy_value = masked_mean(token_entropy(logits.detach(), config.temperature), mask).item()
        if needs_update:
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(state.parameters, config.grad_clip)
            state.optimizer.step()
        loss_value, clip_value = loss.item(), clip_fraction.item()
    return StepMetrics(
        step=step,
        reward_mean=rewards.mean().item(),
        reward_std=rewards.std(unbiased=False).item(),
        exact_rate=sum(exact for _, exact in scored) / len(scored),
        zero_advantage_groups=(grouped_rewards.std(dim=1, unbiased=False) == 0).float().mean().item(),
        loss=loss_value,
        kl=max(kl_value, 0.0),
        entropy=max(entropy_value, 0.0),
        clip_fraction=clip_value,
        completion_tokens=mask.sum(dim=1).float().mean().item(),
        wall_s=0.0,
    )


@torch.no_grad()
def _reference_logprobs(state: TrainerState, prompts: PromptBatch, completions: CompletionBatch, temperature: float) -> torch.Tensor:
    """Logprobs of the sampled tokens under the base model (adapters off, or the frozen copy)."""
    token_ids, mask, forbidden = completions.token_ids, completions.mask, state.forbidden_ids
    if state.reference_model is None:
        state.model.eval()
        with adapters_disabled(state.model):
            logits = completion_logits(state.model, prompts, token_ids, mask, forbidden)
    else:
        logits = completion_logits(state.reference_model, prompts, token_ids, mask, forbidden)
    return token_logprobs(logits, completions.token_ids, temperature, completions.mask)


def read_metrics(metrics_path: Path | str) -> list[StepMetrics]:
    """Parse a ``metrics.jsonl`` file."""
    lines = Path(metrics_path).read_text().splitlines()
    return [StepMetrics.model_validate(json.loads(line)) for line in lines if line.strip()]
