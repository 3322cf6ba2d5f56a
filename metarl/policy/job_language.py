"""A compact job language: a fixed vocabulary of tokens that encodes one complete `job.toml`.

A sequence is a conditioning context followed by a job:

    <bos> ans=<t> alen=<b> plen=<b> grader=<h> dlo=<d> dhi=<d> desc=<h>      (family features)
          time<=<s> rbud=2^<k> allow=<model>... dmin>=<n> dmax<=<n>         (the episode's limits)
          attempt=<n> fb=<field>... <sep>                                   (context, never sampled)
    model=<name> lr=<v> steps=<v> batch=<v> group=<v> kl=<v> temp=<v> maxtok=<v>
    ( reward=default | (rw=<component> w=<weight>)+ reward=end )
    data=<size> diff=<difficulty> <end>                                     (job, sampled)

The context describes the task by features any family has (``metarl.policy.family_features``),
not by its name, so a family the policy never saw is a valid context too, and the episode's limits
as TASK.md states them (``metarl.policy.job_limits``): training-time cap, rollout budget, allowed
models, dataset size range.

Every hyperparameter slot has a `default` token (the key is left out of job.toml) and a small
grid of explicit values. Reward components appear in a fixed canonical order, each at most once.

`allowed_next` is the grammar: it gives the tokens allowed after a job prefix under the context's
rules, so every sequence sampled under it is complete and keeps to what the probe checks without
running it: an allowed model, group_size dividing batch_size, the rollout budget, a positive reward
weight (see `GrammarState`). The dataset size and difficulty are moved into the task's range when
the job is rendered, and a rollout length too short for the task's longest answer (its examples,
or a ``max_chars`` its spec's grader writes) is raised to hold it (with fewer steps where the
rollout budget asks). No search method or policy spends a job on a value the probe must refuse for
these reasons; the probe still catches everything else (and every hand-written job).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import tomli_w
from pydantic import ValidationError

from metarl.graders import REWARD_COMPONENTS
from metarl.policy.family_features import FEATURE_TOKEN_COUNT, FEATURE_TOKENS, FamilyFeatures, feature_tokens
from metarl.policy.job_limits import LIMIT_TOKENS, MAX_LIMIT_TOKEN_COUNT, MODEL_NAMES, SIZE_BOUNDS, ContextRules, JobLimits, limit_tokens, rules_from_context
from schemas.base import FieldProblem, dump_toml_model, parse_toml_text
from schemas.job import DEFAULT_BATCH_SIZE, DEFAULT_GROUP_SIZE, DEFAULT_MAX_STEPS, DEFAULT_MAX_TOKENS, JobDataset, JobSpec

# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------

PAD, BOS, SEP, END = "<pad>", "<bos>", "<sep>", "<end>"
SPECIAL_TOKENS = (PAD, BOS, SEP, END)

MAX_ATTEMPT_TOKEN = 5  # attempt=5 stands for "5 or later"
FEEDBACK_KINDS = (
    "none",
    "model",
    "learning_rate",
    "max_steps",
    "batch_size",
    "group_size",
    "kl_coef",
    "temperature",
    "max_tokens",
    "reward",
    "dataset_size",
    "difficulty",
    "other",
)

MODELS = MODEL_NAMES
DEFAULT = "default"


@dataclass(frozen=True)
class Slot:
    """One hyperparameter slot: its token prefix, where it goes in job.toml, and its value grid."""

    prefix: str
    section: str
    key: str
    values: tuple[Any, ...]
    has_default: bool = True

    def token(self, value: Any) -> str:
        return f"{self.prefix}={DEFAULT if value is None else _fmt(value)}"

    @property
    def tokens(self) -> tuple[str, ...]:
        return ((self.token(None),) if self.has_default else ()) + tuple(self.token(v) for v in self.values)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return repr(value) if value != 0 else "0.0"
    return str(value)


MODEL_SLOT = Slot("model", "model", "name", MODELS, has_default=False)
TRAINING_SLOTS = (
    Slot("lr", "training", "learning_rate", (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)),
    Slot("steps", "training", "max_steps", (10, 20, 40, 80, 200, 1000)),
    Slot("batch", "training", "batch_size", (8, 12, 16, 32, 48, 64, 128, 256)),
    Slot("group", "training", "group_size", (2, 4, 8, 16)),
    Slot("kl", "training", "kl_coef", (0.0, 0.01, 0.05, 0.1)),
    Slot("temp", "rollout", "temperature", (0.5, 0.7, 1.0, 1.2)),
    Slot("maxtok", "rollout", "max_tokens", (8, 16, 32, 64)),
)
"""The seven tunable hyperparameters, in the order they are written (max_tokens up to the local trainer's 64; no group_size 1,
whose group-relative advantages are all zero, so the job trains nothing: metarl/learning/grpo.py)."""

REWARD_WEIGHTS = (-1.0, 0.0, 0.1, 0.5, 1.0, 2.0)
REWARD_DEFAULT, REWARD_END = "reward=default", "reward=end"
DATASET_SLOTS = (
    Slot("data", "dataset", "size", SIZE_BOUNDS),
    Slot("diff", "dataset", "difficulty", (0.0, 0.25, 0.5, 0.75, 1.0)),
)


def component_token(name: str) -> str:
    return f"rw={name}"


def weight_token(weight: float) -> str:
    return f"w={_fmt(float(weight))}"


CONTEXT_TOKENS = FEATURE_TOKENS + LIMIT_TOKENS + tuple(f"attempt={n}" for n in range(1, MAX_ATTEMPT_TOKEN + 1)) + tuple(f"fb={kind}" for kind in FEEDBACK_KINDS)
JOB_TOKENS = (
    MODEL_SLOT.tokens
    + tuple(token for slot in TRAINING_SLOTS for token in slot.tokens)
    + (REWARD_DEFAULT, REWARD_END)
    + tuple(component_token(name) for name in REWARD_COMPONENTS)
    + tuple(weight_token(w) for w in REWARD_WEIGHTS)
    + tuple(token for slot in DATASET_SLOTS for token in slot.tokens)
)
VOCAB: tuple[str, ...] = SPECIAL_TOKENS + CONTEXT_TOKENS + JOB_TOKENS
TOKEN_ID: dict[str, int] = {token: index for index, token in enumerate(VOCAB)}
VOCAB_SIZE = len(VOCAB)
assert len(TOKEN_ID) == VOCAB_SIZE, "duplicate token in the vocabulary"

PAD_ID, BOS_ID, SEP_ID, END_ID = (TOKEN_ID[t] for t in SPECIAL_TOKENS)
DEFAULT_TOKEN_IDS = frozenset(TOKEN_ID[slot.token(None)] for slot in TRAINING_SLOTS + DATASET_SLOTS) | {TOKEN_ID[REWARD_DEFAULT]}
"""Tokens that leave a setting to the backend default (the untrained policy leans toward them)."""

MAX_JOB_LENGTH = 1 + len(TRAINING_SLOTS) + (2 * len(REWARD_COMPONENTS) + 1) + len(DATASET_SLOTS) + 1
MAX_CONTEXT_LENGTH = 1 + FEATURE_TOKEN_COUNT + MAX_LIMIT_TOKEN_COUNT + 1 + len(FEEDBACK_KINDS) + 1


def token_ids(tokens: Iterable[str]) -> list[int]:
    """Ids of token strings (raises ValueError on an unknown token)."""
    out = []
    for token in tokens:
        if token not in TOKEN_ID:
            raise ValueError(f"unknown token {token!r}")
        out.append(TOKEN_ID[token])
    return out


def token_strings(ids: Iterable[int]) -> list[str]:
    """Token strings of ids (raises ValueError on an id outside the vocabulary)."""
    out = []
    for index in ids:
        if not 0 <= int(index) < VOCAB_SIZE:
            raise ValueError(f"token id {index} is outside the vocabulary of {VOCAB_SIZE}")
        out.append(VOCAB[int(index)])
    return out


def parse_tokens(text: str) -> list[int]:
    """Ids of a whitespace-separated token string, e.g. `"model=Qwen/Qwen3-1.7B lr=default ..."`."""
    return token_ids(text.split())


def format_tokens(ids: Iterable[int]) -> str:
    return " ".join(token_strings(ids))


# ---------------------------------------------------------------------------------------------
# Grammar
# ---------------------------------------------------------------------------------------------

_SLOT_SEQUENCE: tuple[Slot, ...] = (MODEL_SLOT,) + TRAINING_SLOTS
_SLOT_IDS = [tuple(TOKEN_ID[t] for t in slot.tokens) for slot in _SLOT_SEQUENCE]
_DATASET_IDS = [tuple(TOKEN_ID[t] for t in slot.tokens) for slot in DATASET_SLOTS]
_COMPONENT_IDS = tuple(TOKEN_ID[component_token(n)] for n in REWARD_COMPONENTS)
_WEIGHT_IDS = tuple(TOKEN_ID[weight_token(w)] for w in REWARD_WEIGHTS)
_POSITIVE_WEIGHT_IDS = tuple(TOKEN_ID[weight_token(w)] for w in REWARD_WEIGHTS if w > 0)
PENALTY_COMPONENTS = frozenset({"length_penalty"})
"""Components that only penalise: a positive weight on them does not count as rewarding anything (metarl/learning/grpo.py)."""
_REWARDING = tuple(name not in PENALTY_COMPONENTS for name in REWARD_COMPONENTS)
_LAST_REWARDING = max(index for index, rewarding in enumerate(_REWARDING) if rewarding)
_REWARD_DEFAULT_ID, _REWARD_END_ID = TOKEN_ID[REWARD_DEFAULT], TOKEN_ID[REWARD_END]
_STEPS, _BATCH, _GROUP, _MAXTOK = (_SLOT_SEQUENCE.index(slot) for slot in (TRAINING_SLOTS[1], TRAINING_SLOTS[2], TRAINING_SLOTS[3], TRAINING_SLOTS[6]))
_DEFAULTS = {_STEPS: DEFAULT_MAX_STEPS, _BATCH: DEFAULT_BATCH_SIZE, _GROUP: DEFAULT_GROUP_SIZE, _MAXTOK: DEFAULT_MAX_TOKENS}
"""The resolved value of a `default` token in the slots the grammar's cross-slot rules read (schemas/job.py)."""


