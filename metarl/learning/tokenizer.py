"""Character-level vocabulary shared by all task families, with an optional byte fallback, saved as a Hugging Face tokenizer.

Every character of ``CHARACTERS`` is one token; the tokenizer prepends ``<bos>`` to each encoded
text, and a completion ends with ``<eos>``. With the byte fallback (``byte_fallback=True``) any
other character is encoded as its UTF-8 bytes, one ``<0xNN>`` token per byte placed after the
characters, so any printable text encodes and decodes unchanged; without it such a character
is ``<unk>``. The characters keep their ids either way, so text made only of ``CHARACTERS``
encodes the same with or without the fallback. The saved folder loads with
``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

CHARACTERS: str = "0123456789abcdefghijklmnopqrstuvwxyz +-=,:>/?.[]()"
"""The characters with a token of their own: every character of the six built-in families' items."""

BYTE_TOKENS: tuple[str, ...] = tuple(f"<0x{value:02X}>" for value in range(256))
"""The byte-fallback tokens, in byte order (the names the ``tokenizers`` byte fallback looks up)."""


def needs_byte_fallback(texts: Iterable[str]) -> bool:
    """True when some text holds a character outside ``CHARACTERS`` (it would be ``<unk>`` without the fallback)."""
    known = frozenset(CHARACTERS)
    return any(character not in known for text in texts for character in text)


def vocabulary(byte_fallback: bool = False) -> dict[str, int]:
    """The token-to-id map: special tokens first (pad = 0), one id per character, then the 256 byte tokens when ``byte_fallback``."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS) + (list(BYTE_TOKENS) if byte_fallback else [])
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer(byte_fallback: bool = False):
    """Build the character-level ``PreTrainedTokenizerFast`` in memory (no files, no network).

    A BPE model with no merges over single characters: each character is its own token, and with
    ``byte_fallback`` a character outside the vocabulary becomes its UTF-8 byte tokens (the
    decoder turns them back into the character).
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary(byte_fallback)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN, byte_fallback=byte_fallback))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=256,
    )


def save_tokenizer(directory: Path, byte_fallback: bool = False) -> None:
    """Write the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ...) into ``directory``."""
    build_tokenizer(byte_fallback).save_pretrained(str(directory))


def load_tokenizer(directory: Path):
    """Load the tokenizer saved in ``directory`` (a base model or checkpoint folder), offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
