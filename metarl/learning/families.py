"""Task families the tiny local models can learn in seconds, with graders and hidden evals.

Each family generates training items at a difficulty in [0, 1], grades completions with the
graders of :mod:`metarl.graders` (partial credit where sensible; the same file the agent's
environment modules import in the sandbox and on the pod), and draws a deterministic hidden eval. Training and hidden-eval items
are disjoint by construction: every item has a canonical key, a keyed hash of the key (HMAC under
the deployment's secret, :mod:`metarl.learning.eval_secret`) puts it in the training or the eval
partition, the training generator rejects eval-partition items, and the hidden eval draws only
eval-partition items from its own secret seed stream. Without the secret the code cannot tell which
items are held back.

Families are found by name in :mod:`metarl.learning.registry` (the six below are registered there
the same way as plugin packages' families); a task spec may define a family from files alone
(:mod:`metarl.learning.data_families`).
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod

from pydantic import BaseModel, ConfigDict, Field

from metarl import graders
from metarl.graders import BUILTIN_GRADERS, MAX_ANSWER_CHARS, MONTH_NAMES
from metarl.learning.eval_secret import active_eval_secret, keyed_digest

EVAL_PARTITION_MODULUS = 8
"""One item key in this many (by hash) belongs to the hidden-eval partition."""

HIDDEN_EVAL_SEED_NAMESPACE = "metarl-hidden-eval"
PARTITION_NAMESPACE = "metarl-eval-partition"
MAX_GENERATION_ATTEMPTS = 10_000
LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"


class Example(BaseModel):
    """One task item: the prompt shown to the model and the reference answer."""

    model_config = ConfigDict(frozen=True)

    prompt: str = Field(min_length=1, max_length=200, description="Prompt text given to the model.")
    answer: str = Field(min_length=1, max_length=100, description="Reference answer the completion must match.")


def partition_hash(family_name: str, item_key: str, secret: bytes | None = None) -> int:
    """A 64-bit keyed hash of (family, canonical item key) under the hidden-eval secret (the active one by default)."""
    digest = keyed_digest(secret if secret is not None else active_eval_secret(), PARTITION_NAMESPACE, family_name, item_key)
    return int.from_bytes(digest[:8], "big")


def in_eval_partition(family_name: str, item_key: str, secret: bytes | None = None) -> bool:
    """True when the item with this key is reserved for the hidden eval (under ``secret``, the active one by default)."""
    return partition_hash(family_name, item_key, secret) % EVAL_PARTITION_MODULUS == 0


def hidden_eval_rng(family_name: str, version: int, secret: bytes | None = None) -> random.Random:
    """The seed stream of one hidden-eval version, separate from every training seed and keyed by the secret."""
    digest = keyed_digest(secret if secret is not None else active_eval_secret(), HIDDEN_EVAL_SEED_NAMESPACE, family_name, str(version))
    return random.Random(int.from_bytes(digest[:16], "big"))


class TaskFamily(ABC):
    """One task family: item generation, grading, canonical item keys and the hidden eval."""

    name: str
    description: str
    max_answer_chars: int
    grader: graders.Grader
    """The family's grader (a mapping for metarl/graders.py; see schemas/graders.py for the kinds)."""

    @abstractmethod
    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        """Draw one item at ``difficulty`` from either partition (no disjointness filtering)."""

    @abstractmethod
    def item_key(self, prompt: str) -> str:
        """Canonical content of a prompt, so formatting changes cannot hide an eval item."""

    def similarity(self, answer: str, completion: str) -> float:
        """Partial-credit similarity in [0, 1] between the answer and a normalised completion."""
        return graders.similarity(self.grader, answer, completion)

    def is_exact(self, example: Example, completion: str) -> bool:
        """True when the completion is exactly the reference answer."""
        return graders.is_exact(example.answer, completion, self.grader)

    def grade(self, example: Example, completion: str) -> float:
        """Score in [0, 1]: 1 for an exact answer, otherwise half the partial-credit similarity."""
        return graders.grade(self.grader, example.answer, completion)

    def is_well_formed(self, completion: str) -> bool:
        """True when the completion has the answer's shape (used by the format reward)."""
        return graders.is_well_formed(self.grader, completion)

    def is_hidden_eval_item(self, prompt: str, secret: bytes | None = None) -> bool:
        """True when the prompt's canonical item lies in the hidden-eval partition (under ``secret``, the active one by default)."""
        return in_eval_partition(self.name, self.item_key(prompt), secret)

    def generate(self, rng: random.Random, difficulty: float, secret: bytes | None = None) -> Example:
        """Draw one training item at ``difficulty``; never an item of the hidden-eval partition."""
        difficulty = min(max(difficulty, 0.0), 1.0)
        key = secret if secret is not None else active_eval_secret()
        for _ in range(MAX_GENERATION_ATTEMPTS):
            example = self.sample_item(rng, difficulty)
            if not self.is_hidden_eval_item(example.prompt, key):
                return example
        raise RuntimeError(f"family {self.name!r}: no training item found at difficulty {difficulty}")

    def hidden_eval(self, n: int, version: int = 1, secret: bytes | None = None) -> list[Example]:
        """``n`` distinct hidden-eval items, deterministic in (secret, family, version), difficulty uniform in [0, 1]."""
        secret = secret if secret is not None else active_eval_secret()
        rng = hidden_eval_rng(self.name, version, secret)
        items: list[Example] = []
        seen_keys: set[str] = set()
        for _ in range(MAX_GENERATION_ATTEMPTS * max(n, 1)):
            if len(items) == n:
                return items
            example = self.sample_item(rng, rng.random())
            key = self.item_key(example.prompt)
            if key in seen_keys or not in_eval_partition(self.name, key, secret):
                continue
            seen_keys.add(key)
            items.append(example)
        raise RuntimeError(f"family {self.name!r}: could not draw {n} distinct hidden-eval items")