def _slot_choices(phase: int) -> list[tuple[int, int]]:
    """(token id, resolved value) of each choice of a numeric slot that a cross-slot rule reads."""
    slot = _SLOT_SEQUENCE[phase]
    return [(TOKEN_ID[slot.token(None)], _DEFAULTS[phase])] + [(TOKEN_ID[slot.token(value)], int(value)) for value in slot.values]


_SLOT_CHOICES = {phase: _slot_choices(phase) for phase in _DEFAULTS}
_SMALLEST = {phase: min(value for _, value in choices) for phase, choices in _SLOT_CHOICES.items()}


def _within(choices: list[tuple[int, int]], fits: Callable[[int], bool]) -> tuple[int, ...]:
    """The tokens whose value `fits`; the smallest value alone when none does (the grammar never leaves nothing to say)."""
    allowed = tuple(token for token, value in choices if fits(value))
    if allowed:
        return allowed
    smallest = min(choices, key=lambda choice: choice[1])
    return (smallest[0],)


@dataclass(frozen=True)
class GrammarState:
    """Where a job prefix stands: a phase, the values its cross-slot rules read, and the rules of its context.

    phase: 0..7 = the slot of `_SLOT_SEQUENCE` to fill next; 8 = reward section start;
    9 = after a component (a weight must follow); 10 = after a weight; 11, 12 = dataset slots;
    13 = `<end>` expected; 14 = complete.

    Beyond syntax, the grammar keeps a job to what the probe checks without running it (metarl/probe/job.py):
    only the context's allowed models; group_size dividing batch_size; max_steps x batch_size x max_tokens
    within the context's rollout bound (steps and batch keep room for the smallest choices after them);
    and a positive weight on at least one component that rewards (not only PENALTY_COMPONENTS; the local
    trainer's rule, stricter than the schema's). The dataset's size and difficulty are moved into the task's
    range when the job is rendered (`render_job_toml`).
    """

    phase: int = 0
    last_component: int = -1
    steps: int = DEFAULT_MAX_STEPS
    batch: int = DEFAULT_BATCH_SIZE
    positive: bool = False
    rules: ContextRules = field(default_factory=ContextRules)

    @property
    def complete(self) -> bool:
        return self.phase == 14

    def allowed(self) -> tuple[int, ...]:
        """Token ids allowed next (empty once the job is complete)."""
        return _allowed(self)

    def advance(self, token: int) -> GrammarState:
        """The state after `token` (raises ValueError when the grammar does not allow it)."""
        if token not in self.allowed():
            where = "after the end of the job" if self.complete else f"in phase {self.phase}"
            raise ValueError(f"token {VOCAB[token] if 0 <= token < VOCAB_SIZE else token!r} is not allowed {where}")
        if self.phase < 8:
            update: dict[str, Any] = {"phase": self.phase + 1}
            if self.phase in (_STEPS, _BATCH):
                value = dict(_SLOT_CHOICES[self.phase])[token]
                update["steps" if self.phase == _STEPS else "batch"] = value
            return replace(self, **update)
        if self.phase == 8:
            if token == _REWARD_DEFAULT_ID:
                return replace(self, phase=11)
            return replace(self, phase=9, last_component=_COMPONENT_IDS.index(token))
        if self.phase == 9:
            rewarding = _REWARDING[self.last_component] and REWARD_WEIGHTS[_WEIGHT_IDS.index(token)] > 0
            return replace(self, phase=10, positive=self.positive or rewarding)
        if self.phase == 10:
            if token == _REWARD_END_ID:
                return replace(self, phase=11)
            return replace(self, phase=9, last_component=_COMPONENT_IDS.index(token))
        return replace(self, phase=self.phase + 1)


