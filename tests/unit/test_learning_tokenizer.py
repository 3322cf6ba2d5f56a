"""The stand-in models' tokenizer: the characters keep their ids, the byte fallback covers any printable text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from metarl.learning.registry import FAMILIES
from metarl.learning.tokenizer import (
    BYTE_TOKENS,
    CHARACTERS,
    SPECIAL_TOKENS,
    UNK_TOKEN,
    build_tokenizer,
    load_tokenizer,
    needs_byte_fallback,
    save_tokenizer,
    vocabulary,
)

PRINTABLE = ["é→ü", "naïve café 😀", "Hello, World!", "日本語 テキスト", "tab\tand {braces} 'quotes' \"double\" #1 @ ~ `x`", "a  b ", "Ω≈ç√∫"]


def test_the_characters_keep_their_ids_and_the_bytes_come_after_them():
    narrow, wide = vocabulary(), vocabulary(byte_fallback=True)
    assert list(narrow) == list(SPECIAL_TOKENS) + list(CHARACTERS)
    assert list(narrow.values()) == list(range(len(narrow)))
    assert {token: wide[token] for token in narrow} == narrow
    assert [wide[token] for token in BYTE_TOKENS] == list(range(len(narrow), len(narrow) + 256))
    assert narrow["<pad>"] == 0 and narrow["0"] == 4 and narrow[")"] == len(narrow) - 1


def test_the_six_families_encode_the_same_with_and_without_the_fallback():
    narrow, wide = build_tokenizer(), build_tokenizer(byte_fallback=True)
    rng = random.Random(1)
    for family in FAMILIES.values():
        for _ in range(40):
            example = family.generate(rng, rng.random())
            for text in (example.prompt, example.answer):
                ids = narrow(text)["input_ids"]
                assert ids == wide(text)["input_ids"]
                assert ids == [narrow.bos_token_id] + [vocabulary()[character] for character in text]
                assert wide.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("text", PRINTABLE)
def test_the_byte_fallback_round_trips_printable_text(text: str, tmp_path: Path) -> None:
    save_tokenizer(tmp_path, byte_fallback=True)
    tokenizer = load_tokenizer(tmp_path)
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.convert_tokens_to_ids(UNK_TOKEN) not in ids
    assert max(ids) < len(vocabulary(byte_fallback=True))
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    known = sum(character in CHARACTERS for character in text)
    assert len(ids) == 1 + known + sum(len(character.encode()) for character in text if character not in CHARACTERS)


def test_without_the_fallback_unknown_characters_are_unk():
    tokenizer = build_tokenizer()
    ids = tokenizer("é→ü")["input_ids"]
    assert ids[1:] == [tokenizer.convert_tokens_to_ids(UNK_TOKEN)] * 3


def test_needs_byte_fallback():
    assert not needs_byte_fallback(["add 27+5=", "23 apr 1987", ""])
    assert needs_byte_fallback(["add 27+5=", "Hello"])
    assert needs_byte_fallback(["é"])
