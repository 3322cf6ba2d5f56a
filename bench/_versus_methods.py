"""The methods `bench.versus_search` compares: the job space its searches draw from (one categorical per slot of the
job language, `metarl/policy/job_language.py`), and a proposer per method that writes the next job.toml and hears how it went."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from bench._versus_jobs import SMALL_MODEL
from metarl.backends.local.agent import sample_seed
from metarl.policy import job_language as jl
from metarl.policy.job_limits import job_limits
from metarl.probe.job import ProbeVerdict
from schemas.base import FieldProblem, dump_toml_model
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

TPE_STARTUP_TRIALS = 3
REJECTED_OBJECTIVE = 0.0
"""What Optuna is told for a job that added no score (rejected by the probe or failed): the lowest score there is."""


def job_seed(seed: int, family: str, job_index: int) -> int:
    """The seed of job `job_index` of a bench seed on a family (its data and training seed; the same for every method)."""
    digest = hashlib.sha256(f"versus-search\x1f{seed}\x1f{family}\x1f{job_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


# --- the job space of the searches: one categorical per slot of the job language ------------------

ABSENT = "absent"
"""The choice of a reward component that the job leaves out."""


@dataclass(frozen=True)
class Dimension:
    """One slot of the job language as a search dimension: its name and its choices (job-language tokens)."""

    name: str
    choices: tuple[str, ...]


def slot_name(slot: jl.Slot) -> str:
    return f"{slot.section}.{slot.key}"


def search_space() -> tuple[Dimension, ...]:
    """The job language's grids as categorical dimensions: model, the seven hyperparameters (their `default` token
    included), each reward component (absent or one weight; all absent is `reward=default`), dataset size and difficulty."""
    weights = (ABSENT, *(jl.weight_token(weight) for weight in jl.REWARD_WEIGHTS))
    return (
        Dimension("model.name", jl.MODEL_SLOT.tokens),
        *(Dimension(slot_name(slot), slot.tokens) for slot in jl.TRAINING_SLOTS),
        *(Dimension(f"reward.{name}", weights) for name in jl.REWARD_COMPONENTS),
        *(Dimension(slot_name(slot), slot.tokens) for slot in jl.DATASET_SLOTS),
    )


def point_tokens(point: Mapping[str, str]) -> list[int]:
    """The job sequence (after `<sep>`) of one choice per dimension of `search_space` (KeyError for a missing one)."""
    tokens = [point["model.name"], *(point[slot_name(slot)] for slot in jl.TRAINING_SLOTS)]
    components = [(name, point[f"reward.{name}"]) for name in jl.REWARD_COMPONENTS if point[f"reward.{name}"] != ABSENT]
    if components:
        tokens += [token for name, weight in components for token in (jl.component_token(name), weight)] + [jl.REWARD_END]
    else:
        tokens.append(jl.REWARD_DEFAULT)
    tokens += [point[slot_name(slot)] for slot in jl.DATASET_SLOTS] + [jl.END]
    return jl.token_ids(tokens)


def fitted_point(point: Mapping[str, str], rules: jl.ContextRules) -> dict[str, str]:
    """The point with each choice the grammar refuses under `rules` replaced by the allowed choice nearest to it in its slot's
    order (a refused model by the first allowed one), and `correctness` given weight 1.0 when no rewarding component has a positive weight."""
    fitted = dict(point)
    state = jl.GrammarState(rules=rules)
    for slot in (jl.MODEL_SLOT, *jl.TRAINING_SLOTS):
        name, tokens = slot_name(slot) if slot is not jl.MODEL_SLOT else "model.name", list(slot.tokens)
        allowed = [token for token in tokens if jl.TOKEN_ID[token] in state.allowed()]
        if fitted[name] not in allowed:
            wanted = tokens.index(fitted[name])
            fitted[name] = min(allowed, key=lambda token: abs(tokens.index(token) - wanted))
        state = state.advance(jl.TOKEN_ID[fitted[name]])
    weights = [fitted[f"reward.{name}"] for name in jl.REWARD_COMPONENTS]
    rewarding = [fitted[f"reward.{name}"] for name in jl.REWARD_COMPONENTS if name not in jl.PENALTY_COMPONENTS]
    if any(weight != ABSENT for weight in weights) and not any(weight != ABSENT and float(weight.removeprefix("w=")) > 0 for weight in rewarding):
        fitted[f"reward.{jl.REWARD_COMPONENTS[0]}"] = jl.weight_token(1.0)
    return fitted


# --- methods ---------------------------------------------------------------------------------------


class Proposer(Protocol):
    """A method: writes the next job.toml, then hears how it went."""

    def propose(self, job_index: int) -> str: ...

    def observe(self, verdict: ProbeVerdict, score: float | None) -> None: ...


class AgentProposer:
    """A local policy writing jobs as the run's agent does: attempts of an episode, each conditioned on the previous one's probe feedback."""

    def __init__(self, policy: Any, task: TaskSpec, family: str, seed: int, temperature: float, max_attempts: int):
        self.policy, self.task, self.family, self.seed = policy, task, family, seed
        self.temperature, self.max_attempts = temperature, max_attempts
        self.attempt, self.episode_seed = 1, 0
        self.feedback: list[FieldProblem] = []

    def propose(self, job_index: int) -> str:
        if self.attempt == 1:
            self.episode_seed = job_seed(self.seed, self.family, job_index)
        context = jl.context_for_task(self.task, self.attempt, self.feedback)
        sample = self.policy.sample(context, seed=sample_seed(self.episode_seed, self.attempt), temperature=self.temperature)
        return str(sample.render(seed=self.episode_seed, limits=job_limits(self.task)))

    def observe(self, verdict: ProbeVerdict, score: float | None) -> None:
        if verdict.passed or self.attempt >= self.max_attempts:
            self.attempt, self.feedback = 1, []
        else:
            self.attempt, self.feedback = self.attempt + 1, list(verdict.errors)


def point_job_toml(point: Mapping[str, str], task: TaskSpec, seed: int) -> str:
    """The job.toml of a search point, kept to the task's limits as the agent's jobs are (`fitted_point`, the dataset moved into range)."""
    limits = job_limits(task)
    return jl.render_job_toml(point_tokens(fitted_point(point, jl.context_rules(jl.context_for_task(task)))), seed=seed, limits=limits)


class RandomProposer:
    """Uniform random search over the job language's grids (each point kept to the task's limits)."""

    def __init__(self, task: TaskSpec, family: str, seed: int):
        self.task, self.family, self.seed = task, family, seed
        self.rng = random.Random(f"random-search\x1f{seed}\x1f{family}")
        self.space = search_space()

    def propose(self, job_index: int) -> str:
        point = {dimension.name: self.rng.choice(dimension.choices) for dimension in self.space}
        return point_job_toml(point, self.task, job_seed(self.seed, self.family, job_index))

    def observe(self, verdict: ProbeVerdict, score: float | None) -> None:
        return None


class TpeProposer:
    """Optuna's TPE sampler over the job language's grids (ask/tell, categorical distributions, maximising the score; each point kept to the task's limits)."""

    def __init__(self, task: TaskSpec, family: str, seed: int):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.task, self.family, self.seed = task, family, seed
        self.space = search_space()
        sampler = optuna.samplers.TPESampler(seed=job_seed(seed, family, 0), n_startup_trials=TPE_STARTUP_TRIALS)
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.distributions: dict[str, optuna.distributions.BaseDistribution] = {
            dimension.name: optuna.distributions.CategoricalDistribution(list(dimension.choices)) for dimension in self.space
        }
        self.trial: Any = None

    def propose(self, job_index: int) -> str:
        self.trial = self.study.ask(self.distributions)
        point = {name: str(self.trial.params[name]) for name in self.distributions}
        return point_job_toml(point, self.task, job_seed(self.seed, self.family, job_index))

    def observe(self, verdict: ProbeVerdict, score: float | None) -> None:
        self.study.tell(self.trial, score if score is not None else REJECTED_OBJECTIVE)


class SensibleProposer:
    """The small model's sensible preset (`metarl/learning/presets.py`) written as a job.toml: one job."""

    def __init__(self, task: TaskSpec, family: str, seed: int):
        self.task, self.family, self.seed = task, family, seed

    def propose(self, job_index: int) -> str:
        return sensible_job_toml(self.task, job_seed(self.seed, self.family, job_index))

    def observe(self, verdict: ProbeVerdict, score: float | None) -> None:
        return None


def sensible_job_toml(task: TaskSpec, seed: int) -> str:
    """The sensible preset of the small model as job.toml (its batch of prompts x group = the job's rollouts per step)."""
    from metarl.learning.data_families import family_for
    from metarl.learning.models import BASE_MODELS
    from metarl.learning.presets import sensible_config

    config = sensible_config(SMALL_MODEL, family_for(task), seed=seed)
    job = {
        "model": {"name": BASE_MODELS[SMALL_MODEL].stands_in_for},
        "training": {
            "learning_rate": config.learning_rate,
            "max_steps": config.max_steps,
            "batch_size": config.batch_size * config.group_size,
            "group_size": config.group_size,
            "kl_coef": config.kl_coef,
            "seed": seed,
        },
        "rollout": {"temperature": config.temperature, "max_tokens": config.max_tokens},
    }
    return dump_toml_model(JobSpec.model_validate(job))