@lru_cache(maxsize=8192)
def _allowed(state: GrammarState) -> tuple[int, ...]:
    phase, bound = state.phase, state.rules.rollout_bound
    if phase == 0:
        allowed_models = tuple(TOKEN_ID[MODEL_SLOT.token(name)] for name in MODELS if name in state.rules.models)
        return allowed_models or _SLOT_IDS[0]
    if phase == _STEPS and bound is not None:
        return _within(_SLOT_CHOICES[_STEPS], lambda steps: steps * _SMALLEST[_BATCH] * _SMALLEST[_MAXTOK] <= bound)
    if phase == _BATCH and bound is not None:
        return _within(_SLOT_CHOICES[_BATCH], lambda batch: state.steps * batch * _SMALLEST[_MAXTOK] <= bound)
    if phase == _GROUP:
        return _within(_SLOT_CHOICES[_GROUP], lambda group: state.batch % group == 0)
    if phase == _MAXTOK and bound is not None:
        return _within(_SLOT_CHOICES[_MAXTOK], lambda tokens: state.steps * state.batch * tokens <= bound)
    if phase < len(_SLOT_SEQUENCE):
        return _SLOT_IDS[phase]
    if phase == 8:
        return (_REWARD_DEFAULT_ID,) + _COMPONENT_IDS[: _LAST_REWARDING + 1]
    if phase == 9:
        must_reward = not state.positive and state.last_component == _LAST_REWARDING
        return _POSITIVE_WEIGHT_IDS if must_reward else _WEIGHT_IDS
    if phase == 10:
        if state.positive:
            return _COMPONENT_IDS[state.last_component + 1 :] + (_REWARD_END_ID,)
        return _COMPONENT_IDS[state.last_component + 1 : _LAST_REWARDING + 1]
    if phase in (11, 12):
        return _DATASET_IDS[phase - 11]
    if phase == 13:
        return (END_ID,)
    return ()


