"""Importance-sampling GRPO for the trainer policy: short pure functions plus one local torch step.

The shapes follow Tinker's datums exactly (docs/backends.md, "Tinker: the trainer agent as an LLM"): a sequence `tokens = prompt + completion`
becomes `model_input = tokens[:-1]` and `target_tokens = tokens[1:]`; `logprobs` (behaviour,
i.e. sampling-time) and `advantages` are aligned to the targets, and targets that are still
prompt tokens carry advantage 0 and logprob 0. The loss is importance sampling with the weight
clipped at `ratio_cap`, never zeroed (`importance_sampling_loss`: CISPO with a one-sided clip, the
form the `tinker` outer backend runs as Tinker's built-in `cispo`); staleness is also bounded by
`filter_stale`.

Importing this module never imports the tinker SDK (`to_tinker_datum` does, lazily).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from metarl.domain.batching import is_stale

if TYPE_CHECKING:
    import tinker

    from metarl.policy.local_policy import LocalPolicy

# ---------------------------------------------------------------------------------------------
# Staleness (group advantages: metarl.domain.advantages)
# ---------------------------------------------------------------------------------------------


def _version_of(item: Any) -> int:
    if isinstance(item, Mapping):
        return int(item["policy_version"])
    return int(item.policy_version)


def group_version(episodes: Sequence[Any]) -> int:
    """The behaviour policy version of a group: the oldest version among its episodes."""
    if not episodes:
        raise ValueError("a group needs at least one episode")
    return min(_version_of(episode) for episode in episodes)


class StaleSplit(NamedTuple):
    kept: Any
    dropped: Any


def filter_stale(groups, current_version: int, max_steps_off_policy: int, mode: Literal["drop", "resample"] = "drop") -> StaleSplit:
    """Split groups into (kept, dropped) by staleness: `current_version - group_version > max_steps_off_policy` is stale.

    `groups` is a sequence of groups or a mapping group id -> group; a group is a sequence of
    episodes with a `policy_version` (attribute or key). The result has the same shape as the
    input (lists, or dicts keyed by group id). In `drop` mode the caller discards `dropped`; in
    `resample` mode it re-queues them as fresh episodes of the same task at the current version.
    A group from a version newer than `current_version` is an inconsistency and raises ValueError.
    """
    if mode not in ("drop", "resample"):
        raise ValueError(f"mode is {mode!r}; use 'drop' or 'resample'")
    if max_steps_off_policy < 0:
        raise ValueError("max_steps_off_policy must be >= 0")

    def stale(group: Sequence[Any]) -> bool:
        version = group_version(group)
        if version > current_version:
            raise ValueError(f"a group was sampled with policy version {version}, newer than the current version {current_version}")
        return is_stale(version, current_version, max_steps_off_policy)

    if isinstance(groups, Mapping):
        kept = {key: group for key, group in groups.items() if not stale(group)}
        dropped = {key: group for key, group in groups.items() if key not in kept}
        return StaleSplit(kept, dropped)
    flags = [stale(group) for group in groups]
    return StaleSplit([g for g, stale in zip(groups, flags) if not stale], [g for g, stale in zip(groups, flags) if stale])


# ---------------------------------------------------------------------------------------------
# Datums (Tinker's layout)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Datum:
    """One training sequence in Tinker's layout (all lists have the same length, len(tokens) - 1).

    `mask` (1.0 at completion targets) is local only: Tinker's datum has no mask, as prompt
    targets already carry advantage 0; `to_tinker_datum` leaves it out.
    """

    model_input: list[int]
    target_tokens: list[int]
    logprobs: list[float]
    advantages: list[float]
    mask: list[float]

    def __post_init__(self) -> None:
        n = len(self.model_input)
        if not (len(self.target_tokens) == len(self.logprobs) == len(self.advantages) == len(self.mask) == n):
            raise ValueError("model_input, target_tokens, logprobs, advantages and mask must have the same length")

    @property
    def length(self) -> int:
        return len(self.model_input)


def build_datum(prompt_tokens: Sequence[int], completion_tokens: Sequence[int], behaviour_logprobs: Sequence[float], advantage: float) -> Datum:
    """A datum for one sampled completion with one (sequence-level) advantage.

    Target i predicts tokens[i + 1]; completion token j sits at target prompt_len - 1 + j.
    """
    prompt = [int(t) for t in prompt_tokens]
    completion = [int(t) for t in completion_tokens]
    behaviour = [float(x) for x in behaviour_logprobs]
    if not prompt:
        raise ValueError("the prompt must hold at least one token (the first token is never a target)")
    if not completion:
        raise ValueError("the completion is empty")
    if len(behaviour) != len(completion):
        raise ValueError(f"{len(behaviour)} behaviour logprobs for {len(completion)} completion tokens")
    if not all(math.isfinite(x) and x <= 1e-6 for x in behaviour):
        raise ValueError("behaviour logprobs must be finite and <= 0")
    if not math.isfinite(float(advantage)):
        raise ValueError(f"advantage {advantage} is not finite")
    tokens = prompt + completion
    n_prompt_targets = len(prompt) - 1
    return Datum(
        model_input=tokens[:-1],
        target_tokens=tokens[1:],
        logprobs=[0.0] * n_prompt_targets + behaviour,
        advantages=[0.0] * n_prompt_targets + [float(advantage)] * len(completion),
        mask=[0.0] * n_prompt_targets + [1.0] * len(completion),
    )


def datum_record(datum: Datum) -> dict[str, list]:
    """A datum as plain lists (what a saved local policy state may hold: `torch.load(weights_only=True)` reads it back)."""
    return asdict(datum)


def datum_from_record(record: Mapping[str, Any]) -> Datum:
    """The datum `datum_record` wrote (ValueError when a field is missing or the lengths differ)."""
    names = [field.name for field in fields(Datum)]
    missing = [name for name in names if name not in record]
    if missing:
        raise ValueError(f"a replayed datum lacks {', '.join(missing)}")
    return Datum(**{name: list(record[name]) for name in names})


def kept_batches(latest: list[dict[str, list]], earlier: Sequence[list[dict[str, list]]], keep: int) -> list[list[dict[str, list]]]:
    """The batches a policy state keeps for replay after a step: the step's own datums first, then the earlier kept ones,
    at most `keep` batches (0: none)."""
    if keep < 0:
        raise ValueError(f"keep is {keep}; it must be >= 0")
    return [latest, *earlier][:keep]


def to_tinker_datum(datum: Datum) -> tinker.types.Datum:
    """The real `tinker.types.Datum` (model_input, and target_tokens / logprobs / advantages as TensorData)."""
    from tinker import types

    n = datum.length
    return types.Datum(
        model_input=types.ModelInput.from_ints(list(datum.model_input)),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=list(datum.target_tokens), dtype="int64", shape=[n]),
            "logprobs": types.TensorData(data=list(datum.logprobs), dtype="float32", shape=[n]),
            "advantages": types.TensorData(data=list(datum.advantages), dtype="float32", shape=[n]),
        },
    )


def collate(datums: Sequence[Datum]) -> dict[str, torch.Tensor]:
    """Right-padded tensors [B, T] of a batch of datums, plus `lengths` [B]."""
    if not datums:
        raise ValueError("no datums")
    width = max(d.length for d in datums)
    batch = len(datums)
    out = {
        "inputs": torch.zeros(batch, width, dtype=torch.long),
        "targets": torch.zeros(batch, width, dtype=torch.long),
        "logprobs": torch.zeros(batch, width),
        "advantages": torch.zeros(batch, width),
        "mask": torch.zeros(batch, width),
        "lengths": torch.tensor([d.length for d in datums], dtype=torch.long),
    }
    for row, d in enumerate(datums):
        n = d.length
        out["inputs"][row, :n] = torch.tensor(d.model_input, dtype=torch.long)
        out["targets"][row, :n] = torch.tensor(d.target_tokens, dtype=torch.long)
        out["logprobs"][row, :n] = torch.tensor(d.logprobs)
        out["advantages"][row, :n] = torch.tensor(d.advantages)
        out["mask"][row, :n] = torch.tensor(d.mask)
    return out


# ---------------------------------------------------------------------------------------------
# Loss and the local step
# ---------------------------------------------------------------------------------------------


def importance_sampling_loss(
    new_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ratio_cap: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance-sampling policy-gradient loss with the weight clipped (not zeroed), summed over masked target tokens.

    With r = exp(lp - sampling_lp) and w = min(r, ratio_cap) held constant, the gradient with respect to a
    target's new logprob is -mask * w * adv: every token with a non-zero advantage moves in its advantage's
    direction with a coefficient of at most `ratio_cap`, so a token whose probability grew past the cap is
    still pushed down when its advantage is negative (a `min(r, cap)` inside the gradient would give it none).
    This is CISPO with a one-sided clip, Tinker's built-in `cispo` loss with clip_low_threshold 0 and
    clip_high_threshold `ratio_cap` (see metarl/backends/tinker/outer.py). The value is
    -sum(mask * w * adv); with `ratio_cap=None` value and gradient are exactly Tinker's "importance_sampling"
    loss. Stats are over masked tokens: ratio mean/min/max, the fraction whose weight was clipped, the token
    count, and a k1 estimate of KL(behaviour || new).
    """
    if not (new_logprobs.shape == behaviour_logprobs.shape == advantages.shape == mask.shape):
        raise ValueError("new_logprobs, behaviour_logprobs, advantages and mask must have the same shape")
    if ratio_cap is not None and not ratio_cap >= 1.0:
        raise ValueError(f"ratio_cap is {ratio_cap}; it must be >= 1 (or None for no clipping)")
    active = mask > 0
    # Outside the mask, use a log-ratio of 0 so padding (or -inf) never produces inf * 0 = nan.
    log_ratio = torch.where(active, new_logprobs - behaviour_logprobs, torch.zeros_like(new_logprobs))
    ratio = torch.exp(log_ratio)
    weight = (torch.clamp(ratio, max=ratio_cap) if ratio_cap is not None else ratio).detach()
    # value: the clipped weight; gradient: the clipped weight times d(new logprob)
    surrogate = weight * torch.exp(log_ratio - log_ratio.detach())
    loss = -(surrogate * advantages * mask).sum()
    with torch.no_grad():
        n = int(active.sum())
        if n:
            r = ratio[active]
            stats = {
                "ratio_mean": float(r.mean()),
                "ratio_min": float(r.min()),
                "ratio_max": float(r.max()),
                "frac_truncated": float((r > ratio_cap).float().mean()) if ratio_cap is not None else 0.0,
                "kl_k1": float((-log_ratio[active]).mean()),
                "tokens": float(n),
            }
        else:
            stats = {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0, "frac_truncated": 0.0, "kl_k1": 0.0, "tokens": 0.0}
    return loss, stats