def _squash(text: str) -> str:
    """Lower-case text without whitespace: the fallback canonical key."""
    return re.sub(r"\s+", "", text.lower())


def _key_from_pattern(pattern: re.Pattern[str], prompt: str, family_name: str) -> str:
    """Canonical key: the prompt's payload when it matches the family's format, else the squashed prompt."""
    match = pattern.search(_squash(prompt))
    if match is None:
        return _squash(prompt)
    return f"{family_name}:{match.group(1)}"


def _length_for(difficulty: float, shortest: int, longest: int) -> int:
    """A length from ``shortest`` (difficulty 0) to ``longest`` (difficulty 1), rounded."""
    return shortest + round(difficulty * (longest - shortest))


class AdditionFamily(TaskFamily):
    """Add two non-negative integers."""

    name = "addition"
    description = (
        "Add two non-negative integers. Prompt format: 'add A+B=' (for example 'add 27+5='); "
        "the answer is the decimal sum with no spaces or leading zeros (for example '32'). "
        "Difficulty 0 uses numbers below 10, difficulty 1 numbers below 100."
    )
    max_answer_chars = MAX_ANSWER_CHARS[name]
    grader = BUILTIN_GRADERS[name]
    _pattern = re.compile(r"(\d+\+\d+)")

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        bound = 10 + round(difficulty * 90)
        left, right = rng.randrange(bound), rng.randrange(bound)
        return Example(prompt=f"add {left}+{right}=", answer=str(left + right))

    def item_key(self, prompt: str) -> str:
        match = self._pattern.search(_squash(prompt))
        if match is None:
            return _squash(prompt)
        left, right = (int(part) for part in match.group(1).split("+"))
        return f"{self.name}:{min(left, right)}+{max(left, right)}"


class ReversalFamily(TaskFamily):
    """Reverse a string of letters."""

    name = "reversal"
    description = (
        "Reverse a string of lower-case letters. Prompt format: 'rev WORD>' (for example "
        "'rev abcd>'); the answer is the letters in reverse order (for example 'dcba'). "
        "Difficulty 0 uses 2 letters, difficulty 1 uses 6."
    )
    max_answer_chars = MAX_ANSWER_CHARS[name]
    grader = BUILTIN_GRADERS[name]
    _pattern = re.compile(r"rev([a-z]+)>")

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        length = _length_for(difficulty, 2, 6)
        word = "".join(rng.choice(LETTERS) for _ in range(length))
        return Example(prompt=f"rev {word}>", answer=word[::-1])

    def item_key(self, prompt: str) -> str:
        return _key_from_pattern(self._pattern, prompt, self.name)


