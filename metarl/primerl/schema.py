"""The pinned prime-rl release's ``rl.toml`` schema, held as data, and a validator for it.

Written by reading the pydantic config classes of prime-rl at the pinned tag
(:data:`metarl.primerl.pin.PRIME_RL_TAG`): ``packages/prime-rl-configs/src/prime_rl/configs/``
(``rl.py`` RLConfig and its Shared* blocks, ``trainer.py``, ``orchestrator.py``,
``inference.py``, ``shared.py``, ``algorithm.py``), the verifiers ``LegacyEnvConfig`` at the
tag's ``deps/verifiers`` commit, the renderer configs (``renderers/configs.py``; the tag's
``docs/training.md`` shows ``name = "qwen3"`` with ``enable_thinking = false``), and the
``configs/`` examples. Every class there derives from ``pydantic_config.BaseConfig``, which sets
``extra="forbid"``, turns the string ``"None"`` into None, and fills a missing ``type`` tag from
a discriminated field's default.

What the table holds: every field (name, type, bounds, literal choices) of every table on the
paths the compiler writes and of their neighbours. What it does not hold (:class:`Unheld`):
sections that need other packages' schemas (verifiers v1 ``env``, worker ``pool``, ``slurm``,
``vlm``, quantisation, KV offload) and algorithm or renderer variants the compiler never picks.
Writing an unheld section is reported as a problem: the compiler must not emit what this table
cannot check. Within held tables the validator rejects unknown keys exactly as prime-rl does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ValueKind = Literal["int", "float", "str", "bool", "path", "dict", "list[str]", "list[int]"]


@dataclass(frozen=True)
class Value:
    """A leaf field: a TOML scalar, an inline table of free keys (``dict``), or a list."""

    kind: ValueKind
    choices: tuple[str, ...] = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    optional: bool = False
    also: tuple[str, ...] = ()
    """String literals accepted besides ``kind`` (``int | Literal["auto"]``)."""


@dataclass(frozen=True)
class Table:
    """A config class: its fields by name; unknown keys are rejected unless ``extra_allowed``."""

    fields: Mapping[str, Node]
    required: frozenset[str] = frozenset()
    optional: bool = False
    extra_allowed: bool = False


@dataclass(frozen=True)
class Tagged:
    """A discriminated union of tables, chosen by the value of ``tag``."""

    tag: str
    variants: Mapping[str, Table]
    default: str | None = None
    """Tag filled in when absent (the field's default is a config with this tag); None: required."""
    optional: bool = False
    unheld: tuple[str, ...] = ()
    """Tags prime-rl accepts that this schema does not hold."""
    open_tags: bool = False
    """Any tag outside ``variants`` may be valid in prime-rl (the full list is not held): unheld, not invalid."""


@dataclass(frozen=True)
class ArrayOf:
    """An array of tables (``[[section]]``)."""

    item: Table | Tagged
    optional: bool = False


@dataclass(frozen=True)
class Unheld:
    """A field prime-rl accepts whose schema this table does not hold (the compiler never writes it)."""

    what: str = "its schema is not held here"


Node = Value | Table | Tagged | ArrayOf | Unheld


class SchemaProblem(BaseModel):
    """One way an ``rl.toml`` mapping breaks the pinned schema."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1, max_length=300, description="Dotted key path, e.g. orchestrator.batch_size")
    kind: Literal["extra_forbidden", "missing", "type", "bound", "choice", "tag", "unheld", "semantic"] = Field(
        description="What went wrong"
    )
    message: str = Field(min_length=1, max_length=1000, description="Human-readable reason (pydantic's wording where it applies)")


# ---------------------------------------------------------------------------------------------
# Constructors that keep the table readable
# ---------------------------------------------------------------------------------------------


def _int(**kw: Any) -> Value:
    return Value("int", **kw)


def _float(**kw: Any) -> Value:
    return Value("float", **kw)


def _str(*choices: str, **kw: Any) -> Value:
    return Value("str", choices=choices, **kw)


def _bool(**kw: Any) -> Value:
    return Value("bool", **kw)


def _path(**kw: Any) -> Value:
    return Value("path", **kw)


def _dict(**kw: Any) -> Value:
    return Value("dict", **kw)


def _strs(**kw: Any) -> Value:
    return Value("list[str]", **kw)


def _opt(node: Node) -> Node:
    """The same node as ``X | None`` (TOML writes None as the string "None")."""
    if isinstance(node, Unheld):
        return node
    return replace(node, optional=True)


def _table(required: tuple[str, ...] = (), optional: bool = False, extra_allowed: bool = False, **fields: Node) -> Table:
    return Table(fields=dict(fields), required=frozenset(required), optional=optional, extra_allowed=extra_allowed)


def _merge(base: Table, **fields: Node) -> Table:
    """A subclass table: the base's fields plus (or overriding) these."""
    return Table(fields={**base.fields, **fields}, required=base.required, optional=base.optional)


# ---------------------------------------------------------------------------------------------
# shared.py
# ---------------------------------------------------------------------------------------------

BASE_MODEL = _table(name=_str(), trust_remote_code=_bool(), vlm=Unheld("VLMConfig (vision-language models)"))
TOKENIZER = _table(name=_opt(_str()), trust_remote_code=_opt(_bool()), chat_template=_opt(_str()))
LOG = _table(level=_str(), vf_level=_str(), json_logging=_bool(), log_data=_bool(), interval=_float(gt=0))
TRAINER_LOG = _merge(LOG, ranks_filter=Value("list[int]"))
WANDB = _table(
    project=_str(), entity=_opt(_str()), name=_opt(_str()), group=_opt(_str()), tags=_opt(_strs()), offline=_bool()
)
LOG_EXTRAS = _table(samples=_bool(), distributions=_bool(), interval=_int(ge=1), sample_ratio=_opt(_float(ge=0.0, le=1.0)))
WANDB_WITH_EXTRAS = _merge(WANDB, log_extras=_opt(LOG_EXTRAS))
FILE_MONITOR = _table(filename=_str())
PRIME_MONITOR = _table(
    base_url=_str(),
    api_key_var=_str(),
    log_extras=_opt(LOG_EXTRAS),
    run_name=_opt(_str()),
    team_id=_opt(_str()),
    frontend_url=_opt(_str()),
)
HEARTBEAT = _table(required=("url",), url=_str())
METRICS_SERVER = _table(port=_int(ge=1, le=65535), host=_str())
ELASTIC = _table(required=("hostname",), hostname=_str(), port=_int(), sync_interval=_float())
CLIENT = _table(
    wait_for_ready_timeout=_int(),
    base_url=_strs(),
    api_key_var=_str(),
    headers=_dict(),
    headers_from_env=_dict(),
    extra_headers_from_state=_dict(),
    skip_model_check=_bool(),
    admin_base_url=_opt(_strs()),
    elastic=_opt(ELASTIC),
    router_url=_opt(_str()),
)
TRANSPORT_VARIANTS = {"filesystem": _table(), "zmq": _table(host=_str(), port=_int(), hwm=_int())}
ENV_VARS = _dict()
"""``EnvVars``: str -> str; prime-rl rejects CUDA_VISIBLE_DEVICES and the WANDB_SHARED_* names."""
PROTECTED_ENV_VARS = frozenset({"CUDA_VISIBLE_DEVICES", "WANDB_SHARED_MODE", "WANDB_SHARED_RUN_ID", "WANDB_SHARED_LABEL"})

# ---------------------------------------------------------------------------------------------
# trainer.py
# ---------------------------------------------------------------------------------------------

TRAINER_LORA = _table(
    rank=_int(ge=1), alpha=_float(ge=0), dropout=_float(ge=0, le=1), target_modules=_strs(), modules_to_save=_strs()
)
TRAINER_MODEL = _merge(
    BASE_MODEL,
    conversion_dir=_opt(_path()),
    seq_len=_int(),
    attn=_str("flash_attention_2", "flash_attention_3", "flash_attention_4", "auto"),
    compile=_opt(_table(fullgraph=_bool())),
    ac=_opt(_table(mode=_str("full", "selective"), freq=_int(ge=1), targets=_strs())),
    ac_offloading=_opt(_table(pin_memory=_bool(), max_inflight_activations=_int(ge=1))),
    fsdp_cpu_offload=_bool(),
    optim_cpu_offload=_bool(),
    reshard_after_forward=_bool(),
    dp_replicate=_int(),
    ep=_int(also=("auto",)),
    ep_comm_backend=_str("torch", "deepep"),
    deepep_num_sms=_int(ge=1),
    deepep_token_chunk_size=_opt(_int(ge=1)),
    cp=_int(),
    cp_style=_str("ring", "ulysses"),
    impl=_str("hf", "custom", "auto"),
    optimization_dtype=_str("bfloat16", "float32"),
    reduce_dtype=_str("bfloat16", "float32"),
    moe_router_dtype=_str("bfloat16", "float32"),
    moe_use_grouped_mm=_bool(),
    quantization=Unheld("FP8/MXFP8 training"),
    index_cache=Unheld("index cache"),
    freeze_moe_router=_bool(),
    lora=_opt(TRAINER_LORA),
    debug=_table(num_layers=_opt(_int()), random_init=_bool(), force_balanced_routing=_bool()),
    fused_lm_head_token_chunk_size=_int(also=("disabled",)),
)
OPTIMIZER_BASE = _table(lr=_float(ge=0), weight_decay=_float(ge=0), max_norm=_opt(_float(ge=0)))
TRAINER_OPTIM = Tagged(
    tag="type",
    default="adamw",
    variants={
        "adamw": _merge(OPTIMIZER_BASE, betas1=_float(ge=0), betas2=_float(ge=0)),
        "sgd": _merge(OPTIMIZER_BASE, nesterov=_bool(), momentum=_float()),
        "muon": _merge(OPTIMIZER_BASE, mu=_float(ge=0), betas1=_float(ge=0), betas2=_float(ge=0)),
        "sign_sgd": OPTIMIZER_BASE,
    },
)
TRAINER_SCHEDULER = Tagged(
    tag="type",
    default="constant",
    variants={
        "constant": _table(),
        "linear": _table(warmup_steps=_int(ge=0), decay_steps=_int(ge=0), min_lr=_float(ge=0)),
        "cosine": _table(warmup_steps=_int(ge=0), min_lr=_float(ge=0)),
    },
)
TRAINER_LOSS = Tagged(
    tag="type",
    default="default",
    variants={
        "default": _table(dppo_mask_low=_float(ge=0), dppo_mask_high=_float(ge=0), adv_tau=_float(ge=0), kl_tau=_float(ge=0)),
        "ipo": _table(ipo_threshold=_float(ge=0), adv_tau=_float(ge=0), kl_tau=_float(ge=0)),
        "custom": _table(required=("import_path",), import_path=_str(), kwargs=_dict()),
    },
)
TRAINER_CKPT = _table(
    output_dir=_opt(_path()),
    interval=_opt(_int(ge=1)),
    weights=_opt(_table(save_sharded=_bool(), save_format=_str("safetensors", "torch"), save_adapter_separately=_bool())),
    skip_gather_master_weights=_bool(),
    weights_only=_bool(),
    resume_step=_opt(_int(ge=-1)),
    keep_last=_opt(_int(ge=1)),
    keep_interval=_opt(_int(ge=1)),
    skip_progress=_bool(),
    skip_scheduler=_bool(),
    skip_dataloader=_bool(),
    skip_optimizer=_bool(),
)
IN_MEMORY_BROADCAST = _table(host=_str(), port=_int(), timeout=_int(), inference_world_size=_int(ge=1))
TRAINER_WEIGHT_BROADCAST = Tagged(
    tag="type",
    default="filesystem",
    variants={
        "filesystem": _table(save_sharded=_bool(), save_format=_str("safetensors", "torch")),
        "nccl": _merge(IN_MEMORY_BROADCAST, inference_world_size=_int(), quantize_in_weight_transfer=_bool()),
        "nixl": _merge(IN_MEMORY_BROADCAST, inference_world_size=_int(), session_id=_str()),
    },
)
TRAINER = _table(
    model=TRAINER_MODEL,
    tokenizer=TOKENIZER,
    data=_table(fake=_opt(_table(batch_size=_int(ge=1), generate_samples=_bool()))),
    loss=TRAINER_LOSS,
    optim=TRAINER_OPTIM,
    scheduler=TRAINER_SCHEDULER,
    ckpt=_opt(TRAINER_CKPT),
    weight_broadcast=TRAINER_WEIGHT_BROADCAST,
    rollout_transport=Tagged(tag="type", default="zmq", variants=TRANSPORT_VARIANTS),
    log=TRAINER_LOG,
    wandb=_opt(WANDB),
    file_monitor=_opt(FILE_MONITOR),
    output_dir=_path(),
    matmul_precision=_str("highest", "high", "medium"),
    max_steps=_opt(_int()),
    enable_router_replay=_bool(),
    memory_profiler_path=_opt(_path()),
    bench=_opt(_table(output_json=_opt(_path()))),
    gc=_opt(_table(interval=_int(ge=1))),
    trace_path=_opt(_path()),
    dist_timeout_seconds=_int(),
    heartbeat=_opt(HEARTBEAT),
    metrics_server=_opt(METRICS_SERVER),
    max_concurrent_runs=_int(ge=1),
    enable_token_export=_bool(),
    env_vars=ENV_VARS,
)

# ---------------------------------------------------------------------------------------------
# orchestrator.py, algorithm.py, verifiers LegacyEnvConfig, renderers
# ---------------------------------------------------------------------------------------------

GRPO_ALGO = _table(
    sampling=_table(source=_str("policy")),
    length_penalty=_opt(
        Tagged(
            tag="type",
            default="linear",
            variants={
                "linear": _table(
                    num_output_tokens_weight=_float(ge=0), num_input_tokens_weight=_float(ge=0), num_turns_weight=_float(ge=0)
                )
            },
        )
    ),
)
ALGO_UNHELD = ("echo", "max_rl", "rae", "hierarchical_grpo", "opd", "opsd", "sft")
ALGO = Tagged(tag="type", default="grpo", variants={"grpo": GRPO_ALGO}, unheld=ALGO_UNHELD)
SOURCE_ALGO = Tagged(tag="type", variants={"grpo": GRPO_ALGO}, optional=True, unheld=ALGO_UNHELD)
"""``TrainSourceConfig.algo``: ``AlgoConfig | None = None``, so no tag is filled in."""

TRAIN_SAMPLING = _table(temperature=_float(ge=0, le=2.0), max_completion_tokens=_opt(_int()), extra_body=_dict())
EVAL_SAMPLING = _table(
    temperature=_opt(_float(ge=0, le=2.0)),
    top_p=_opt(_float()),
    top_k=_opt(_int()),
    min_p=_opt(_float(ge=0)),
    max_completion_tokens=_opt(_int()),
    reasoning_effort=_opt(_str("minimal", "low", "medium", "high")),
    extra_body=_dict(),
)
LEGACY_ENV = _table(id=_opt(_str()), args=_dict(), extra_env_kwargs=_dict())
"""verifiers ``LegacyEnvConfig``: a classic (v0) environment loaded with ``load_environment(id, **args)``."""
ENV_SOURCE = _table(
    env=Unheld("verifiers v1 EnvConfig (taskset/agent); inner jobs use the classic env through `legacy`"),
    serve=_table(pool=Unheld("verifiers PoolConfig"), max_concurrent=_opt(_int(ge=1))),
    legacy=LEGACY_ENV,
    name=_opt(_str()),
    ratio=_float(gt=0),
)
TRAIN_SOURCE = _merge(ENV_SOURCE, sampling=TRAIN_SAMPLING, group_size=_int(ge=1), algo=SOURCE_ALGO)
EVAL_SOURCE = _merge(
    ENV_SOURCE, sampling=EVAL_SAMPLING, num_examples=_int(), group_size=_int(ge=1), interval=_int(ge=1)
)
RENDERER_BASE = _table(thinking_retention=_opt(_str("tool_cycle", "all")))
RENDERER = Tagged(
    tag="name",
    variants={
        "auto": RENDERER_BASE,
        "default": Table(
            fields={**RENDERER_BASE.fields, "tool_parser": _opt(_str()), "reasoning_parser": _opt(_str())}, extra_allowed=True
        ),
        "qwen3": _merge(RENDERER_BASE, enable_thinking=_bool()),
        "prime-qwen3": RENDERER_BASE,
    },
    open_tags=True,
)
"""``renderers.RendererConfig`` (discriminated by ``name``): the variants held are the ones for Qwen3;
other renderer names (qwen3.5, glm-5, minimax-m2, nemotron-3, ...) are reported as unheld."""
FILTER = Tagged(
    tag="type",
    variants={
        "gibberish": _table(enforce=_bool(), token_id_threshold=_int(), logprob_offset=_float()),
        "repetition": _table(enforce=_bool(), window=_int(ge=1), prob_threshold=_float(gt=0, le=1)),
        "zero_advantage": _table(enforce=_bool()),
    },
)
ORCH_CKPT = _table(
    interval=_opt(_int(ge=1)),
    resume_step=_opt(_int(ge=-1)),
    wait_for_weights_timeout=_opt(_int(ge=1)),
    keep_last=_opt(_int(ge=1)),
    keep_interval=_opt(_int(ge=1)),
    skip_progress=_bool(),
)
ORCH_WEIGHT_BROADCAST = Tagged(
    tag="type",
    default="filesystem",
    variants={
        "filesystem": _table(),
        "nccl": _merge(IN_MEMORY_BROADCAST, quantize_in_weight_transfer=_bool()),
        "nixl": _merge(IN_MEMORY_BROADCAST, session_id=_str()),
    },
)
ORCHESTRATOR = _table(
    algo=ALGO,
    model=_merge(
        BASE_MODEL, lora=_opt(_table(name=_opt(_str()), rank=_opt(_int(ge=1)), alpha=_opt(_float(ge=0)))), client=CLIENT
    ),
    train=_table(source=ArrayOf(TRAIN_SOURCE), sampling=TRAIN_SAMPLING),
    tokenizer=TOKENIZER,
    renderer=RENDERER,
    optim=_table(lr=_float(ge=0)),
    eval=_opt(
        _table(
            source=ArrayOf(EVAL_SOURCE),
            sampling=EVAL_SAMPLING,
            num_examples=_int(),
            group_size=_int(ge=1),
            interval=_int(ge=1),
            skip_first_step=_bool(),
            retrigger_on_resume=_bool(),
        )
    ),
    pre_batch_filters=ArrayOf(FILTER),
    post_batch_filters=ArrayOf(FILTER),
    log=LOG,
    env_vars=ENV_VARS,
    wandb=_opt(WANDB_WITH_EXTRAS),
    prime_monitor=_opt(PRIME_MONITOR),
    file_monitor=_opt(FILE_MONITOR),
    collect_inference_metrics=_bool(),
    inference_metrics_roles=_opt(_strs()),
    ckpt=_opt(ORCH_CKPT),
    weight_broadcast=ORCH_WEIGHT_BROADCAST,
    rollout_transport=Tagged(tag="type", default="zmq", variants=TRANSPORT_VARIANTS),
    output_dir=_path(),
    tasks_per_minute=_opt(_int(ge=1)),
    env_server_base_port=_int(ge=1, le=65535),
    batch_size=_opt(_int(ge=1)),
    token_batch_size=_opt(_int(ge=1)),
    oversampling_factor=_opt(_float(gt=0)),
    max_inflight_episodes=_opt(_int(ge=1)),
    group_size=_int(ge=1),
    seq_len=_int(),
    num_train_workers=_int(ge=1),
    max_steps=_opt(_int()),
    max_off_policy_steps=_int(ge=0),
    bench=_bool(),
    heartbeat=_opt(HEARTBEAT),
)

# ---------------------------------------------------------------------------------------------
# inference.py
# ---------------------------------------------------------------------------------------------

INFERENCE_MODEL = _merge(
    BASE_MODEL,
    dtype=_str("auto", "float16", "bfloat16", "float32"),
    max_model_len=_opt(_int()),
    enforce_eager=_bool(),
    chat_template=_opt(_str()),
    tool_call_parser=_opt(_str()),
    reasoning_parser=_opt(_str()),
    rope_scaling=Unheld("rope scaling (dict or str)"),
)
INFERENCE = _table(
    optional=True,
    server=_table(host=_opt(_str()), port=_int(), liveness_timeout_seconds=_float(gt=0)),
    router=_opt(
        Tagged(
            tag="type",
            variants={
                "vllm-router": _table(policy=_str()),
                "llm-d": _table(
                    scorers=_dict(),
                    prefill_scorer_overrides=_dict(),
                    decode_scorer_overrides=_dict(),
                    non_cached_tokens=_int(),
                    decode_sidecar_port=_int(),
                ),
            },
        )
    ),
    backend_port=_int(),
    model=INFERENCE_MODEL,
    parallel=_table(tp=_int(), dp=_int(ge=1)),
    log=LOG,
    env_vars=ENV_VARS,
    enable_lora=_bool(),
    max_loras=_int(),
    max_cpu_loras=_int(),
    max_lora_rank=_opt(_int()),
    lora_target_modules=_opt(_strs()),
    enable_prefix_caching=_opt(_bool()),
    gpu_memory_utilization=_float(),
    quantization=_opt(_str()),
    api_server_count=_int(ge=0),
    data_parallel_size_local=_opt(_int(ge=1)),
    data_parallel_rpc_port=_int(ge=1, le=65535),
    seed=_int(),
    enable_expert_parallel=_bool(),
    all2all_backend=_str(
        "allgather_reducescatter",
        "deepep_high_throughput",
        "deepep_low_latency",
        "flashinfer_nvlink_one_sided",
        "flashinfer_nvlink_two_sided",
    ),
    enable_eplb=_bool(),
    enable_dbo=_bool(),
    use_deep_gemm=_bool(),
    weight_broadcast=_table(type=_str("nccl", "filesystem", "nixl")),
    kv_cache_offload=Unheld("KV cache offload"),
    use_pd_kv_transfer=_bool(),
    enable_return_routed_experts=_bool(),
    enable_fp32_lm_head=_bool(),
    enable_fp32_router_logits=_bool(),
    vllm_extra=_dict(),
    deployment=Tagged(
        tag="type",
        default="single_node",
        variants={"single_node": _table(gpus_per_node=_int()), "multi_node": _table(gpus_per_node=_int(), num_nodes=_int(ge=1))},
        unheld=("disaggregated",),
    ),
    slurm=Unheld("SLURM"),
    output_dir=_path(),
    dry_run=_bool(),
)

# ---------------------------------------------------------------------------------------------
# rl.py: the file `rl @ rl.toml` reads
# ---------------------------------------------------------------------------------------------

SHARED_IN_MEMORY = _table(host=_str(), port=_int(), timeout=_int())
RL = _table(
    required=("trainer", "orchestrator"),
    trainer=TRAINER,
    orchestrator=ORCHESTRATOR,
    inference=INFERENCE,
    env_vars=ENV_VARS,
    output_dir=_path(),
    clean_output_dir=_bool(),
    log=_table(level=_opt(_str()), json_logging=_bool()),
    ckpt=_opt(
        _table(
            output_dir=_opt(_path()),
            interval=_opt(_int()),
            resume_step=_opt(_int()),
            keep_last=_opt(_int(ge=1)),
            keep_interval=_opt(_int(ge=1)),
        )
    ),
    wandb=_opt(
        _table(
            project=_opt(_str()),
            entity=_opt(_str()),
            name=_opt(_str()),
            group=_opt(_str()),
            tags=_opt(_strs()),
            offline=_opt(_bool()),
        )
    ),
    file_monitor=_opt(FILE_MONITOR),
    model=_opt(_table(name=_str(), vlm=Unheld("VLMConfig (vision-language models)"))),
    tokenizer=_opt(TOKENIZER),
    max_steps=_opt(_int()),
    seq_len=_opt(_int()),
    weight_broadcast=_opt(
        Tagged(
            tag="type",
            variants={
                "filesystem": _table(),
                "nccl": _merge(SHARED_IN_MEMORY, quantize_in_weight_transfer=_bool()),
                "nixl": _merge(SHARED_IN_MEMORY, session_id=_str()),
            },
        )
    ),
    rollout_transport=_opt(Tagged(tag="type", variants=TRANSPORT_VARIANTS)),
    bench=_bool(),
    deployment=Tagged(
        tag="type",
        default="single_node",
        variants={
            "single_node": _table(gpus_per_node=_int(), num_train_gpus=_int(), num_infer_gpus=_int()),
            "multi_node": _table(
                required=("num_train_nodes",),
                gpus_per_node=_int(),
                num_train_nodes=_int(),
                num_infer_nodes=_opt(_int(ge=0)),
                num_infer_replicas=_int(ge=1),
                nodes_per_fsdp_group=_opt(_int()),
                orchestrator_on_inference=_bool(),
            ),
        },
    ),
    slurm=Unheld("SLURM"),
    dry_run=_bool(),
)
"""``prime_rl.configs.rl.RLConfig`` at the pinned tag."""


# ---------------------------------------------------------------------------------------------
# Validation (pure)
# ---------------------------------------------------------------------------------------------

_KIND_WORDS = {
    "int": "a valid integer",
    "float": "a valid number",
    "str": "a valid string",
    "bool": "a valid boolean",
    "path": "a valid path",
    "dict": "a valid dictionary",
    "list[str]": "a valid list of strings",
    "list[int]": "a valid list of integers",
}


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _type_ok(kind: ValueKind, value: Any) -> bool:
    """Whether ``value`` has the type pydantic accepts for ``kind`` (bool is never a number here)."""
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("str", "path"):
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    return isinstance(value, list) and all(isinstance(item, int) and not isinstance(item, bool) for item in value)


def _bound_problem(spec: Value, value: float) -> str | None:
    if spec.ge is not None and not value >= spec.ge:
        return f"Input should be greater than or equal to {spec.ge:g}"
    if spec.gt is not None and not value > spec.gt:
        return f"Input should be greater than {spec.gt:g}"
    if spec.le is not None and not value <= spec.le:
        return f"Input should be less than or equal to {spec.le:g}"
    if spec.lt is not None and not value < spec.lt:
        return f"Input should be less than {spec.lt:g}"
    return None


def _value_problems(spec: Value, value: Any, path: str) -> list[SchemaProblem]:
    if spec.optional and value == "None":
        return []
    if isinstance(value, str) and value in spec.also:
        return []
    if not _type_ok(spec.kind, value):
        extra = f" or one of {list(spec.also)}" if spec.also else ""
        return [SchemaProblem(path=path, kind="type", message=f"Input should be {_KIND_WORDS[spec.kind]}{extra}, got {value!r:.80}")]
    if spec.choices and value not in spec.choices:
        return [SchemaProblem(path=path, kind="choice", message=f"Input should be one of {list(spec.choices)}, got {value!r:.80}")]
    if spec.kind in ("int", "float"):
        problem = _bound_problem(spec, value)
        if problem:
            return [SchemaProblem(path=path, kind="bound", message=problem)]
    return []


def _table_problems(spec: Table, value: Any, path: str, skip: frozenset[str] = frozenset()) -> list[SchemaProblem]:
    if spec.optional and value == "None":
        return []
    if not isinstance(value, dict):
        return [SchemaProblem(path=path or "(root)", kind="type", message=f"Input should be a table, got {value!r:.80}")]
    problems: list[SchemaProblem] = []
    for key, item in value.items():
        if key in skip:
            continue
        child = _join(path, key)
        if key not in spec.fields:
            if not spec.extra_allowed:
                problems.append(SchemaProblem(path=child, kind="extra_forbidden", message="Extra inputs are not permitted"))
            continue
        problems += node_problems(spec.fields[key], item, child)
    for key in sorted(spec.required - set(value)):
        problems.append(SchemaProblem(path=_join(path, key), kind="missing", message="Field required"))
    return problems


def _tagged_problems(spec: Tagged, value: Any, path: str) -> list[SchemaProblem]:
    if spec.optional and value == "None":
        return []
    if not isinstance(value, dict):
        return [SchemaProblem(path=path, kind="type", message=f"Input should be a table, got {value!r:.80}")]
    tag = value.get(spec.tag, spec.default)
    if tag is None:
        return [SchemaProblem(path=path, kind="tag", message=f"Unable to extract tag using discriminator '{spec.tag}'")]
    if tag in spec.unheld or (spec.open_tags and tag not in spec.variants):
        return [SchemaProblem(path=_join(path, spec.tag), kind="unheld", message=f"{spec.tag} = {tag!r} is valid in prime-rl but not held by this schema")]
    if tag not in spec.variants:
        expected = ", ".join(repr(name) for name in list(spec.variants) + list(spec.unheld))
        return [
            SchemaProblem(
                path=_join(path, spec.tag),
                kind="tag",
                message=f"Input tag {tag!r:.60} found using '{spec.tag}' does not match any of the expected tags: {expected}",
            )
        ]
    return _table_problems(spec.variants[tag], value, path, skip=frozenset({spec.tag}))


def node_problems(spec: Node, value: Any, path: str) -> list[SchemaProblem]:
    """Every schema problem of ``value`` against ``spec`` (recursive, pure)."""
    if isinstance(spec, Unheld):
        return [SchemaProblem(path=path, kind="unheld", message=f"valid in prime-rl but not held by this schema ({spec.what}); the compiler must not write it")]
    if isinstance(spec, Value):
        return _value_problems(spec, value, path)
    if isinstance(spec, Table):
        return _table_problems(spec, value, path)
    if isinstance(spec, Tagged):
        return _tagged_problems(spec, value, path)
    if spec.optional and value == "None":
        return []
    if not isinstance(value, list):
        return [SchemaProblem(path=path, kind="type", message=f"Input should be an array of tables, got {value!r:.80}")]
    problems: list[SchemaProblem] = []
    for index, item in enumerate(value):
        problems += node_problems(spec.item, item, _join(path, index))
    return problems


# ---------------------------------------------------------------------------------------------
# Cross-field rules of the pinned release that a compiled job can run into
# ---------------------------------------------------------------------------------------------

SHARED_PROPAGATION: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model.name", ("trainer.model.name", "inference.model.name", "orchestrator.model.name")),
    ("max_steps", ("trainer.max_steps", "orchestrator.max_steps")),
    ("seq_len", ("trainer.model.seq_len", "orchestrator.seq_len")),
    ("ckpt.interval", ("trainer.ckpt.interval", "orchestrator.ckpt.interval")),
    ("wandb.project", ("trainer.wandb.project", "orchestrator.wandb.project")),
    ("file_monitor.filename", ("trainer.file_monitor.filename", "orchestrator.file_monitor.filename")),
)
"""Shared top-level fields that ``propagate_shared_fields`` copies into sub-configs; a sub-config
value that disagrees with the shared one is a conflict prime-rl rejects."""

