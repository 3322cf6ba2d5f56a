"""A job-credit landscape fitted to measured inner jobs, for the outer-learner simulator (bench/outer_landscape.py).

The measured jobs are the rows of `bench.versus_search` CSVs: each passed job's settings (the `job` cell, as
`bench/versus_search.py` `job_description` writes it) and its hidden-eval score on its family. A job's credit is
`metarl/domain/reward.py` `job_credit` of that score against the family's floor (the smaller base model's score,
the CSV's `base_score`; the real loop measures a larger-model job against the larger base instead). The fit is
ridge least squares on one-hot features of the settings that decide a job on the local trainer: the model, the
learning rate and the step count each crossed with the model, the other five hyperparameters, and whether the
reward table still rewards correctness; plus one intercept per family. Rejected and failed jobs are left out
(the simulator runs the real probe, and a failed job earns no job credit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from metarl.domain.reward import job_credit
from metarl.policy import job_language as jl
from metarl.versus_search import VersusRow
from schemas.job import JobSpec
from schemas.run_config import EpisodeRewardWeights

TRAINING_SLOT_KEYS = {f"{slot.section}.{slot.key}": slot for slot in jl.TRAINING_SLOTS}
CROSSED_WITH_MODEL = ("training.learning_rate", "training.max_steps")
"""Slots whose effect depends on the model (the larger one takes fewer steps in the same time, and less learning rate)."""


def parse_job_cell(cell: str) -> JobSpec:
    """The job of a versus CSV `job` cell (`section.key=value` pairs separated by spaces)."""
    data: dict[str, Any] = {}
    for pair in cell.split():
        path, _, text = pair.partition("=")
        *sections, key = path.split(".")
        table = data
        for section in sections:
            table = table.setdefault(section, {})
        table[key] = scalar(text)
    return JobSpec.model_validate(data)


def scalar(text: str) -> Any:
    """A cell value as the int, float or string it was written from."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def nearest_choice(value: float, choices: tuple[Any, ...]) -> Any:
    """The job language's choice closest to `value` on a log scale (a default filled in may fall between choices)."""
    numeric = [choice for choice in choices if isinstance(choice, int | float) and choice > 0]
    if value <= 0 or not numeric:
        return min(choices, key=lambda choice: abs(float(choice) - value))
    return min(numeric, key=lambda choice: abs(math.log(float(choice)) - math.log(value)))


def job_features(job: JobSpec) -> list[str]:
    """The one-hot features of a job that are on (names like `training.learning_rate=0.0001|<model>`)."""
    resolved = job.resolved().model_dump()
    model = job.model.name
    features = [f"model={model}"]
    for path, slot in TRAINING_SLOT_KEYS.items():
        value = nearest_choice(float(resolved[slot.key]), slot.values)
        features.append(f"{path}={value}|{model}" if path in CROSSED_WITH_MODEL else f"{path}={value}")
    weights = job.reward.components if job.reward.components else {"correctness": 1.0}
    features.append(f"rewards_correctness={weights.get('correctness', 0.0) > 0}")
    return features


@dataclass(frozen=True)
class MeasuredLandscape:
    """Job credit = family intercept + the weights of a job's features (unseen features weigh 0)."""

    intercepts: Mapping[str, float]
    weights: Mapping[str, float]
    residual_std: float
    jobs: int

    def credit(self, family: str, job: JobSpec) -> float:
        """The fitted credit of a job on a family (a family without measurements gets the mean intercept), in [-1, 1]."""
        intercept = self.intercepts.get(family, sum(self.intercepts.values()) / max(len(self.intercepts), 1))
        value = intercept + sum(self.weights.get(name, 0.0) for name in job_features(job))
        return max(-1.0, min(1.0, value))


def measured_jobs(rows: Iterable[VersusRow]) -> list[tuple[str, JobSpec, float]]:
    """(family, job, credit) of every passed job of the rows."""
    measured = []
    min_headroom = EpisodeRewardWeights().min_headroom
    for row in rows:
        if row.outcome == "passed" and row.score is not None and row.job:
            measured.append((row.family, parse_job_cell(row.job), job_credit(row.base_score, row.score, min_headroom)))
    return measured


def fit_landscape(measured: list[tuple[str, JobSpec, float]], ridge: float = 1.0) -> MeasuredLandscape:
    """Ridge least squares of credit on the family intercepts (not penalised) and the job features."""
    if not measured:
        raise ValueError("no passed job with its settings to fit a landscape to")
    families = sorted({family for family, _, _ in measured})
    features = [job_features(job) for _, job, _ in measured]
    names = sorted({name for job_names in features for name in job_names})
    columns = {name: index for index, name in enumerate(families + names)}
    design = torch.zeros(len(measured), len(columns), dtype=torch.float64)
    target = torch.tensor([credit for _, _, credit in measured], dtype=torch.float64)
    for row, ((family, _, _), job_names) in enumerate(zip(measured, features)):
        design[row, columns[family]] = 1.0
        for name in job_names:
            design[row, columns[name]] = 1.0
    penalty = torch.full((len(columns),), ridge, dtype=torch.float64)
    penalty[: len(families)] = 1e-9
    solution = torch.linalg.solve(design.T @ design + torch.diag(penalty), design.T @ target)
    residual = target - design @ solution
    values = solution.tolist()
    return MeasuredLandscape(
        intercepts={family: values[columns[family]] for family in families},
        weights={name: values[columns[name]] for name in names},
        residual_std=float(residual.std()) if len(measured) > 1 else 0.0,
        jobs=len(measured),
    )


def cross_validated_r2(measured: list[tuple[str, JobSpec, float]], ridge: float = 1.0, folds: int = 5) -> float:
    """1 - (mean squared error of held-out predictions) / (variance of the credits), over `folds` interleaved folds:
    how much of a new job's credit the fit predicts (0 = no better than the mean, negative = worse)."""
    if len(measured) < 2 * folds:
        raise ValueError(f"{len(measured)} measured jobs are too few for {folds}-fold cross-validation")
    errors: list[float] = []
    for fold in range(folds):
        train = [item for index, item in enumerate(measured) if index % folds != fold]
        fitted = fit_landscape(train, ridge)
        errors.extend((fitted.credit(family, job) - credit) ** 2 for index, (family, job, credit) in enumerate(measured) if index % folds == fold)
    credits = [credit for _, _, credit in measured]
    mean = sum(credits) / len(credits)
    variance = sum((credit - mean) ** 2 for credit in credits) / len(credits)
    return 1.0 - (sum(errors) / len(errors)) / max(variance, 1e-12)
