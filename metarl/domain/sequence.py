"""The sequence an inner job is compiled with, and an upper bound on a prompt's tokens (pure).

:func:`compiled_seq_len` is the one rule: the Runpod compiler writes it to rl.toml as ``seq_len`` and
``[inference.model] max_model_len`` (metarl/backends/runpod/primerl/compiler.py ``seq_len_for``), and the
probe holds the dataset's longest prompt plus ``rollout.max_tokens`` to it (metarl/probe/workspace.py).
Prompts are not tokenized (no model tokenizer is at hand offline): :func:`prompt_tokens_at_most` counts
a prompt's UTF-8 bytes, an upper bound for the byte-level BPE tokenizers of the allowed Qwen3 models
(every token stands for at least one byte), plus :data:`CHAT_FRAMING_TOKENS`.
"""

from __future__ import annotations

MIN_SEQ_LEN = 512
"""Smallest sequence length compiled."""
PROMPT_TOKEN_BUDGET = 256
"""Tokens the compiled sequence keeps for the chat template and the prompt, besides max_tokens."""
SEQ_LEN_MULTIPLE = 256
"""The sequence length is rounded up to a multiple of this."""
CHAT_FRAMING_TOKENS = 32
"""Room for the chat template around one user message (Qwen3's adds 12 tokens with thinking off: the
im_start and im_end markers, the two role names, the newlines and the empty think block)."""


def compiled_seq_len(max_tokens: int, min_seq_len: int = MIN_SEQ_LEN, prompt_token_budget: int = PROMPT_TOKEN_BUDGET, multiple: int = SEQ_LEN_MULTIPLE) -> int:
    """max(min_seq_len, prompt_token_budget + max_tokens), rounded up to a multiple of ``multiple``."""
    needed = max(min_seq_len, prompt_token_budget + max_tokens)
    return -(-needed // multiple) * multiple


def prompt_tokens_at_most(prompt: str) -> int:
    """An upper bound on the tokens of ``prompt`` as one chat-templated user message: its UTF-8 bytes plus the framing."""
    return len(prompt.encode("utf-8")) + CHAT_FRAMING_TOKENS
