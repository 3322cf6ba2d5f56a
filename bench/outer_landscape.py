"""How fast does the local outer learner find good jobs? A named simulator for choosing its settings.

The policy, its sampling, the probe and the importance-sampling update are the real ones
(`LocalPolicy`, `probe_job_text` on the shipped task specs, `local_outer_step` on real datums).
Only the inner job is simulated: its job credit is a hand-written landscape anchored on the
`bench.inner_jobs` numbers (BENCHMARKS.md), plus Gaussian noise:

- learning rate 1e-2 or more collapses the model (credit -0.8); 3e-3 harms it (-0.4); the
  default 1e-3 harms it a little (-0.25, what the default-leaning jobs of the real runs did);
- 3e-4 or less gains up to +0.5, in proportion to the steps that fit the 60 s budget
  (about 170 for the small model, 60 for the larger one, on a 2-core machine).

With `--landscape CSV...` the credit comes instead from a fit to measured jobs: `bench.versus_search` CSVs, their
passed jobs' scores against their families' floors, fitted by ridge least squares on the job's settings
(`bench/_measured_landscape.py`; it prints its cross-validated R^2), and the noise is the fit's residual spread
unless `--noise` is given.

A passing job adds the episode reward's validation (0.2) and efficiency (0.05) credits; a job the
probe rejects ends with reward 0 (no retries are simulated). Each outer step samples
`groups_per_batch` groups of `group_size` episodes on training families, synchronously (`window.batches_ahead = 0`)
unless the setting's `policy_lag` samples them with the policy of that many steps before (the real loop's async
window ran about 1.5 behind). It prints, per setting, the mean reward of the first outer step, of outer steps 6-10
(issue 43's target: 0.5 by step 10; with the share of seeds that reach it) and of the last episodes, over several seeds,
with the worst seed. Rows without "no lean" start from a policy with `prior_default_bias = 1.0` (a third of its settings
left to defaults); "no lean" is 0.0, an even pick of every setting. It does not show that the real loop reaches these numbers.

    python -m bench.outer_landscape [--episodes 176] [--seeds 8]     # about a minute
    python -m bench.outer_landscape --landscape bench/results/versus-search-2026-12-06/versus_search-full.csv [--reference]

`--reference` adds rows for a learner that is not the product's: linear Thompson sampling that knows the measured
landscape's form (bench/_bandit_reference.py), an upper reference for what 80 episodes can reach at this noise.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch

from bench._bandit_reference import PASSING_REWARD, candidate_pool, thompson_rewards
from bench._measured_landscape import MeasuredLandscape, cross_validated_r2, fit_landscape, measured_jobs
from metarl.domain.advantages import group_advantages
from metarl.learning.eval_secret import install_tool_eval_secret
from metarl.outer_update import build_datum, datum_from_record, datum_record, kept_batches, local_outer_step
from metarl.policy import job_language as jl
from metarl.policy.job_limits import job_limits
from metarl.policy.local_policy import LocalPolicy, PolicyConfig
from metarl.probe.job import probe_job_text
from metarl.versus_search import parse_versus_csv
from schemas.base import load_toml_model
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

TASK_DIR = Path(__file__).resolve().parent.parent / "tasks_specs"
BUDGET_STEPS = {jl.MODELS[0]: 170, jl.MODELS[1]: 60}


@dataclass(frozen=True)
class Setting:
    """One outer-learner setting to compare."""

    name: str
    learning_rate: float = 1e-2
    group_size: int = 4
    groups_per_batch: int = 2
    temperature: float = 1.3
    normalize_std: bool = False
    default_bias: float = PolicyConfig.default_bias
    updates_per_batch: int = 1
    floor: float = 0.0
    entropy_coef: float = 0.0
    replay_batches: int = 0
    policy_lag: int = 0
    """Outer steps between the version that samples a batch and the one it updates (the real loop's async window: about 1.5)."""


def synthetic_credit(choice: jl.JobChoice) -> float:
    """The landscape's job credit of a decoded job, before noise."""
    lr = choice.hyperparameters["training.learning_rate"] or 1e-3
    steps = choice.hyperparameters["training.max_steps"] or 40
    if lr >= 1e-2:
        return -0.8
    if lr >= 3e-3:
        return -0.4
    if lr >= 1e-3:
        return -0.25
    return 0.5 * min(1.0, min(steps, BUDGET_STEPS[choice.model]) / 200)


def run_setting(
    setting: Setting, tasks: dict[str, TaskSpec], episodes: int, seed: int, noise: float, landscape: MeasuredLandscape | None = None
) -> list[float]:
    """Rewards of every episode, in order, for one seed (credits from `landscape` when given, else the synthetic one)."""
    rng = random.Random(seed)
    policy = LocalPolicy(PolicyConfig(init_seed=seed, default_bias=setting.default_bias))
    earlier = [copy.deepcopy(policy)] if setting.policy_lag else []  # up to policy_lag + 1 versions, oldest first
    behaviour = policy
    families = sorted(tasks)
    rewards: list[float] = []
    while len(rewards) < episodes:
        groups = []
        for _ in range(setting.groups_per_batch):
            family = rng.choice(families)
            context = jl.context_for_task(tasks[family])
            samples = behaviour.sample_batch(
                [context] * setting.group_size, [rng.getrandbits(62) for _ in range(setting.group_size)], setting.temperature, setting.floor
            )
            group = []
            for sample in samples:
                text = sample.render(seed=0, limits=job_limits(tasks[family]))
                verdict = probe_job_text(text, tasks[family])
                reward = 0.0
                if verdict.passed:
                    if landscape is None:
                        credit = synthetic_credit(jl.decode_job(sample.job_tokens))
                    else:
                        credit = landscape.credit(family, JobSpec.model_validate(tomllib.loads(text)))
                    reward = PASSING_REWARD + credit + rng.gauss(0.0, noise)
                group.append((sample, reward))
            groups.append(group)
        rewards.extend(r for group in groups for _, r in group)
        advantages = group_advantages([[r for _, r in group] for group in groups], normalize_std=setting.normalize_std)
        datums = [
            build_datum(sample.prompt_tokens, sample.job_tokens, sample.logprobs, adv)
            for group, group_adv in zip(groups, advantages)
            for (sample, _), adv in zip(group, group_adv)
        ]
        replayed = [datum_from_record(record) for batch in policy.replay for record in batch]
        for _ in range(setting.updates_per_batch):
            local_outer_step(
                policy,
                None,
                datums + replayed,
                ratio_cap=2.0,
                lr=setting.learning_rate,
                temperature=setting.temperature,
                floor=setting.floor,
                entropy_coef=setting.entropy_coef,
            )
        policy.replay = kept_batches([datum_record(datum) for datum in datums], policy.replay, setting.replay_batches)
        if setting.policy_lag:
            earlier = [*earlier, copy.deepcopy(policy)][-setting.policy_lag - 1 :]
            behaviour = earlier[0]
    return rewards[:episodes]


SETTINGS = (
    Setting("lr 2e-2, no floor (before issue 43)", learning_rate=2e-2, temperature=1.0, default_bias=1.0),
    Setting("lr 3e-2, floor 0.05, default lean 1.0", learning_rate=3e-2, temperature=1.0, default_bias=1.0, floor=0.05),
    Setting("lr 3e-2, floor 0.05, no lean", learning_rate=3e-2, temperature=1.0, default_bias=0.0, floor=0.05),
    Setting("lr 4e-2, floor 0.05, no lean (local.toml)", learning_rate=4e-2, temperature=1.0, default_bias=0.0, floor=0.05),
    Setting("lr 5e-2, floor 0.05, no lean", learning_rate=5e-2, temperature=1.0, default_bias=0.0, floor=0.05),
    Setting("lr 5e-2, floor 0.05", learning_rate=5e-2, temperature=1.0, default_bias=1.0, floor=0.05),
    Setting("lr 3e-2, floor 0.05, entropy 0.01", learning_rate=3e-2, temperature=1.0, default_bias=1.0, floor=0.05, entropy_coef=0.01),
    Setting("lr 3e-2, floor 0.05, replay 1", learning_rate=3e-2, temperature=1.0, default_bias=1.0, floor=0.05, replay_batches=1),
    Setting("lr 3e-2, floor 0.05, T 0.7", learning_rate=3e-2, temperature=0.7, default_bias=1.0, floor=0.05),
    Setting("lr 3e-2, floor 0.05, T 0.5", learning_rate=3e-2, temperature=0.5, default_bias=1.0, floor=0.05),
    Setting("lr 3e-2, floor 0.05, T 0.7, replay 1", learning_rate=3e-2, temperature=0.7, default_bias=1.0, floor=0.05, replay_batches=1),
    Setting("lr 3e-2, floor 0.05, sampled 1 step behind", learning_rate=3e-2, temperature=1.0, default_bias=1.0, floor=0.05, policy_lag=1),
    Setting("lr 3e-2, floor 0.05, sampled 2 steps behind", learning_rate=3e-2, temperature=1.0, default_bias=1.0, floor=0.05, policy_lag=2),
)


REFERENCE_STEP = 8
"""Episodes the reference rows count as one outer step (the settings' group_size x groups_per_batch)."""


def reference_setting(text: str) -> tuple[float, float]:
    """A `--reference` value `PRECISION:SCALE` as (prior precision, posterior scale)."""
    precision, _, scale = text.partition(":")
    try:
        values = float(precision), float(scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not PRECISION:SCALE (for example 30:0.3)") from None
    if not (values[0] > 0.0 and values[1] >= 0.0):
        raise argparse.ArgumentTypeError(f"{text!r}: the prior precision must be > 0 and the posterior scale >= 0 (for example 30:0.3)")
    return values


def print_row(name: str, runs: list[list[float]], per_step: int, tail: int, seconds: float) -> None:
    """One table row: mean reward of step 1, of steps 6-10 (worst seed, share of seeds at 0.5) and of the last episodes."""
    first = statistics.fmean(statistics.fmean(r[:per_step]) for r in runs)
    by_ten = [statistics.fmean(r[5 * per_step : 10 * per_step]) for r in runs]
    tails = [statistics.fmean(r[-tail:]) for r in runs]
    print(
        f"{name:44} {first:7.3f} {statistics.fmean(by_ten):10.3f} {min(by_ten):6.3f} {sum(b >= 0.5 for b in by_ten) / len(by_ten):6.0%}"
        f" {statistics.fmean(tails):8.3f} {min(tails):6.3f} {seconds:5.0f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--episodes", type=int, default=176, help="trainable episodes per seed (default 176: about what an hour of real jobs leaves after held-out ones)"
    )
    parser.add_argument("--seeds", type=int, default=8, help="seeds per setting")
    parser.add_argument("--noise", type=float, default=None, help="std of the credit noise (default 0.3, or the measured fit's residual spread)")
    parser.add_argument("--landscape", nargs="+", type=Path, default=None, help="bench.versus_search CSVs whose passed jobs the credit is fitted to")
    parser.add_argument("--ridge", type=float, default=3.0, help="ridge penalty of the measured fit")
    parser.add_argument(
        "--reference",
        nargs="*",
        type=reference_setting,
        default=None,
        metavar="PRECISION:SCALE",
        help="with --landscape: add linear Thompson sampling rows (bench/_bandit_reference.py), one per prior precision and posterior"
        " scale (default 3:1 and 30:0.3)",
    )
    parser.add_argument("--tail", type=int, default=40, help="episodes averaged at the end")
    parser.add_argument("--artifacts", default=".metarl", help="artifacts root holding the hidden-eval secret the family features need (default .metarl)")
    args = parser.parse_args()
    if args.reference is not None and not args.landscape:
        parser.error("--reference needs --landscape: the reference learner knows the measured landscape's form")
    install_tool_eval_secret(args.artifacts)
    torch.set_num_threads(1)
    tasks = {}
    for path in sorted(TASK_DIR.glob("*.toml")):
        task = load_toml_model(TaskSpec, path)
        if not task.held_out:
            tasks[task.family] = task
    landscape = None
    if args.landscape:
        measured = measured_jobs(row for path in args.landscape for row in parse_versus_csv(path.read_text(), str(path)))
        landscape = fit_landscape(measured, args.ridge)
        print(
            f"# measured landscape: {landscape.jobs} passed jobs of {', '.join(sorted(landscape.intercepts))}; residual std"
            f" {landscape.residual_std:.3f}; 5-fold cross-validated R^2 {cross_validated_r2(measured, args.ridge):.3f}"
        )
    noise = args.noise if args.noise is not None else (landscape.residual_std if landscape is not None else 0.3)
    print(f"# {'measured' if landscape else 'synthetic'} landscape, {args.episodes} episodes per seed, {args.seeds} seeds, noise {noise:.3f}")
    print(f"{'setting':44} {'step 1':>7} {'steps 6-10':>10} {'worst':>6} {'>= 0.5':>6} {'last ' + str(args.tail):>8} {'worst':>6} {'s':>5}")
    for setting in SETTINGS:
        started = time.perf_counter()
        runs = [run_setting(setting, tasks, args.episodes, seed, noise, landscape) for seed in range(args.seeds)]
        print_row(setting.name, runs, setting.group_size * setting.groups_per_batch, args.tail, time.perf_counter() - started)
    if args.reference is None or landscape is None:
        return
    pool = candidate_pool(tasks, LocalPolicy(PolicyConfig(init_seed=0, default_bias=1.0)), per_family=600)
    for precision, scale in args.reference or [(3.0, 1.0), (30.0, 0.3)]:
        started = time.perf_counter()
        runs = [
            thompson_rewards(pool, landscape, episodes=args.episodes, seed=seed, noise=noise, prior_precision=precision, posterior_scale=scale)
            for seed in range(args.seeds)
        ]
        print_row(f"reference: Thompson sampling {precision:g}:{scale:g}", runs, REFERENCE_STEP, args.tail, time.perf_counter() - started)


if __name__ == "__main__":
    main()