ORCHESTRATOR_DEFAULT_SEQ_LEN = 2048
TRAINER_DEFAULT_SEQ_LEN = 2048
DEFAULT_GPUS_PER_NODE = 8
ORCHESTRATOR_DEFAULT_BATCH_SIZE = 128


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


def semantic_problems(data: Mapping[str, Any]) -> list[SchemaProblem]:
    """The pinned release's cross-field validators that can fire on a compiled job (pure).

    Mirrors: propagate_shared_fields conflicts; RLConfig ``validate_gpu_count`` (train + infer GPUs
    <= gpus_per_node); OrchestratorConfig ``resolve_batching`` (one of batch_size/token_batch_size,
    batch_size divisible by group_size) and ``validate_renderer_auto_resolves`` (an explicit
    renderer, since this table does not hold MODEL_RENDERER_MAP); ``validate_shared_seq_len``;
    EnvConfig ``validate_env`` (a legacy id or a v1 env, unique names, "agg" reserved); the
    EnvVars protected names; ``SharedWandbConfig`` offline; LoRA with in-memory weight broadcast.
    """
    problems: list[SchemaProblem] = []

    def semantic(path: str, message: str) -> None:
        problems.append(SchemaProblem(path=path, kind="semantic", message=message))

    for shared, targets in SHARED_PROPAGATION:
        value = get_path(data, shared)
        if value is None:
            continue
        for target in targets:
            sub = get_path(data, target)
            if sub is not None and sub != value:
                semantic(target, f"shared [{shared}] = {value!r} conflicts with [{target}] = {sub!r}; set it in one place")
    if problems:  # propagate_shared_fields runs first (mode="before") and raises before any other check
        return problems

    deployment = data.get("deployment")
    if isinstance(deployment, Mapping) and deployment.get("type", "single_node") == "single_node":
        train_gpus, infer_gpus = deployment.get("num_train_gpus", 1), deployment.get("num_infer_gpus", 1)
        per_node = deployment.get("gpus_per_node", DEFAULT_GPUS_PER_NODE)
        if all(_number(v) for v in (train_gpus, infer_gpus, per_node)) and train_gpus + infer_gpus > per_node:
            semantic("deployment", f"Total GPU count ({train_gpus + infer_gpus}) exceeds gpus_per_node ({per_node})")

    orchestrator = data.get("orchestrator") if isinstance(data.get("orchestrator"), Mapping) else {}
    batch, token_batch = orchestrator.get("batch_size"), orchestrator.get("token_batch_size")
    group = orchestrator.get("group_size", 1)
    if batch is not None and token_batch is not None:
        semantic("orchestrator.batch_size", "Set exactly one of batch_size or token_batch_size")
    elif token_batch is None:
        batch = ORCHESTRATOR_DEFAULT_BATCH_SIZE if batch is None else batch
        if _number(batch) and _number(group) and group >= 1 and batch % group != 0:
            semantic("orchestrator.batch_size", f"Batch size must be divisible by the number of samples per problem ({batch} % {group} != 0)")

    renderer = get_path(data, "orchestrator.renderer.name")
    if renderer in (None, "auto"):
        semantic(
            "orchestrator.renderer.name",
            "renderer 'auto' resolves through renderers.MODEL_RENDERER_MAP, which this schema does not hold; name the renderer",
        )

    seq_len = data.get("seq_len")
    orch_seq = orchestrator.get("seq_len", seq_len if seq_len is not None else ORCHESTRATOR_DEFAULT_SEQ_LEN)
    trainer_seq = get_path(data, "trainer.model.seq_len")
    trainer_seq = trainer_seq if trainer_seq is not None else (seq_len if seq_len is not None else TRAINER_DEFAULT_SEQ_LEN)
    if _number(trainer_seq) and _number(orch_seq) and trainer_seq < orch_seq:
        semantic("trainer.model.seq_len", f"Trainer model seq_len ({trainer_seq}) must be >= orchestrator seq_len ({orch_seq})")

    sources = get_path(data, "orchestrator.train.source")
    names: list[str] = []
    for index, source in enumerate(sources if isinstance(sources, list) else []):
        if not isinstance(source, Mapping):
            continue
        legacy_id = get_path(source, "legacy.id")
        legacy_id = None if legacy_id == "None" else legacy_id
        if legacy_id is None and "env" not in source:
            semantic(f"orchestrator.train.source[{index}]", 'no env configured: set legacy = { id = "<id>" } (v0) or a v1 env')
        name = source.get("name") or legacy_id or ""
        if name == "agg":
            semantic(f"orchestrator.train.source[{index}].name", 'Environment name "agg" is reserved for cross-env metric aggregation')
        names.append(str(name))
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        semantic("orchestrator.train.source", f"Duplicate training environment names: {duplicates}")

    for path in ("env_vars", "trainer.env_vars", "orchestrator.env_vars", "inference.env_vars"):
        env_vars = get_path(data, path)
        if isinstance(env_vars, Mapping):
            clobbered = sorted(PROTECTED_ENV_VARS & set(env_vars))
            if clobbered:
                semantic(path, f"env_vars cannot set launcher-managed vars {clobbered}")
            for key, value in env_vars.items():
                if not isinstance(value, str):
                    semantic(f"{path}.{key}", "Input should be a valid string")

    if get_path(data, "wandb.offline") is True:
        semantic("wandb.offline", "wandb.offline = true is not supported by the rl entrypoint")

    broadcast = get_path(data, "weight_broadcast.type")
    if get_path(data, "trainer.model.lora") not in (None, "None") and broadcast in ("nccl", "nixl"):
        semantic("weight_broadcast.type", "LoRA training is not yet supported with in-memory weight broadcast; use 'filesystem'")
    return problems


