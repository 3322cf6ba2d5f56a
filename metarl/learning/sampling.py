"""KV-cached batched sampling that returns per-token logprobs and the completion mask.

Prompts are left padded; positions are ``cumsum(mask) - 1`` so padding does not shift them.
The EOS token belongs to the completion (mask 1); everything after it is padding (mask 0).
Pad and BOS are never sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PromptBatch:
    """Left-padded prompt token ids and their attention mask, both ``(batch, prompt_len)``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass(frozen=True)
class CompletionBatch:
    """Sampled completions, all ``(batch, completion_len)``: ids, sampling logprobs, and mask."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor


def encode_prompts(tokenizer, prompts: list[str]) -> PromptBatch:
    """Tokenise prompts (BOS prepended by the tokenizer) into one left-padded batch."""
    encoded = tokenizer(prompts, padding=True, return_tensors="pt", padding_side="left")
    return PromptBatch(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: ``cumsum(mask) - 1``, clamped at 0 on pad slots."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def mask_after_eos(token_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for every token up to and including the first EOS of each row, 0 after it."""
    is_eos = (token_ids == eos_id).long()
    eos_seen_before = is_eos.cumsum(dim=-1) - is_eos
    return (eos_seen_before == 0).long()


def mask_forbidden(logits: torch.Tensor, forbidden_ids: tuple[int, ...]) -> torch.Tensor:
    """A copy of ``logits`` with the forbidden token columns set to -inf (the policy never emits them)."""
    masked = logits.clone()
    masked[..., list(forbidden_ids)] = float("-inf")
    return masked


def _pick_tokens(logits: torch.Tensor, temperature: float, greedy: bool, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose next tokens and return them with their logprobs under the temperature-scaled distribution."""
    if greedy:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        tokens = logprobs.argmax(dim=-1)
    else:
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        tokens = torch.multinomial(logprobs.exp(), num_samples=1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@torch.no_grad()
def sample_completions(
    model,
    prompts: PromptBatch,
    *,
    max_tokens: int,
    eos_id: int,
    pad_id: int,
    forbidden_ids: tuple[int, ...],
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> CompletionBatch:
    """Sample up to ``max_tokens`` tokens per prompt with a KV cache; stop early when every row hit EOS."""
    attention_mask = prompts.attention_mask.clone()
    positions = position_ids_from_mask(attention_mask)
    output = model(
        input_ids=prompts.input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = output.cache
    next_logits = output.logits[:, -1, :]
    next_positions = positions[:, -1:] + 1
    batch_size = prompts.input_ids.shape[0]
    finished = torch.zeros(batch_size, dtype=torch.bool)
    chosen_tokens: list[torch.Tensor] = []
    chosen_logprobs: list[torch.Tensor] = []
    chosen_mask: list[torch.Tensor] = []
    for _ in range(max_tokens):
        tokens, logprobs = _pick_tokens(mask_forbidden(next_logits, forbidden_ids), temperature, greedy, generator)
        tokens = torch.where(finished, torch.full_like(tokens, pad_id), tokens)
        chosen_tokens.append(tokens)
        chosen_logprobs.append(torch.where(finished, torch.zeros_like(logprobs), logprobs))
        chosen_mask.append((~finished).long())
        finished = finished | (tokens == eos_id)
        if bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones(batch_size, 1, dtype=attention_mask.dtype)], dim=1)
        output = model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=next_positions,
            cache=cache,
            use_cache=True,
        )
        cache = output.cache
        next_logits = output.logits[:, -1, :]
        next_positions = next_positions + 1
    return CompletionBatch(
        token_ids=torch.stack(chosen_tokens, dim=1),
        logprobs=torch.stack(chosen_logprobs, dim=1),
        mask=torch.stack(chosen_mask, dim=1),
    )


def decode_completions(tokenizer, completions: CompletionBatch) -> list[str]:
    """Decode each completion's unmasked tokens to text, special tokens dropped."""
    texts = []
    for token_ids, mask in zip(completions.token_ids.tolist(), completions.mask.tolist()):
        kept = [token for token, keep in zip(token_ids, mask) if keep]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return texts


def completion_logits(
    model,
    prompts: PromptBatch,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    forbidden_ids: tuple[int, ...] = (),
) -> torch.Tensor:
    """One teacher-forced forward pass; the logits that predict each completion token, forbidden ids at -inf."""
    input_ids = torch.cat([prompts.input_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompts.attention_mask, completion_mask.to(prompts.attention_mask.dtype)], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)).logits
    prompt_len = prompts.input_ids.shape[1]
    return mask_forbidden(logits[:, prompt_len - 1 : prompt_len - 1 + completion_ids.shape[1], :], forbidden_ids)
