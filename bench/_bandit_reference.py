"""A reference outer learner for the simulator (bench/outer_landscape.py): linear Thompson sampling on the measured
landscape's own features.

Not the product's learner. It knows the form of the simulated job credit (a family offset plus one weight per job
feature of bench/_measured_landscape.py `job_features`), which the real loop's learner does not, and it picks among
a fixed pool of jobs that pass the probe. It answers one question: how far can 80 episodes get at the measured job
noise when the learner knows that form? Its numbers are an upper reference for the policy-gradient learner's.

Each episode draws weights from the Gaussian posterior of a Bayesian linear regression (prior precision
`prior_precision` on every weight, the landscape's residual spread as the noise), its spread scaled by
`posterior_scale` (1 = plain Thompson sampling, 0 = greedy), and runs the pool's job with the highest drawn credit.
"""

from __future__ import annotations

import random
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from bench._measured_landscape import MeasuredLandscape, job_features
from metarl.policy import job_language as jl
from metarl.policy.job_limits import job_limits
from metarl.policy.local_policy import LocalPolicy
from metarl.probe.job import probe_job_text
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

PASSING_REWARD = 0.25
"""The validation (0.2) and efficiency (0.05) credits every passing job adds, as in bench/outer_landscape.py."""


@dataclass(frozen=True)
class CandidateJob:
    """A job of the pool and the landscape features it switches on."""

    job: JobSpec
    features: tuple[str, ...]


def candidate_pool(tasks: Mapping[str, TaskSpec], policy: LocalPolicy, per_family: int, floor: float = 0.99) -> dict[str, list[CandidateJob]]:
    """Per family, the distinct jobs among `per_family` samples of `policy` (with an exploration floor near 1, so nearly
    uniform over the choices the task allows) that the probe passes."""
    pool: dict[str, list[CandidateJob]] = {}
    for family, task in sorted(tasks.items()):
        context = jl.context_for_task(task)
        seen: dict[str, CandidateJob] = {}
        for sample in policy.sample_batch([context] * per_family, list(range(per_family)), 1.0, floor):
            text = sample.render(seed=0, limits=job_limits(task))
            if text not in seen and probe_job_text(text, task).passed:
                job = JobSpec.model_validate(tomllib.loads(text))
                seen[text] = CandidateJob(job, tuple(job_features(job)))
        if not seen:
            raise ValueError(f"no sampled job of family {family!r} passes the probe")
        pool[family] = list(seen.values())
    return pool


def feature_columns(pool: Mapping[str, Sequence[CandidateJob]]) -> dict[str, int]:
    """Column of each family offset (`family=NAME`) and each job feature in the regression."""
    names = [f"family={family}" for family in sorted(pool)]
    names += sorted({name for candidates in pool.values() for candidate in candidates for name in candidate.features})
    return {name: index for index, name in enumerate(names)}


def design_rows(family: str, candidates: Sequence[CandidateJob], columns: Mapping[str, int]) -> torch.Tensor:
    """One-hot rows [len(candidates), len(columns)] of a family's candidates."""
    rows = torch.zeros(len(candidates), len(columns), dtype=torch.float64)
    for row, candidate in enumerate(candidates):
        rows[row, columns[f"family={family}"]] = 1.0
        for name in candidate.features:
            rows[row, columns[name]] = 1.0
    return rows


def thompson_rewards(
    pool: Mapping[str, Sequence[CandidateJob]],
    landscape: MeasuredLandscape,
    *,
    episodes: int,
    seed: int,
    noise: float,
    prior_precision: float,
    posterior_scale: float,
) -> list[float]:
    """Rewards of `episodes` episodes of linear Thompson sampling, a uniformly drawn training family each."""
    if noise <= 0.0 or prior_precision <= 0.0 or posterior_scale < 0.0:
        raise ValueError("noise and prior_precision must be > 0 and posterior_scale >= 0")
    rng = random.Random(seed)
    draws = torch.Generator().manual_seed(seed)
    columns = feature_columns(pool)
    rows = {family: design_rows(family, candidates, columns) for family, candidates in pool.items()}
    precision = torch.eye(len(columns), dtype=torch.float64) * prior_precision
    weighted_sum = torch.zeros(len(columns), dtype=torch.float64)
    families = sorted(pool)
    rewards = []
    for _ in range(episodes):
        family = rng.choice(families)
        covariance = torch.linalg.inv(precision)
        mean = covariance @ weighted_sum
        drawn = mean + posterior_scale * torch.linalg.cholesky(covariance) @ torch.randn(len(columns), generator=draws, dtype=torch.float64)
        pick = int(torch.argmax(rows[family] @ drawn))
        credit = landscape.credit(family, pool[family][pick].job) + rng.gauss(0.0, noise)
        rewards.append(PASSING_REWARD + credit)
        features = rows[family][pick]
        precision += torch.outer(features, features) / noise**2
        weighted_sum += features * credit / noise**2
    return rewards