def rl_config_problems(data: Mapping[str, Any]) -> list[SchemaProblem]:
    """Schema problems first; the cross-field rules only when the schema holds (as pydantic orders them)."""
    problems = node_problems(RL, dict(data), "")
    return problems if problems else semantic_problems(data)


def schema_paths(spec: Node = RL, prefix: str = "") -> dict[str, str]:
    """Every held key path with a short type description (for docs and tests)."""
    out: dict[str, str] = {}
    if isinstance(spec, Table):
        for key, child in spec.fields.items():
            path = _join(prefix, key)
            out[path] = _describe(child)
            out.update(schema_paths(child, path))
    elif isinstance(spec, Tagged):
        for tag, variant in spec.variants.items():
            out.update(schema_paths(variant, f"{prefix}<{spec.tag}={tag}>"))
    elif isinstance(spec, ArrayOf):
        out.update(schema_paths(spec.item, f"{prefix}[]"))
    return out


def _describe(spec: Node) -> str:
    if isinstance(spec, Value):
        text = spec.kind + (f" in {list(spec.choices)}" if spec.choices else "")
        return text + (" | None" if spec.optional else "")
    if isinstance(spec, Table):
        return "table" + (" | None" if spec.optional else "")
    if isinstance(spec, Tagged):
        return f"table tagged by {spec.tag}: {list(spec.variants)}"
    if isinstance(spec, ArrayOf):
        return "array of tables"
    return "unheld"


__all__ = [
    "RL",
    "ArrayOf",
    "Node",
    "SchemaProblem",
    "Table",
    "Tagged",
    "Unheld",
    "Value",
    "get_path",
    "node_problems",
    "rl_config_problems",
    "schema_paths",
    "semantic_problems",
]