def context_rules(context: Sequence[int]) -> ContextRules:
    """The grammar's rules from a context's limit tokens (the tokens before and including `<sep>`)."""
    return rules_from_context([VOCAB[int(token)] for token in context if 0 <= int(token) < VOCAB_SIZE])


def grammar_state(job_tokens: Sequence[int], rules: ContextRules | None = None) -> GrammarState:
    """The state after a job prefix, under a context's rules (none: only the rules every job keeps)."""
    state = GrammarState(rules=rules or ContextRules())
    for token in job_tokens:
        state = state.advance(int(token))
    return state


def allowed_next(job_tokens: Sequence[int], rules: ContextRules | None = None) -> tuple[int, ...]:
    """Token ids the grammar allows after a job prefix (the tokens after `<sep>`); empty when complete."""
    return grammar_state(job_tokens, rules).allowed()


def is_complete(job_tokens: Sequence[int], rules: ContextRules | None = None) -> bool:
    try:
        return grammar_state(job_tokens, rules).complete
    except ValueError:
        return False


def split_sequence(tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """(context, job) of a full sequence: the context runs up to and including `<sep>`."""
    tokens = [int(t) for t in tokens]
    if SEP_ID not in tokens:
        raise ValueError("the sequence has no <sep> token")
    cut = tokens.index(SEP_ID) + 1
    return tokens[:cut], tokens[cut:]


# ---------------------------------------------------------------------------------------------
# Context: family features, attempt number, probe feedback
# ---------------------------------------------------------------------------------------------

_FIELD_PREFIX = re.compile(r"^\([^)]*\)\s+")
_FEEDBACK_BY_FIELD = {
    ("training", "learning_rate"): "learning_rate",
    ("training", "max_steps"): "max_steps",
    ("training", "batch_size"): "batch_size",
    ("training", "group_size"): "group_size",
    ("training", "kl_coef"): "kl_coef",
    ("rollout", "temperature"): "temperature",
    ("rollout", "max_tokens"): "max_tokens",
    ("dataset", "size"): "dataset_size",
    ("dataset", "difficulty"): "difficulty",
}


_FEEDBACK_BY_KEY = {key: kind for (_, key), kind in _FEEDBACK_BY_FIELD.items() if not kind.startswith(("dataset", "difficulty"))}
_FEEDBACK_BY_KEY.update({"base_model": "model", "rewards": "reward"})  # flat names of a backend's own config


def feedback_kind(field_path: str) -> str:
    """The feedback token kind of a FieldProblem.field.

    `training.batch_size` -> batch_size, `reward.components.x` -> reward, and a backend's own flat
    names behind a `(...)` prefix too: `(local trainer) max_tokens` -> max_tokens. Anything else
    (syntax, file, environment, contamination, ...) -> other.
    """
    path = _FIELD_PREFIX.sub("", field_path.strip())
    parts = [part.strip('"') for part in path.split(".")]
    if parts[0] == "model":
        return "model"
    if parts[0] in ("reward", "rewards"):
        return "reward"
    if len(parts) >= 2 and (parts[0], parts[1]) in _FEEDBACK_BY_FIELD:
        return _FEEDBACK_BY_FIELD[(parts[0], parts[1])]
    if len(parts) == 1 and parts[0] in _FEEDBACK_BY_KEY:
        return _FEEDBACK_BY_KEY[parts[0]]
    return "other"


def feedback_tokens(feedback: Sequence[FieldProblem]) -> list[int]:
    """One token per distinct feedback kind, in vocabulary order; `fb=none` when there is no feedback."""
    kinds = {feedback_kind(problem.field) for problem in feedback}
    if not kinds:
        kinds = {"none"}
    return [TOKEN_ID[f"fb={kind}"] for kind in FEEDBACK_KINDS if kind in kinds]


def context_tokens(features: FamilyFeatures, attempt: int = 1, feedback: Sequence[FieldProblem] = (), limits: JobLimits | None = None) -> list[int]:
    """The conditioning prompt: `<bos> <feature tokens> <limit tokens> attempt=N fb=... <sep>` (no limit tokens when `limits` is None)."""
    if attempt < 1:
        raise ValueError(f"attempt is {attempt}; attempts count from 1")
    attempt_token = f"attempt={min(attempt, MAX_ATTEMPT_TOKEN)}"
    limit_part = token_ids(limit_tokens(limits)) if limits is not None else []
    return [BOS_ID] + token_ids(feature_tokens(features)) + limit_part + [TOKEN_ID[attempt_token]] + feedback_tokens(feedback) + [SEP_ID]


def context_for_task(task: Any, attempt: int = 1, feedback: Sequence[FieldProblem] = (), train_seconds: float | None = None) -> list[int]:
    """The context of a `TaskSpec`: its features (`metarl.policy.task_features.task_features`) and its limits at `train_seconds`
    (default: the task's CPU cap)."""
    from metarl.policy.job_limits import job_limits
    from metarl.policy.task_features import task_features

    return context_tokens(task_features(task), attempt, feedback, job_limits(task, train_seconds))


def context_for_episode(ctx: Any) -> list[int]:
    """The context of an `EpisodeContext` (its task's features and limits at its training-time cap, probe attempt, feedback of the previous attempt)."""
    return context_for_task(ctx.task, ctx.probe_attempt, ctx.feedback, ctx.train_seconds)


# ---------------------------------------------------------------------------------------------
# Jobs: decode, render to job.toml, and back
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobChoice:
    """The decoded content of a complete job sequence (None = backend default)."""

    model: str
    hyperparameters: dict[str, Any]  # "training.learning_rate" -> value or None, for the 7 tunables
    reward: dict[str, float] | None  # None = the job.toml default ({"correctness": 1.0})
    dataset_size: int | None
    difficulty: float | None
    explicit: int = field(default=0)  # how many of the 7 tunables are set explicitly

    def to_dict(self, seed: int | None = None, limits: JobLimits | None = None) -> dict[str, Any]:
        """The job.toml mapping (defaults left out, as a trainer agent would write it); with `limits`, the dataset's
        size and difficulty (a default one too) moved into the task's range and the rollout length raised to hold the task's answers."""
        data: dict[str, Any] = {"model": {"name": self.model}}
        for path, value in self.hyperparameters.items():
            if value is not None:
                section, key = path.split(".")
                data.setdefault(section, {})[key] = value
        if limits is not None:
            self._fit_max_tokens(data, limits)
        if seed is not None:
            data.setdefault("training", {})["seed"] = int(seed) % 2**31
        if self.reward is not None:
            data["reward"] = {"components": dict(self.reward)}
        dataset: dict[str, float] = {}
        size, difficulty = self.dataset_size, self.difficulty
        if limits is not None:
            size = _fitted(size, JOB_DATASET_SIZE, limits.dataset_size)
            difficulty = _fitted(difficulty, JOB_DIFFICULTY, limits.difficulty)
        if size is not None:
            dataset["size"] = size
        if difficulty is not None:
            dataset["difficulty"] = difficulty
        if dataset:
            data["dataset"] = dataset
        return data

    def _fit_max_tokens(self, data: dict[str, Any], limits: JobLimits) -> None:
        """Raise the rollout length (a default one too) to what the task's answers need, and lower max_steps where the longer
        rollouts would overrun the rollout budget."""
        chosen = self.hyperparameters.get("rollout.max_tokens")
        max_tokens = _fitted(chosen, DEFAULT_MAX_TOKENS, limits.max_tokens)
        if max_tokens == chosen:
            return
        data.setdefault("rollout", {})["max_tokens"] = max_tokens
        steps, batch = self.hyperparameters.get("training.max_steps"), self.hyperparameters.get("training.batch_size")
        steps = DEFAULT_MAX_STEPS if steps is None else steps
        fitted_steps = limits.max_steps_in_budget(steps, DEFAULT_BATCH_SIZE if batch is None else batch, max_tokens)
        if fitted_steps != steps:
            data.setdefault("training", {})["max_steps"] = fitted_steps


JOB_DATASET_SIZE: int = JobDataset.model_fields["size"].default
JOB_DIFFICULTY: float = JobDataset.model_fields["difficulty"].default


def _fitted(value: Any, default: Any, fit: Callable[[Any], Any]) -> Any:
    """`value` (None: the default) moved into range by `fit`; None still when the default already lies in range."""
    actual = default if value is None else value
    fitted = fit(actual)
    return value if fitted == actual else fitted


def _slot_value(slot: Slot, token: int) -> Any:
    name = VOCAB[token]
    tokens = slot.tokens
    index = tokens.index(name)
    if slot.has_default:
        return None if index == 0 else slot.values[index - 1]
    return slot.values[index]


def decode_job(job_tokens: Sequence[int]) -> JobChoice:
    """Decode a complete job sequence (the tokens after `<sep>`, `<end>` included)."""
    job_tokens = [int(t) for t in job_tokens]
    state = grammar_state(job_tokens)
    if not state.complete:
        raise ValueError("the job sequence is incomplete")
    model = _slot_value(MODEL_SLOT, job_tokens[0])
    hyper = {f"{slot.section}.{slot.key}": _slot_value(slot, job_tokens[1 + i]) for i, slot in enumerate(TRAINING_SLOTS)}
    position = 1 + len(TRAINING_SLOTS)
    reward: dict[str, float] | None = None
    if job_tokens[position] != _REWARD_DEFAULT_ID:
        reward = {}
        while job_tokens[position] != _REWARD_END_ID:
            component = REWARD_COMPONENTS[_COMPONENT_IDS.index(job_tokens[position])]
            reward[component] = REWARD_WEIGHTS[_WEIGHT_IDS.index(job_tokens[position + 1])]
            position += 2
    position += 1
    size = _slot_value(DATASET_SLOTS[0], job_tokens[position])
    difficulty = _slot_value(DATASET_SLOTS[1], job_tokens[position + 1])
    explicit = sum(value is not None for value in hyper.values())
    return JobChoice(model, hyper, reward, size, difficulty, explicit)


def _job_part(tokens: Sequence[int]) -> list[int]:
    tokens = [int(t) for t in tokens]
    return split_sequence(tokens)[1] if SEP_ID in tokens else tokens


def render_job_toml(tokens: Sequence[int], seed: int | None = None, limits: JobLimits | None = None) -> str:
    """The job.toml text of a job sequence (a full sequence with its context, or only the job part); with `limits`,
    its dataset size and difficulty are moved into the task's range and its rollout length raised to hold the task's answers (JobChoice.to_dict).

    A job the schema accepts is written through `JobSpec` and `dump_toml_model`; one the schema
    rejects (e.g. no positive reward weight) is written as raw TOML so the probe sees and reports it.
    """
    data = decode_job(_job_part(tokens)).to_dict(seed=seed, limits=limits)
    try:
        return dump_toml_model(JobSpec.model_validate(data))
    except ValidationError:
        return tomli_w.dumps(data)


def _grid_value(slot: Slot, value: Any) -> int:
    if value is None:
        if not slot.has_default:
            raise ValueError(f"{slot.section}.{slot.key} must be set")
        return TOKEN_ID[slot.token(None)]
    for grid in slot.values:
        if isinstance(grid, str):
            if value == grid:
                return TOKEN_ID[slot.token(grid)]
        elif not isinstance(value, bool) and isinstance(value, (int, float)) and math.isclose(float(value), float(grid), rel_tol=1e-9, abs_tol=1e-12):
            return TOKEN_ID[slot.token(grid)]
    raise ValueError(f"{slot.section}.{slot.key} = {value!r} is not on the grid {list(slot.values)}")


def job_tokens_from_dict(data: dict[str, Any]) -> list[int]:
    """The job sequence of a job.toml mapping whose values all lie on the grid (raises ValueError otherwise)."""
    allowed_keys = {
        "model": {"name", "lora_rank"},
        "training": {s.key for s in TRAINING_SLOTS if s.section == "training"} | {"seed"},
        "rollout": {s.key for s in TRAINING_SLOTS if s.section == "rollout"},
        "reward": {"components"},
        "dataset": {"size", "difficulty", "path"},
        "environment": {"module"},
    }
    for section, table in data.items():
        if section not in allowed_keys or not isinstance(table, dict):
            raise ValueError(f"{section}: not expressible in the job language")
        extra = set(table) - allowed_keys[section]
        if extra:
            raise ValueError(f"{section}: keys {sorted(extra)} are not expressible in the job language")
    if data.get("model", {}).get("lora_rank", 0) != 0:
        raise ValueError("model.lora_rank: only 0 is expressible in the job language")
    if (
        data.get("dataset", {}).get("path", "dataset.jsonl") != "dataset.jsonl"
        or data.get("environment", {}).get("module", "environment.py") != "environment.py"
    ):
        raise ValueError("dataset.path / environment.module: only the defaults are expressible in the job language")
    out = [_grid_value(MODEL_SLOT, data.get("model", {}).get("name"))]
    for slot in TRAINING_SLOTS:
        out.append(_grid_value(slot, data.get(slot.section, {}).get(slot.key)))
    components = data.get("reward", {}).get("components")
    if components is None:
        out.append(_REWARD_DEFAULT_ID)
    else:
        if not components:
            raise ValueError("reward.components: an empty table is not expressible in the job language")
        for name in REWARD_COMPONENTS:
            if name in components:
                out.append(TOKEN_ID[component_token(name)])
                weight = components[name]
                matches = [w for w in REWARD_WEIGHTS if math.isclose(float(weight), w, abs_tol=1e-12)]
                if not matches:
                    raise ValueError(f"reward.components.{name} = {weight!r} is not on the grid {list(REWARD_WEIGHTS)}")
                out.append(TOKEN_ID[weight_token(matches[0])])
        unknown = sorted(set(components) - set(REWARD_COMPONENTS))
        if unknown:
            raise ValueError(f"reward.components: {unknown} are not in the job language")
        out.append(_REWARD_END_ID)
    for slot in DATASET_SLOTS:
        out.append(_grid_value(slot, data.get(slot.section, {}).get(slot.key)))
    out.append(END_ID)
    grammar_state(out)  # sanity: the result is grammatical
    return out


def parse_job_toml(text: str | bytes) -> list[int]:
    """The job sequence of a job.toml text (the inverse of `render_job_toml` for on-grid jobs)."""
    return job_tokens_from_dict(parse_toml_text(text, "job.toml"))
