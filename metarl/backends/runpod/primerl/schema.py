"""The pinned prime-rl release's ``rl.toml`` schema, derived from its own classes, and a validator for it.

The schema is ``rl_config_<tag>.schema.json`` beside this module: ``RLConfig.model_json_schema()``
of prime-rl :data:`~metarl.backends.runpod.pod.pin.PRIME_RL_TAG`, written by ``scripts/derive_primerl_schema.py``
from a checkout at the tag (its ``x-metarl-provenance`` block names the commit and package versions).
Nothing in it is typed by hand: every table, key, type, bound, literal and discriminated union is
prime-rl's. :func:`rl_config_problems` validates a compiled mapping against it with ``jsonschema``.

Before validating, the mapping is normalised as prime-rl's ``pydantic_config.BaseConfig``
(prime-pydantic-config 0.4.2, ``cli.py``) normalises its input: the string ``"None"`` becomes null,
and a table of a discriminated union without its ``type`` gets the tag of the field's default.

What JSON schema cannot express are prime-rl's model validators; :func:`cross_field_problems` holds
the ones a compiled job can run into, each citing its upstream function (paths relative to the
tag's ``packages/prime-rl-configs/src/prime_rl/``). ``scripts/check_bundles_with_primerl.py`` runs
the tag's own launcher (``rl @ rl.toml --dry-run``) on compiled bundles, which runs all of them.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from metarl.backends.runpod.pod.pin import PRIME_RL_TAG

SCHEMA_FILE = Path(__file__).with_name(f"rl_config_{PRIME_RL_TAG}.schema.json")
"""The derived schema (package data; regenerate with scripts/derive_primerl_schema.py)."""

ProblemKind = Literal["extra_forbidden", "missing", "type", "bound", "choice", "tag", "semantic"]


class SchemaProblem(BaseModel):
    """One way an ``rl.toml`` mapping breaks the pinned release's config classes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, max_length=300, description="Dotted key path, e.g. orchestrator.batch_size or orchestrator.train.source[0]")
    kind: ProblemKind = Field(description="What went wrong")
    message: str = Field(min_length=1, max_length=1000, description="Human-readable reason")


@functools.cache
def rl_schema() -> dict[str, Any]:
    """The derived JSON schema of ``RLConfig`` (read once)."""
    return json.loads(SCHEMA_FILE.read_text())


def schema_provenance() -> dict[str, Any]:
    """Tag, commit and package versions the schema was derived with."""
    return dict(rl_schema()["x-metarl-provenance"])


def _discriminator(validator: Any, value: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]) -> Iterable[Any]:
    """pydantic's discriminated unions need their tag (JSON schema's ``oneOf`` alone would match an untagged table)."""
    from jsonschema.exceptions import ValidationError

    if not isinstance(instance, dict):
        return
    key, mapping = value["propertyName"], value.get("mapping", {})
    if key not in instance:
        yield ValidationError(f"Unable to extract tag using discriminator '{key}'")
    elif instance[key] not in mapping:
        expected = ", ".join(repr(name) for name in mapping)
        yield ValidationError(f"Input tag {instance[key]!r:.60} found using '{key}' does not match any of the expected tags: {expected}", path=[key])


@functools.cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    schema = rl_schema()
    Draft202012Validator.check_schema(schema)
    return extend(Draft202012Validator, {"discriminator": _discriminator})(schema)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _path(parts: Iterable[str | int], base: str = "") -> str:
    path = base
    for part in parts:
        path = _join(path, part)
    return path


# ---------------------------------------------------------------------------------------------
# normalisation as pydantic_config.BaseConfig does it (mode="before" validators)
# ---------------------------------------------------------------------------------------------


