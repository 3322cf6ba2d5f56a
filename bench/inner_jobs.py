"""Inner-job benchmark: for each family and base model, the hidden-eval score of the base, after a
sensible GRPO config, after a deliberately bad one, and the wall seconds of each job.

    python -m bench.inner_jobs                       # all six families, both models
    python -m bench.inner_jobs --families addition reversal --models Qwen/Qwen3-0.6B
    python -m bench.inner_jobs --quick               # smaller base models and shorter jobs (a smoke run)

Targets (2 cores): sensible >= base + 0.20 on at least 4 of 6 families; one small-model job <= 60 s;
the bad config clearly worse; the larger model ends higher on most families.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from metarl.learning.families import FAMILIES, get_family
from metarl.learning.grpo import LocalTrainConfig, RewardWeights, train
from metarl.learning.models import ensure_base_model
from metarl.learning.runtime import configure_torch_threads
from metarl.learning.scoring import score_checkpoint

MODELS = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B")


def sensible_config(model: str, seed: int, time_budget_s: float) -> LocalTrainConfig:
    """Settings a careful practitioner would pick: moderate lr (lower for the larger model), groups of 8."""
    large = model == MODELS[1]
    return LocalTrainConfig(
        base_model=model,
        learning_rate=3e-4 if large else 1e-3,
        max_steps=400,
        batch_size=16,
        group_size=8,
        temperature=1.0,
        max_tokens=12,
        rewards=RewardWeights(correctness=1.0, exact=0.5),
        seed=seed,
        time_budget_s=time_budget_s,
    )


def bad_config(model: str, seed: int, time_budget_s: float) -> LocalTrainConfig:
    """A deliberately poor job: a learning rate that is far too high, and no group signal (G=1)."""
    return LocalTrainConfig(
        base_model=model,
        learning_rate=0.1,
        max_steps=400,
        batch_size=16,
        group_size=1,
        temperature=1.0,
        max_tokens=12,
        rewards=RewardWeights(correctness=1.0),
        seed=seed,
        time_budget_s=time_budget_s,
    )


def dataset_for(family_name: str, size: int, seed: int):  # type: ignore[no-untyped-def]
    family = get_family(family_name)
    rng = random.Random(seed)
    return [family.generate(rng, rng.random()) for _ in range(size)]


def run_job(config: LocalTrainConfig, family_name: str, base_dir: Path, work: Path, eval_items) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    outcome = train(config, dataset_for(family_name, 2000, config.seed), get_family(family_name), base_dir, work)
    seconds = time.perf_counter() - started
    return score_checkpoint(outcome.checkpoint_dir, family_name, eval_items).mean, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES), choices=sorted(FAMILIES))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--quick", action="store_true", help="base models at scale 0.25 and 15 s jobs (not the targets' setting)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="base-model cache (default METARL_CACHE_DIR or ~/.cache/metarl/models)")
    args = parser.parse_args(argv)
    configure_torch_threads()
    scale = 0.25 if args.quick else 1.0
    budgets = {MODELS[0]: 15.0 if args.quick else 45.0, MODELS[1]: 30.0 if args.quick else 90.0}
    print(f"{'family':<12} {'model':<16} {'base':>6} {'sensible':>9} {'bad':>6} {'gain':>6} {'s(sens)':>8} {'s(bad)':>7}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="metarl-bench-") as tmp:
        for model in args.models:
            built = time.perf_counter()
            base_dir = ensure_base_model(model, args.cache_dir, scale=scale)
            print(f"# base model {model}: ready in {time.perf_counter() - built:.1f} s ({base_dir.name})", flush=True)
            for family_name in args.families:
                eval_items = get_family(family_name).hidden_eval(200, 1)
                base = score_checkpoint(base_dir, family_name, eval_items).mean
                work = Path(tmp) / f"{family_name}-{model.replace('/', '_')}"
                sensible, sensible_s = run_job(sensible_config(model, args.seed, budgets[model]), family_name, base_dir, work / "sensible", eval_items)
                bad, bad_s = run_job(bad_config(model, args.seed, budgets[model]), family_name, base_dir, work / "bad", eval_items)
                results[(family_name, model)] = (base, sensible, bad)
                print(f"{family_name:<12} {model:<16} {base:6.3f} {sensible:9.3f} {bad:6.3f} {sensible - base:+6.3f} {sensible_s:8.1f} {bad_s:7.1f}", flush=True)
    small = [results[(f, MODELS[0])] for f in args.families if (f, MODELS[0]) in results]
    print(f"# families with sensible >= base + 0.20 (small model): {sum(s - b >= 0.20 for b, s, _ in small)}/{len(small)}")
    print(f"# families where bad < sensible (small model): {sum(bad < s for _, s, bad in small)}/{len(small)}")
    if len(args.models) == 2:
        larger = sum(results[(f, MODELS[1])][1] > results[(f, MODELS[0])][1] for f in args.families)
        print(f"# families where the larger model ends higher: {larger}/{len(args.families)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