def local_outer_step(
    policy: LocalPolicy,
    optimizer: torch.optim.Optimizer | None,
    datums: Sequence[Datum],
    ratio_cap: float | None,
    lr: float,
    max_grad_norm: float | None = 1.0,
    temperature: float = 1.0,
    floor: float = 0.0,
    entropy_coef: float = 0.0,
) -> dict[str, float]:
    """One Adam step of the local policy on a batch of datums (the `local` outer backend's update).

    `optimizer=None` uses (and creates if needed) the policy's own Adam. The learning rate is
    set to `lr` before the step; `temperature` must be the one the behaviour logprobs were sampled
    at (the policy scores targets at it), and `floor` the exploration floor they were sampled with. `entropy_coef` adds
    an entropy bonus: the loss minus `entropy_coef` times the policy's entropy summed over the job tokens (the same sum
    as the importance-sampling term), so a choice the advantages do not favour is not driven out on noise alone; the
    metric `entropy_mean` (nats per job token) is reported either way. With no datums, or no token with a non-zero
    advantage, no step is taken (`skipped` = 1): Adam's momentum would otherwise move the weights without signal.
    """
    if entropy_coef < 0.0:
        raise ValueError(f"entropy_coef is {entropy_coef}; it must be >= 0")
    if optimizer is None:
        optimizer = policy.make_optimizer(lr)
    metrics = {"datums": float(len(datums)), "lr": float(lr), "skipped": 1.0, "loss": 0.0, "grad_norm": 0.0}
    if not datums:
        return metrics
    batch = collate(datums)
    metrics["adv_abs_mean"] = float((batch["advantages"].abs() * batch["mask"]).sum() / batch["mask"].sum().clamp(min=1))
    for group in optimizer.param_groups:
        group["lr"] = float(lr)
    optimizer.zero_grad(set_to_none=True)
    scores = policy.target_scores(batch["inputs"], batch["targets"], batch["lengths"].tolist(), temperature, floor)
    loss, stats = importance_sampling_loss(scores.logprobs, batch["logprobs"], batch["advantages"], batch["mask"], ratio_cap)
    entropy_sum = (scores.entropy * batch["mask"]).sum()
    if entropy_coef > 0.0:
        loss = loss - entropy_coef * entropy_sum
    metrics.update(stats)
    metrics["entropy_mean"] = float(entropy_sum.detach() / batch["mask"].sum().clamp(min=1))
    metrics["loss"] = float(loss.detach())
    if not bool(((batch["advantages"] != 0) & (batch["mask"] > 0)).any()):
        return metrics
    loss.backward()
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if max_grad_norm is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in params])) if params else torch.tensor(0.0)
    metrics["grad_norm"] = float(grad_norm)
    if not math.isfinite(metrics["grad_norm"]):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError("non-finite gradient in the outer update; the step was not taken")
    optimizer.step()
    metrics["skipped"] = 0.0
    return metrics