class CaesarFamily(TaskFamily):
    """Shift every letter forward in the alphabet (Caesar cipher)."""

    name = "caesar"
    description = (
        "Caesar cipher: shift every letter forward by N places in the alphabet, wrapping z to a. "
        "Prompt format: 'rotN WORD>' (for example 'rot2 abz>'); the answer is the shifted word "
        "(for example 'cdb'). Difficulty raises the word length (2 to 4) and the shift range (1 to 3)."
    )
    max_answer_chars = MAX_ANSWER_CHARS[name]
    grader = BUILTIN_GRADERS[name]
    _pattern = re.compile(r"(rot\d[a-z]+)>")

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        length = _length_for(difficulty, 2, 4)
        shift = rng.randint(1, _length_for(difficulty, 1, 3))
        word = "".join(rng.choice(LETTERS) for _ in range(length))
        shifted = "".join(LETTERS[(LETTERS.index(char) + shift) % 26] for char in word)
        return Example(prompt=f"rot{shift} {word}>", answer=shifted)

    def item_key(self, prompt: str) -> str:
        return _key_from_pattern(self._pattern, prompt, self.name)


class MaxOfListFamily(TaskFamily):
    """Name the largest two-digit number of a list."""

    name = "max_of_list"
    description = (
        "Find the largest number in a comma-separated list of two-digit numbers. Prompt format: "
        "'max A,B,C=' (for example 'max 37,81,52='); the answer is the largest number (for example "
        "'81'). Difficulty 0 uses 2 numbers, difficulty 1 uses 6."
    )
    max_answer_chars = MAX_ANSWER_CHARS[name]
    grader = BUILTIN_GRADERS[name]
    _pattern = re.compile(r"max([\d,]+)=")

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        length = _length_for(difficulty, 2, 6)
        values = [rng.randrange(10, 100) for _ in range(length)]
        return Example(prompt=f"max {','.join(map(str, values))}=", answer=str(max(values)))

    def item_key(self, prompt: str) -> str:
        return _key_from_pattern(self._pattern, prompt, self.name)


class SortingFamily(TaskFamily):
    """Sort a string of digits in ascending order."""

    name = "sorting"
    description = (
        "Sort digits in ascending order. Prompt format: 'sort DIGITS>' (for example 'sort 3141>'); "
        "the answer is the same digits sorted (for example '1134'). Difficulty 0 uses 2 digits, "
        "difficulty 1 uses 6."
    )
    max_answer_chars = MAX_ANSWER_CHARS[name]
    grader = BUILTIN_GRADERS[name]
    _pattern = re.compile(r"sort(\d+)>")

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        length = _length_for(difficulty, 2, 6)
        digits = "".join(rng.choice(DIGITS) for _ in range(length))
        return Example(prompt=f"sort {digits}>", answer="".join(sorted(digits)))

    def item_key(self, prompt: str) -> str:
        return _key_from_pattern(self._pattern, prompt, self.name)


class DateFormatFamily(TaskFamily):
    """Convert an ISO date (year-month-day) to 'day month-name year'."""

    name = "date_format"
    description = (
        "Convert a date from ISO form to day, three-letter month name, year. Prompt format: "
        "'date YYYY-MM-DD>' (for example 'date 1987-04-23>'); the answer is 'DD mon YYYY' (for "
        "example '23 apr 1987'; months jan feb mar apr may jun jul aug sep oct nov dec). "
        "Difficulty widens the range of years (1990-2000 at 0, 1000-2999 at 1)."
    )
    max_answer_chars = MAX_ANSWER_CHARS[name]
    grader = BUILTIN_GRADERS[name]
    _pattern = re.compile(r"date(\d{4}-\d{2}-\d{2})>")

    def sample_item(self, rng: random.Random, difficulty: float) -> Example:
        span = round(10 + difficulty * 1990)
        year = rng.randint(max(1000, 1995 - span // 2), min(2999, 1995 + span // 2))
        month = rng.randint(1, 12)
        day = rng.randint(1, 28)
        return Example(
            prompt=f"date {year:04d}-{month:02d}-{day:02d}>",
            answer=f"{day:02d} {MONTH_NAMES[month - 1]} {year:04d}",
        )

    def item_key(self, prompt: str) -> str:
        return _key_from_pattern(self._pattern, prompt, self.name)


def generate_dataset(family: TaskFamily, n: int, seed: int, difficulty: float | tuple[float, float]) -> list[Example]:
    """``n`` training items from ``seed``; ``difficulty`` is fixed or drawn uniformly from a (low, high) range."""
    rng = random.Random(f"train\x1f{family.name}\x1f{seed}")
    low, high = difficulty if isinstance(difficulty, tuple) else (difficulty, difficulty)
    return [family.generate(rng, rng.uniform(low, high)) for _ in range(n)]