def _resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in node:
        node = rl_schema()["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _object_branch(node: Mapping[str, Any], value: Any) -> Mapping[str, Any] | None:
    """The model schema a table value is validated against (None when it is not a model)."""
    node = _resolve(node)
    if "discriminator" in node and isinstance(value, dict):
        target = node["discriminator"].get("mapping", {}).get(value.get(node["discriminator"]["propertyName"]))
        return _resolve({"$ref": target}) if target else None
    for key in ("anyOf", "oneOf"):
        if key in node:
            objects = [_resolve(branch) for branch in node[key] if _resolve(branch).get("type") != "null"]
            models = [branch for branch in objects if "properties" in branch or "discriminator" in branch]
            return _object_branch(models[0], value) if len(models) == 1 else None
    return node if "properties" in node else None


def _normalise(value: Any, node: Mapping[str, Any] | None) -> None:
    """In place: "None" -> None and missing discriminator tags filled from the field default, per model table."""
    if node is None:
        return
    if isinstance(value, list):
        items = _resolve(node).get("items")
        for item in value:
            if isinstance(item, dict) and items is not None:
                _normalise(item, _object_branch(items, item))
        return
    if not isinstance(value, dict) or "properties" not in node:
        return
    properties = node["properties"]
    for key in list(value):
        if value[key] == "None":
            value[key] = None
        if key not in properties:
            continue
        child, field = value[key], properties[key]
        default = field.get("default")
        if isinstance(child, dict) and "type" not in child and isinstance(default, dict) and "type" in default:
            child["type"] = default["type"]
        if isinstance(child, list):
            _normalise(child, _resolve(field) if "items" in _resolve(field) else _array_branch(field))
        elif isinstance(child, dict):
            _normalise(child, _object_branch(field, child))


def _array_branch(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    node = _resolve(node)
    for branch in node.get("anyOf", []):
        if "items" in _resolve(branch):
            return _resolve(branch)
    return None


def normalised(data: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``data`` normalised as prime-rl's BaseConfig normalises its input."""
    copied = copy.deepcopy(dict(data))
    _normalise(copied, _resolve(rl_schema()))
    return copied


# ---------------------------------------------------------------------------------------------
# jsonschema errors as problems
# ---------------------------------------------------------------------------------------------

_BOUND = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minLength", "maxLength"}
_CHOICE = {"enum", "const", "pattern"}


def _error_problems(error: Any) -> list[SchemaProblem]:
    """Problems of one jsonschema error; unions are resolved to the branch prime-rl would pick."""
    path = _path(error.absolute_path)
    validator, instance, schema = error.validator, error.instance, error.schema
    if validator == "additionalProperties":
        allowed = set(schema.get("properties", {}))
        return [
            SchemaProblem(path=_join(path, key), kind="extra_forbidden", message="Extra inputs are not permitted") for key in instance if key not in allowed
        ]
    if validator == "required":
        return [SchemaProblem(path=_join(path, key), kind="missing", message="Field required") for key in error.validator_value if key not in instance]
    if validator == "discriminator":
        return [SchemaProblem(path=path, kind="tag", message=error.message)]
    if validator in ("oneOf", "anyOf"):
        return _union_problems(error, path)
    if validator in _BOUND:
        kind: ProblemKind = "bound"
    elif validator in _CHOICE:
        kind = "choice"
    else:
        kind = "type"
    return [SchemaProblem(path=path or "(root)", kind=kind, message=error.message[:1000])]


def _union_problems(error: Any, path: str) -> list[SchemaProblem]:
    branches = error.schema[error.validator]
    discriminator = error.schema.get("discriminator")
    if discriminator is not None:
        if not isinstance(error.instance, dict):
            return [SchemaProblem(path=path or "(root)", kind="type", message=f"Input should be a table, got {error.instance!r:.80}")]
        target = discriminator.get("mapping", {}).get(error.instance.get(discriminator["propertyName"]))
        if target is None:
            return []  # reported by the discriminator keyword
        chosen = [index for index, branch in enumerate(branches) if branch.get("$ref") == target]
    else:
        chosen = [index for index, branch in enumerate(branches) if _resolve(branch).get("type") != "null" or error.instance is None]
    sub_errors = [sub for sub in error.context if sub.relative_schema_path and sub.relative_schema_path[0] in chosen]
    if len(chosen) == 1 and sub_errors:
        return [problem for sub in sub_errors for problem in _error_problems(sub)]
    return [SchemaProblem(path=path or "(root)", kind="type", message=error.message[:1000])]


def schema_problems(data: Mapping[str, Any]) -> list[SchemaProblem]:
    """Every way ``data`` (a parsed rl.toml) breaks the derived schema, in path order."""
    errors = sorted(_validator().iter_errors(normalised(data)), key=lambda error: [str(part) for part in error.absolute_path])
    return [problem for error in errors for problem in _error_problems(error)]


# ---------------------------------------------------------------------------------------------
# prime-rl's model validators that a compiled job can run into (JSON schema cannot hold them)
# ---------------------------------------------------------------------------------------------

SHARED_PROPAGATION: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model.name", ("trainer.model.name", "inference.model.name", "orchestrator.model.name")),
    ("max_steps", ("trainer.max_steps", "orchestrator.max_steps")),
    ("seq_len", ("trainer.model.seq_len", "orchestrator.seq_len")),
    ("ckpt.interval", ("trainer.ckpt.interval", "orchestrator.ckpt.interval")),
    ("ckpt.keep_last", ("trainer.ckpt.keep_last", "orchestrator.ckpt.keep_last")),
    ("file_monitor.filename", ("trainer.file_monitor.filename", "orchestrator.file_monitor.filename")),
)
"""Shared fields ``utils/validation.py`` ``propagate_shared_fields`` copies into sub-configs; a
sub-config value that disagrees with the shared one is a conflict it raises on."""

ORCHESTRATOR_DEFAULT_BATCH_SIZE = 128
"""``configs/orchestrator.py`` ``resolve_batching``: batch_size when neither batch size is set."""
DEFAULT_SEQ_LEN = 2048
"""``seq_len`` default of ``configs/orchestrator.py`` OrchestratorConfig and ``configs/trainer.py`` ModelConfig."""
DEFAULT_GPUS_PER_NODE = 8
"""``configs/rl.py`` ``BaseDeploymentConfig.gpus_per_node``."""
FILTER_SLOTS = ("pre_batch_filters", "post_batch_filters")


def get_path(data: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted path of nested tables, or None when any part is missing."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cross_field_problems(data: Mapping[str, Any]) -> list[SchemaProblem]:
    """The pinned release's model validators that can fire on a compiled job (pure; ``data`` is normalised)."""
    problems: list[SchemaProblem] = []

    def semantic(path: str, message: str) -> None:
        problems.append(SchemaProblem(path=path, kind="semantic", message=message))

    # utils/validation.py propagate_shared_fields (RLConfig, mode="before": raises before anything else)
    for shared, targets in SHARED_PROPAGATION:
        value = get_path(data, shared)
        for target in targets if value is not None else ():
            sub = get_path(data, target)
            if sub is not None and sub != value:
                semantic(target, f"shared [{shared}] = {value!r} conflicts with [{target}] = {sub!r}; set it in one place")
    if problems:
        return problems

    # configs/rl.py SingleNodeDeploymentConfig.validate_gpu_count
    deployment_table = data.get("deployment")
    deployment: Mapping[str, Any] = deployment_table if isinstance(deployment_table, Mapping) else {}
    single_node = deployment.get("type", "single_node") == "single_node"
    train_gpus, infer_gpus = deployment.get("num_train_gpus", 1), deployment.get("num_infer_gpus", 1)
    per_node = deployment.get("gpus_per_node", DEFAULT_GPUS_PER_NODE)
    if single_node and all(_number(v) for v in (train_gpus, infer_gpus, per_node)) and train_gpus + infer_gpus > per_node:
        semantic("deployment", f"Total GPU count ({train_gpus + infer_gpus} = {train_gpus} train + {infer_gpus} infer) exceeds gpus_per_node ({per_node})")

    # configs/rl.py RLConfig.auto_setup_weight_broadcast (NCCL by default without LoRA) and
    # validate_enough_devices_for_nccl; configs/trainer.py TrainerConfig.validate_lora_broadcast
    lora = get_path(data, "trainer.model.lora") is not None
    broadcast = get_path(data, "weight_broadcast.type") or get_path(data, "trainer.weight_broadcast.type") or ("filesystem" if lora else "nccl")
    if lora and broadcast in ("nccl", "nixl"):
        semantic("weight_broadcast.type", "LoRA training is not yet supported with in-memory weight broadcast; set weight_broadcast.type = 'filesystem'")
    if single_node and broadcast == "nccl" and _number(train_gpus) and _number(infer_gpus) and train_gpus + infer_gpus < 2:
        semantic("deployment", "NCCL weight broadcast requires at least 2 GPUs to build the broadcast process group")

    # configs/trainer.py TrainerConfig.validate_lora_adapter_saving
    if get_path(data, "trainer.ckpt.weights.save_adapter_separately") is True and not lora:
        semantic("trainer.ckpt.weights.save_adapter_separately", "save_adapter_separately=True requires LoRA to be enabled (trainer.model.lora)")

    # configs/orchestrator.py OrchestratorConfig.resolve_batching
    orchestrator_table = data.get("orchestrator")
    orchestrator: Mapping[str, Any] = orchestrator_table if isinstance(orchestrator_table, Mapping) else {}
    batch, token_batch, group = orchestrator.get("batch_size"), orchestrator.get("token_batch_size"), orchestrator.get("group_size", 1)
    if batch is not None and token_batch is not None:
        semantic("orchestrator.batch_size", "Set exactly one of batch_size or token_batch_size")
    elif token_batch is None:
        batch = ORCHESTRATOR_DEFAULT_BATCH_SIZE if batch is None else batch
        if _number(batch) and _number(group) and group >= 1 and batch % group != 0:
            semantic("orchestrator.batch_size", f"Batch size must be divisible by the number of samples per problem ({batch} % {group} != 0)")

    # configs/orchestrator.py OrchestratorConfig.validate_unique_filter_types
    for slot in FILTER_SLOTS:
        filters = orchestrator.get(slot)
        types = [item.get("type") for item in filters if isinstance(item, Mapping)] if isinstance(filters, list) else []
        if len(types) != len(set(types)):
            semantic(f"orchestrator.{slot}", f"Duplicate filter types in {slot}: {types}. Each filter type may only appear once per slot")

    # utils/validation.py validate_shared_seq_len
    seq_len = data.get("seq_len")
    orchestrator_seq = orchestrator.get("seq_len", seq_len if seq_len is not None else DEFAULT_SEQ_LEN)
    trainer_seq = get_path(data, "trainer.model.seq_len")
    trainer_seq = trainer_seq if trainer_seq is not None else (seq_len if seq_len is not None else DEFAULT_SEQ_LEN)
    if _number(trainer_seq) and _number(orchestrator_seq) and trainer_seq < orchestrator_seq:
        semantic("trainer.model.seq_len", f"Trainer model seq_len ({trainer_seq}) must be >= orchestrator seq_len ({orchestrator_seq})")

    # configs/orchestrator.py EnvConfig.validate_env and TrainConfig.validate_unique_env_names
    sources = get_path(data, "orchestrator.train.source")
    names: list[str] = []
    for index, source in enumerate(sources if isinstance(sources, list) else []):
        if not isinstance(source, Mapping):
            continue
        legacy_id = get_path(source, "legacy.id")
        if legacy_id is None and not get_path(source, "env.taskset.id") and not get_path(source, "env.id"):
            semantic(f"orchestrator.train.source[{index}]", 'no env configured: set legacy = { id = "<id>" } (v0) or a v1 env')
        name = source.get("name") or legacy_id or get_path(source, "env.taskset.id") or ""
        if name == "agg":
            semantic(f"orchestrator.train.source[{index}].name", 'Environment name "agg" is reserved for cross-env metric aggregation')
        names.append(str(name))
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        semantic("orchestrator.train.source", f"Duplicate training environment names: {duplicates}")
    return problems


def rl_config_problems(data: Mapping[str, Any]) -> list[SchemaProblem]:
    """Schema problems first; the cross-field rules only when the schema holds (as pydantic orders them)."""
    problems = schema_problems(data)
    return problems if problems else cross_field_problems(normalised(data))


__all__ = [
    "SCHEMA_FILE",
    "SchemaProblem",
    "cross_field_problems",
    "get_path",
    "normalised",
    "rl_config_problems",
    "rl_schema",
    "schema_problems",
    "schema_provenance",
]
