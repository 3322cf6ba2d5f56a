"""Write the data files of the example data-defined family in examples/families/increment.

    python scripts/make_example_family.py [--out examples/families/increment/data] [--seed 0]

Every number 0..1999 is one item, prompt ``inc N>`` and answer ``N+1``; a seeded shuffle puts 200
of them in the hidden eval and the rest in the training pool (the spec's example item stays in the
pool). The same seed writes the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NUMBERS = 2000
HIDDEN_ITEMS = 200
EXAMPLE_NUMBER = 41
"""The spec's public example (``inc 41>`` -> ``42``): never held back."""


def item(number: int) -> dict[str, str]:
    """One item of the family."""
    return {"prompt": f"inc {number}>", "answer": str(number + 1)}


def split(seed: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(training pool, hidden eval): a seeded shuffle of every item, the example kept in training."""
    numbers = [number for number in range(NUMBERS) if number != EXAMPLE_NUMBER]
    random.Random(seed).shuffle(numbers)
    hidden = numbers[:HIDDEN_ITEMS]
    train = sorted(numbers[HIDDEN_ITEMS:] + [EXAMPLE_NUMBER])
    return [item(number) for number in train], [item(number) for number in hidden]


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "examples" / "families" / "increment" / "data"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    train, hidden = split(args.seed)
    write_jsonl(Path(args.out) / "train.jsonl", train)
    write_jsonl(Path(args.out) / "hidden.jsonl", hidden)
    print(f"{len(train)} training items, {len(hidden)} hidden-eval items in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
