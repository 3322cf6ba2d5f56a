"""A compact job language: a fixed vocabulary of tokens that encodes one complete `job.toml`.

A sequence is a conditioning context followed by a job:

    <bos> ans=<t> alen=<b> plen=<b> grader=<h> dlo=<d> dhi=<d> desc=<h> attempt=<n> fb=<field>... <sep>
                                                                  (context, never sampled)
    model=<name> lr=<v> steps=<v> batch=<v> group=<v> kl=<v> temp=<v> maxtok=<v>
    ( reward=default | (rw=<component> w=<weight>)+ reward=end )
    data=<size> diff=<difficulty> <end>                          (job, sampled)

The context describes the task by features any family has (``metarl.policy.family_features``),
not by its name, so a family the policy never saw is a valid context too.

Every hyperparameter slot has a `default` token (the key is left out of job.toml) and a small
grid of explicit values. Reward components appear in a fixed canonical order, each at most once.

`allowed_next` is the grammar: it gives the tokens allowed after a job prefix, so every sequence
sampled under it is syntactically complete. It constrains syntax only: jobs the probe rejects
(batch_size not divisible by group_size, over the rollout budget, dataset size out of range,
no positive reward weight) stay expressible, so the probe has something to catch and the policy
something to learn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tomli_w
from pydantic import ValidationError

from metarl.graders import REWARD_COMPONENTS
from metarl.policy.family_features import FEATURE_TOKEN_COUNT, FEATURE_TOKENS, FamilyFeatures, feature_tokens
from schemas.base import FieldProblem, dump_toml_model, parse_toml_text
from schemas.job import JobSpec

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

MODELS = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B")
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
    Slot("group", "training", "group_size", (1, 2, 4, 8, 16)),
    Slot("kl", "training", "kl_coef", (0.0, 0.01, 0.05, 0.1)),
    Slot("temp", "rollout", "temperature", (0.5, 0.7, 1.0, 1.2)),
    Slot("maxtok", "rollout", "max_tokens", (8, 16, 32, 64, 128)),
)
"""The seven tunable hyperparameters, in the order they are written."""

REWARD_WEIGHTS = (-1.0, 0.0, 0.1, 0.5, 1.0, 2.0)
REWARD_DEFAULT, REWARD_END = "reward=default", "reward=end"
DATASET_SLOTS = (
    Slot("data", "dataset", "size", (32, 64, 256, 1000, 4000, 20000, 50000)),
    Slot("diff", "dataset", "difficulty", (0.0, 0.25, 0.5, 0.75, 1.0)),
)


def component_token(name: str) -> str:
    return f"rw={name}"


def weight_token(weight: float) -> str:
    return f"w={_fmt(float(weight))}"


CONTEXT_TOKENS = FEATURE_TOKENS + tuple(f"attempt={n}" for n in range(1, MAX_ATTEMPT_TOKEN + 1)) + tuple(f"fb={kind}" for kind in FEEDBACK_KINDS)
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
MAX_CONTEXT_LENGTH = 1 + FEATURE_TOKEN_COUNT + 1 + len(FEEDBACK_KINDS) + 1


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
_REWARD_DEFAULT_ID, _REWARD_END_ID = TOKEN_ID[REWARD_DEFAULT], TOKEN_ID[REWARD_END]


@dataclass(frozen=True)
class GrammarState:
    """Where a job prefix stands: a phase plus, inside the reward section, the last component used.

    phase: 0..7 = the slot of `_SLOT_SEQUENCE` to fill next; 8 = reward section start;
    9 = after a component (a weight must follow); 10 = after a weight; 11, 12 = dataset slots;
    13 = `<end>` expected; 14 = complete.
    """

    phase: int = 0
    last_component: int = -1

    @property
    def complete(self) -> bool:
        return self.phase == 14

    def allowed(self) -> tuple[int, ...]:
        """Token ids allowed next (empty once the job is complete)."""
        if self.phase < len(_SLOT_SEQUENCE):
            return _SLOT_IDS[self.phase]
        if self.phase == 8:
            return (_REWARD_DEFAULT_ID,) + _COMPONENT_IDS
        if self.phase == 9:
            return _WEIGHT_IDS
        if self.phase == 10:
            return _COMPONENT_IDS[self.last_component + 1 :] + (_REWARD_END_ID,)
        if self.phase in (11, 12):
            return _DATASET_IDS[self.phase - 11]
        if self.phase == 13:
            return (END_ID,)
        return ()

    def advance(self, token: int) -> GrammarState:
        """The state after `token` (raises ValueError when the grammar does not allow it)."""
        if token not in self.allowed():
            where = "after the end of the job" if self.complete else f"in phase {self.phase}"
            raise ValueError(f"token {VOCAB[token] if 0 <= token < VOCAB_SIZE else token!r} is not allowed {where}")
        if self.phase < 8:
            return GrammarState(self.phase + 1)
        if self.phase == 8:
            if token == _REWARD_DEFAULT_ID:
                return GrammarState(11)
            return GrammarState(9, _COMPONENT_IDS.index(token))
        if self.phase == 9:
            return GrammarState(10, self.last_component)
        if self.phase == 10:
            if token == _REWARD_END_ID:
                return GrammarState(11)
            return GrammarState(9, _COMPONENT_IDS.index(token))
        return GrammarState(self.phase + 1)


ALL_STATES: tuple[GrammarState, ...] = (
    tuple(GrammarState(phase) for phase in range(9))
    + tuple(GrammarState(phase, c) for phase in (9, 10) for c in range(len(REWARD_COMPONENTS)))
    + tuple(GrammarState(phase) for phase in (11, 12, 13, 14))
)
"""Every state the grammar can be in (for precomputed mask tables)."""
STATE_INDEX = {state: index for index, state in enumerate(ALL_STATES)}


def grammar_state(job_tokens: Sequence[int]) -> GrammarState:
    state = GrammarState()
    for token in job_tokens:
        state = state.advance(int(token))
    return state


def allowed_next(job_tokens: Sequence[int]) -> tuple[int, ...]:
    """Token ids the grammar allows after a job prefix (the tokens after `<sep>`); empty when complete."""
    return grammar_state(job_tokens).allowed()


def is_complete(job_tokens: Sequence[int]) -> bool:
    try:
        return grammar_state(job_tokens).complete
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


def context_tokens(features: FamilyFeatures, attempt: int = 1, feedback: Sequence[FieldProblem] = ()) -> list[int]:
    """The conditioning prompt: `<bos> <feature tokens> attempt=N fb=... <sep>`."""
    if attempt < 1:
        raise ValueError(f"attempt is {attempt}; attempts count from 1")
    attempt_token = f"attempt={min(attempt, MAX_ATTEMPT_TOKEN)}"
    return [BOS_ID] + token_ids(feature_tokens(features)) + [TOKEN_ID[attempt_token]] + feedback_tokens(feedback) + [SEP_ID]


def context_for_task(task: Any, attempt: int = 1, feedback: Sequence[FieldProblem] = ()) -> list[int]:
    """The context of a `TaskSpec` (features from `metarl.policy.task_features.task_features`)."""
    from metarl.policy.task_features import task_features

    return context_tokens(task_features(task), attempt, feedback)


def context_for_episode(ctx: Any) -> list[int]:
    """The context of an `EpisodeContext` (its task's features, probe attempt, feedback of the previous attempt)."""
    return context_for_task(ctx.task, ctx.probe_attempt, ctx.feedback)


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

    def to_dict(self, seed: int | None = None) -> dict[str, Any]:
        """The job.toml mapping (defaults left out, as a trainer agent would write it)."""
        data: dict[str, Any] = {"model": {"name": self.model}}
        for path, value in self.hyperparameters.items():
            if value is not None:
                section, key = path.split(".")
                data.setdefault(section, {})[key] = value
        if seed is not None:
            data.setdefault("training", {})["seed"] = int(seed) % 2**31
        if self.reward is not None:
            data["reward"] = {"components": dict(self.reward)}
        dataset: dict[str, float] = {}
        if self.dataset_size is not None:
            dataset["size"] = self.dataset_size
        if self.difficulty is not None:
            dataset["difficulty"] = self.difficulty
        if dataset:
            data["dataset"] = dataset
        return data


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


def render_job_toml(tokens: Sequence[int], seed: int | None = None) -> str:
    """The job.toml text of a job sequence (a full sequence with its context, or only the job part).

    A job the schema accepts is written through `JobSpec` and `dump_toml_model`; one the schema
    rejects (e.g. no positive reward weight) is written as raw TOML so the probe sees and reports it.
    """
    data = decode_job(_job_part(tokens)).to_dict(seed=seed)
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
