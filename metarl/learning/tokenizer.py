"""Character-level vocabulary shared by all task families, saved as a Hugging Face tokenizer.

Every character is one token; the tokenizer prepends ``<bos>`` to each encoded text, and a
completion ends with ``<eos>``. The saved folder loads with ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

CHARACTERS: str = "0123456789abcdefghijklmnopqrstuvwxyz +-=,:>/?.[]()"
"""Every character a prompt or answer of any family may contain."""


def vocabulary() -> dict[str, int]:
    """The token-to-id map: special tokens first (pad = 0), then one id per character."""
    tokens = list(SPECIAL_TOKENS) + list(CHARACTERS)
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer():
    """Build the character-level ``PreTrainedTokenizerFast`` in memory (no files, no network)."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
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


def save_tokenizer(directory: Path) -> None:
    """Write the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ...) into ``directory``."""
    build_tokenizer().save_pretrained(str(directory))


def load_tokenizer(directory: Path):
    """Load the tokenizer saved in ``directory`` (a base model or checkpoint folder), offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
