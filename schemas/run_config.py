"""Run config: backends (chosen by `type`), window, groups, staleness, retry caps, reward weights, budgets."""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import StrictModel
from schemas.task_spec import IDENTIFIER
from schemas.urls import credentials_problem, without_credentials


class SimDuration(StrictModel):
    """Lognormal duration of a simulated stage, in simulated-cloud seconds."""

    median_s: float = Field(default=0.2, ge=0.0, le=7 * 24 * 3600, description="Median duration in seconds")
    sigma: float = Field(default=0.5, ge=0.0, le=5.0, description="Lognormal sigma (0 = always the median)")
    max_s: float = Field(default=30.0, ge=0.0, le=7 * 24 * 3600, description="Upper clamp of one duration")

    @model_validator(mode="after")
    def _median_within_clamp(self) -> SimDuration:
        if self.median_s > self.max_s:
            raise PydanticCustomError(
                "duration_range",
                "median_s {median} is above max_s {max}: every duration would be clamped to max_s",
                {
                    "median": self.median_s,
                    "max": self.max_s,
                    "fix": f"make median_s at most max_s (raise max_s to {self.median_s:g} or more, or lower median_s)",
                },
            )
        return self


class SimAgentBackend(StrictModel):
    """SIMULATOR of a trainer agent: writes real job.toml text, some of it invalid on purpose."""

    type: Literal["sim"] = Field(description="Backend kind")
    duration: SimDuration = Field(default_factory=SimDuration, description="Time one agent attempt takes")
    invalid_rate: float = Field(default=0.3, ge=0.0, le=1.0, description="Chance an untrained simulated agent writes an invalid job")
    invalid_decay: float = Field(default=0.8, ge=0.0, le=1.0, description="invalid_rate multiplier per policy version")
    tokens_mean: int = Field(default=1500, ge=1, le=10_000_000, description="Mean policy tokens per attempt")
    usd_per_million_tokens: float = Field(default=0.0, ge=0.0, le=1000.0, description="Simulated token price")


class SimTrainBackend(StrictModel):
    """SIMULATOR of a GPU cloud running inner jobs: durations, failures, prices; never real training."""

    type: Literal["sim"] = Field(description="Backend kind")
    duration: SimDuration = Field(default_factory=lambda: SimDuration(median_s=0.5), description="Inner job duration")
    failure_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="Chance a launched job fails")
    capacity_error_rate: float = Field(default=0.0, ge=0.0, le=1.0, description="Chance a launch hits a capacity error")
    usd_per_hour: float = Field(default=0.88, ge=0.0, le=1000.0, description="Simulated price of one pod (2x A40) per hour")
    max_concurrent_jobs: int = Field(default=16, ge=1, le=10_000, description="Simulated pods available at once")
    poll_interval_s: float = Field(default=0.2, ge=0.01, le=3600, description="Seconds between polls of a running job")


class SimEvalBackend(StrictModel):
    """SIMULATOR of the hidden-eval scorer: scores derived from the job with seeded noise."""

    type: Literal["sim"] = Field(description="Backend kind")
    duration: SimDuration = Field(default_factory=lambda: SimDuration(median_s=0.1), description="Eval duration")
    noise: float = Field(default=0.03, ge=0.0, le=1.0, description="Std-dev of score noise")


class SimOuterBackend(StrictModel):
    """SIMULATOR of the outer policy update: bumps the version and records the batch statistics."""

    type: Literal["sim"] = Field(description="Backend kind")
    duration: SimDuration = Field(default_factory=lambda: SimDuration(median_s=0.1), description="Update duration")


class LocalTrainBackend(StrictModel):
    """Real GRPO on the local CPU: each inner job is a detached trainer process, submitted then polled."""

    type: Literal["local"] = Field(description="Backend kind")
    max_concurrent_jobs: int = Field(default=1, ge=1, le=64, description="Trainer processes at once (the usable cores are split between them)")
    torch_threads_per_job: int | None = Field(
        default=None, ge=1, le=1024, description="Torch threads of each trainer; default: usable cores // max_concurrent_jobs, at least 1"
    )
    poll_interval_s: float = Field(default=1.0, ge=0.05, le=600, description="Seconds between polls of a running job")
    model_scale: float = Field(default=1.0, gt=0.0, le=10.0, description="Pretraining scale of the base models (tests use less)")
    model_cache_dir: str | None = Field(default=None, max_length=4096, description="Base-model cache (default METARL_CACHE_DIR or ~/.cache/metarl/models)")
    host_silence_s: float = Field(
        default=60.0,
        ge=5.0,
        le=86_400.0,
        description="A job whose train host has not polled it for this long is presumed lost with its host and started again by the train host that polls it",
    )


class LocalEvalBackend(StrictModel):
    """Real hidden-eval scoring on the local CPU (torch greedy generation, or pass@k with a seed)."""

    type: Literal["local"] = Field(description="Backend kind")
    model_scale: float = Field(default=1.0, gt=0.0, le=10.0, description="Must match the train backend's model_scale")
    model_cache_dir: str | None = Field(default=None, max_length=4096, description="Base-model cache")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of pass@k sampling")


VLLM_EXTRA_FIX = "install the GPU extra on the GPU eval host: pip install -e .[gpu]"
"""How to get vllm where `backends.eval.type = "vllm"` runs (it is not installed by default)."""


class VllmEvalBackend(StrictModel):
    """Hidden-eval scoring with vLLM on a GPU eval worker: the local scorer's prompts, stop tokens and graders, another engine.

    Needs the `gpu` extra (`pip install -e .[gpu]`) on the host that runs the eval pool. Pass@1 is
    greedy; pass@k samples k completions per item at temperature 1 with per-request seeds.
    """

    type: Literal["vllm"] = Field(description="Backend kind")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weight and activation dtype in vLLM (float32 matches the CPU scorer most closely)"
    )
    gpu_memory_utilization: float = Field(default=0.85, gt=0.0, le=0.99, description="Fraction of GPU memory vLLM may claim (weights plus KV cache)")
    max_model_len: int | None = Field(
        default=None, ge=16, le=1_048_576, description="Context length of the engine (default: the longest eval prompt plus the eval's completion budget)"
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs one model is sharded over")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the engine and of pass@k sampling")
    timeout_s: float = Field(default=1800.0, ge=10.0, le=86_400.0, description="Longest one scoring subprocess may run (engine start included)")
    model_scale: float = Field(default=1.0, gt=0.0, le=10.0, description="Pretraining scale of the local base models it scores; must match the train backend's")
    model_cache_dir: str | None = Field(default=None, max_length=4096, description="Base-model cache (default METARL_CACHE_DIR or ~/.cache/metarl/models)")


class PodVllmEvalBackend(StrictModel):
    """Hidden-eval scoring with vLLM on the inner job's own Runpod pod, right after training there (needs `backends.train.type = "runpod"`).

    The weights never leave the pod to be scored, and the pod's eval seconds are billed like its
    training seconds (ledger source `runpod_eval`, to the billing interval). The hidden prompts reach
    the pod only after the agent's code stopped there, and are deleted after scoring; the answers never
    reach it (workers grade the completions). The base model is scored on a job's pod the first time a
    (task, model) needs it, then cached. The separate GPU eval pool (`type = "vllm"`) remains the other
    choice.
    """

    type: Literal["pod_vllm"] = Field(description="Backend kind")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(default="bfloat16", description="Weight and activation dtype in vLLM")
    gpu_memory_utilization: float = Field(
        default=0.85, gt=0.0, le=0.99, description="Fraction of one pod GPU vLLM may claim (training has ended: the GPUs are free)"
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=1_048_576, description="Context length of the engine (default: the longest eval prompt plus the eval's completion budget)"
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the engine and of pass@k sampling")
    chat: bool = Field(
        default=True,
        description="Chat-format the hidden prompts with the model's chat template, thinking off, as prime-rl trained on them (plain text when the model has none)",
    )
    eval_timeout_s: float = Field(
        default=1800.0,
        ge=10.0,
        le=86_400.0,
        description="Longest wait from publishing the eval request to the pod's result (engine starts included) before the job fails",
    )
    engine_start_s: float = Field(default=120.0, ge=0.0, le=3600.0, description="Seconds to start vLLM on one model, for the dry run's estimate only")
    tokens_per_s: float = Field(
        default=2000.0, gt=0.0, le=1e7, description="Prompt plus generated tokens one engine handles per second, for the dry run's estimate only"
    )


class LocalAgentBackend(StrictModel):
    """The local trainer-agent policy: a small torch policy writing jobs in a compact job language."""

    type: Literal["local"] = Field(description="Backend kind")
    temperature: float = Field(default=1.0, gt=0.0, le=5.0, description="Sampling temperature of the policy")
    init_seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the untrained policy's weights")
    prior_default_bias: float = Field(
        default=3.0, ge=0.0, le=20.0, description="Initial logit bonus of `default` tokens: how strongly the untrained policy leaves settings to defaults"
    )


class LocalOuterBackend(StrictModel):
    """Importance-sampling GRPO update of the local policy with Adam (torch on the CPU)."""

    type: Literal["local"] = Field(description="Backend kind")
    normalize_std: bool = Field(default=False, description="Divide group-relative advantages by the group's std")
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0, description="Gradient-norm clip of the outer step")


TINKER_API_KEY_ENV = "TINKER_API_KEY"
"""The only place the Tinker API key is read from (never the config, records or logs)."""

TinkerRendererName = Literal["qwen3", "qwen3_disable_thinking", "qwen3_instruct", "qwen3_5", "qwen3_5_disable_thinking"]
_SECRET_KEYS = frozenset({"api_key", "apikey", "tinker_api_key", "key", "token", "secret"})


def _refuse_secrets(data: object) -> object:
    """Reject an API key written into a Tinker backend table, without echoing it.

    The value is overwritten in the parsed mapping before the error is raised: pydantic keeps the
    input next to each error, and a logged ValidationError must not carry the key.
    """
    if isinstance(data, dict):
        found = sorted(str(key) for key in data if str(key).lower().replace("-", "_") in _SECRET_KEYS)
        for key in list(data):
            if str(key) in found:
                data[key] = "(redacted)"
        if found:
            raise ValueError(
                f"`{found[0]}` must not be in the config: the Tinker API key is read only from the {TINKER_API_KEY_ENV} "
                f"environment variable; remove `{found[0]}` and export {TINKER_API_KEY_ENV}"
            )
    return data


class _RefusedUrl:
    """Stands in the parsed mapping for a URL that carries credentials, so that no error, repr or log shows the URL."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return "'(a URL with credentials, not shown)'"


def _hide_url_credentials(data: object, fields: dict[str, bool]) -> object:
    """Replace each URL field (name -> whether a user name alone is allowed) that carries credentials by a :class:`_RefusedUrl`.

    A before-validator of the model: pydantic keeps the input next to each error, and a logged
    ValidationError must not carry the key; the field's own validator (:func:`_credential_free`) then refuses it.
    """
    if isinstance(data, dict):
        for name, user_allowed in fields.items():
            value = data.get(name)
            if isinstance(value, str):
                what = credentials_problem(value, user_allowed=user_allowed)
                if what is not None:
                    data[name] = _RefusedUrl(what)
    return data


def _credential_free(value: object, *, user_allowed: bool, fix: str) -> object:
    """``value`` unchanged, or a ``url_credentials`` error naming what the URL carries and the fix (an environment variable)."""
    what = value.what if isinstance(value, _RefusedUrl) else credentials_problem(value, user_allowed=user_allowed) if isinstance(value, str) else None
    if what is not None:
        raise PydanticCustomError(
            "url_credentials",
            "the URL carries {what}: credentials never go in a config value (the run config is stored with the run and URLs are logged)",
            {"what": what, "fix": fix},
        )
    return value


TINKER_URL_FIX = f"remove the userinfo (and any key parameter) from the URL: the Tinker API key is read only from the {TINKER_API_KEY_ENV} environment variable"
DATABASE_URL_FIX = (
    "remove the password from the URL: put the whole URL in the METARL_DATABASE_URL environment variable instead (it wins over [services]), "
    "or give PostgreSQL the password through PGPASSWORD or ~/.pgpass"
)
BROKER_URL_FIX = "remove the password from the URL: put the whole URL in the METARL_BROKER_URL environment variable instead (it wins over [services])"
ARTIFACTS_URL_FIX = "remove the credentials from the URL: give the store's keys in its environment (for s3://, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"


TINKER_CONTEXT_WINDOWS: dict[str, int] = {
    # Qwen3-30B-A3B's native window (the cookbook's recipes train it at 32768); the others as
    # tinker-cookbook 0.6.1 tinker_cookbook/eval/benchmarks/_types.py lists their `context_window`.
    "Qwen/Qwen3-30B-A3B": 32_768,
    "Qwen/Qwen3-8B": 32_768,
    "Qwen/Qwen3.5-4B": 65_536,
    "Qwen/Qwen3.5-9B": 65_536,
    "Qwen/Qwen3.5-9B-Base": 65_536,
    "Qwen/Qwen3.5-35B-A3B-Base": 65_536,
    "Qwen/Qwen3.5-397B-A17B": 65_536,
    "Qwen/Qwen3.6-27B": 65_536,
    "Qwen/Qwen3.6-35B-A3B": 65_536,
}
"""Context window (prompt plus sampled tokens) of the Tinker base models whose window we know; the service refuses more."""


class TinkerAgentBackend(StrictModel):
    """The trainer agent as an LLM on Tinker: snapshot sampling client per policy version, chat renderer, tool calls."""

    type: Literal["tinker"] = Field(description="Backend kind")
    base_model: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*(/[A-Za-z0-9][A-Za-z0-9._\-]*)?$",
        description="Tinker base model of the LoRA policy, e.g. Qwen/Qwen3-30B-A3B",
    )
    renderer: TinkerRendererName = Field(description="Chat format of the base model (Qwen markup; qwen3_5 writes XML-style tool calls)")
    max_turns: int = Field(default=24, ge=1, le=500, description="Sampled turns per attempt before it ends without submit()")
    max_tokens_per_turn: int = Field(default=4096, ge=16, le=65_536, description="Most tokens sampled in one turn (capped each turn at the context left)")
    max_context_tokens: int | None = Field(
        default=None,
        ge=1024,
        le=262_144,
        validate_default=True,
        description="Most tokens in one attempt's conversation (prompt, turns, tool results); default and upper bound: the base model's context window (TINKER_CONTEXT_WINDOWS); required for a model not listed there",
    )
    max_observation_chars: int = Field(default=8000, ge=256, le=1_000_000, description="Tool results longer than this are cut before they reach the model")
    max_tool_calls_per_turn: int = Field(default=8, ge=1, le=100, description="Tool calls run from one reply; later ones are refused")
    temperature: float = Field(default=1.0, gt=0.0, le=2.0, description="Sampling temperature (behaviour logprobs are at this temperature)")
    usd_per_million_prompt_tokens: float = Field(
        ge=0.0,
        le=1000.0,
        description="Tinker price of prefilled prompt tokens that miss the prefix cache, from its price list (each turn re-sends the whole conversation)",
    )
    usd_per_million_cached_prompt_tokens: float = Field(
        ge=0.0,
        le=1000.0,
        description="Tinker price of prompt tokens the service reports as prefix-cache hits (its cached prefill price); at most usd_per_million_prompt_tokens",
    )
    usd_per_million_sample_tokens: float = Field(ge=0.0, le=1000.0, description="Tinker price of sampled tokens, from its price list")
    base_url: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://[^\s]+$", description="Tinker API URL (default: TINKER_BASE_URL, then the SDK's)"
    )
    timeout_s: float = Field(default=900.0, ge=1.0, le=86_400.0, description="Longest wait for one Tinker request")

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: object) -> object:
        return _refuse_secrets(_hide_url_credentials(data, {"base_url": False}))

    @field_validator("base_url", mode="before")
    @classmethod
    def _no_url_credentials(cls, value: object) -> object:
        return _credential_free(value, user_allowed=False, fix=TINKER_URL_FIX)

    @field_validator("max_context_tokens")
    @classmethod
    def _fits_the_models_window(cls, value: int | None, info: Any) -> int:
        model = info.data.get("base_model")
        if model is None:
            return value or 1024  # base_model itself is invalid and reported
        window = TINKER_CONTEXT_WINDOWS.get(model)
        if value is None:
            if window is None:
                raise PydanticCustomError(
                    "missing",
                    "base model {model} is not in the known context windows: set max_context_tokens to at most its context window "
                    "(tinker.RestClient().get_server_capabilities() lists each model's max_context_length)",
                    {"model": model},
                )
            value = window
        elif window is not None and value > window:
            raise PydanticCustomError(
                "less_than_equal",
                "{value} tokens do not fit {model}'s {le}-token context window (the service refuses a prompt plus max_tokens beyond it)",
                {"value": value, "model": model, "le": window},
            )
        per_turn = info.data.get("max_tokens_per_turn")
        if per_turn is not None and per_turn >= value:
            raise ValueError(f"max_tokens_per_turn ({per_turn}) leaves no room for the prompt in {value} tokens; lower max_tokens_per_turn below {value}")
        return value

    @field_validator("usd_per_million_cached_prompt_tokens")
    @classmethod
    def _cached_is_not_dearer(cls, value: float, info: Any) -> float:
        full = info.data.get("usd_per_million_prompt_tokens")
        if full is not None and value > full:
            raise PydanticCustomError("less_than_equal", "the cached prompt price is above the prompt price {le}", {"le": full})
        return value

    def context_window(self) -> int:
        """``max_context_tokens`` as validated: the validator puts the base model's window in place of None."""
        if self.max_context_tokens is None:
            raise ValueError("backends.agent.max_context_tokens was never validated: build the config with model_validate")
        return self.max_context_tokens


CHECKPOINT_TTL_S = 7 * 86_400
"""Expiry of each version's saved state and sampler weights: the 7 days of tinker-cookbook 0.6.1's periodic checkpoints (rl/train.py `ttl_seconds`)."""


class TinkerOuterBackend(StrictModel):
    """GRPO of the Tinker LoRA policy with a clipped importance weight: forward_backward, Adam optim_step, save_state every step."""

    type: Literal["tinker"] = Field(description="Backend kind")
    lora_rank: int = Field(default=8, ge=1, le=512, description="LoRA rank of the trainer policy")
    loss: Literal["cispo"] = Field(
        default="cispo",
        description="Tinker's built-in cispo with clip_low_threshold 0 and clip_high_threshold outer.ratio_cap: the importance weight clipped, never zeroed (metarl.backends.tinker.outer)",
    )
    normalize_std: bool = Field(default=False, description="Divide group-relative advantages by the group's std")
    grad_clip_norm: float = Field(default=1.0, ge=0.0, le=1000.0, description="Gradient-norm clip of the Adam step (0 = none)")
    adam_beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="Adam beta1")
    adam_beta2: float = Field(default=0.95, ge=0.0, lt=1.0, description="Adam beta2")
    adam_eps: float = Field(default=1e-12, gt=0.0, le=1.0, description="Adam epsilon")
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="Decoupled weight decay of the Adam step")
    max_recoveries: int = Field(default=2, ge=0, le=10, description="Times one update recreates a failed training client from the last saved state")
    checkpoint_ttl_s: int = Field(
        default=CHECKPOINT_TTL_S,
        ge=3600,
        le=10 * 365 * 86_400,
        description="Expiry of every version's saved state and sampler weights (the SDK allows 1 hour to 10 years)",
    )
    final_checkpoint_ttl_s: int | None = Field(
        default=None,
        ge=3600,
        le=10 * 365 * 86_400,
        description="Expiry of the last version's (run.max_outer_steps) state and sampler weights (None = kept, as the cookbook keeps its final checkpoint)",
    )
    usd_per_million_train_tokens: float = Field(ge=0.0, le=1000.0, description="Tinker price of trained tokens, from its price list")
    base_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s]+$", description="Tinker API URL; must equal backends.agent.base_url")
    timeout_s: float = Field(default=1800.0, ge=1.0, le=86_400.0, description="Longest wait for one Tinker request")

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: object) -> object:
        return _refuse_secrets(_hide_url_credentials(data, {"base_url": False}))

    @field_validator("base_url", mode="before")
    @classmethod
    def _no_url_credentials(cls, value: object) -> object:
        return _credential_free(value, user_allowed=False, fix=TINKER_URL_FIX)


RUNPOD_API_KEY_ENV = "RUNPOD_API_KEY"
"""The only place the Runpod API key is read from (never the config, records, logs or pod environment)."""

_GPU_TYPE = r"^[A-Za-z0-9][A-Za-z0-9 ._\-]{0,63}$"


DEFAULT_STORAGE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
"""What an ``s3://`` artifact root needs on the pod (s3fs reads these)."""
STORAGE_ENV_REFUSED_PREFIXES = ("RUNPOD_", "TINKER_", "METARL_")


class RunpodTrainBackend(StrictModel):
    """Inner jobs as prime-rl runs on Runpod pods (2x A40 by default), submitted then polled.

    A warm pool of up to `max_pods` pods is reused across jobs; a watchdog terminates pods whose
    progress stops; pods nobody owns are reaped; every pod second is billed from the pod's costPerHr.
    The API key comes only from the RUNPOD_API_KEY environment variable of the train workers and
    the orchestrator (a key in this table is refused).
    """

    type: Literal["runpod"] = Field(description="Backend kind")
    image: str = Field(
        min_length=1,
        max_length=512,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@\-]*$",
        description="Pod image: prime-rl at the pinned tag plus our runner (docker/inner.Dockerfile)",
    )
    gpu_types: list[Annotated[str, Field(pattern=_GPU_TYPE)]] = Field(
        default_factory=lambda: ["NVIDIA A40", "NVIDIA RTX A6000", "NVIDIA L40S"],
        min_length=1,
        max_length=16,
        description="Runpod GPU type ids, best first; the next one is tried on a capacity error",
    )
    gpu_count: int = Field(
        default=2,
        ge=1,
        le=8,
        description="GPUs per pod, at least 2: half (rounded down) train, the rest serve vLLM rollouts (prime-rl needs one of each on the node)",
    )
    cloud_type: Literal["ALL", "SECURE", "COMMUNITY"] = Field(default="SECURE", description="Runpod cloud to rent from")
    container_disk_gb: int = Field(default=80, ge=10, le=4000, description="Container disk of a pod (image, model, checkpoints)")
    volume_gb: int = Field(default=0, ge=0, le=10_000, description="Pod volume (0 = none)")
    max_pods: int = Field(default=16, ge=1, le=1000, description="Most pods at once, busy and idle (the pool size P)")
    warm_pool_size: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="Idle pods kept for the next job instead of being terminated (the image's metarl.backends.runpod.pod.supervisor follows its pod's assignment file); 0 = a new pod per job",
    )
    idle_timeout_s: float = Field(default=300.0, ge=0.0, le=86_400.0, description="An idle pod unused this long is terminated")
    poll_interval_s: float = Field(default=30.0, ge=0.05, le=3600.0, description="Seconds between polls of a running job")
    startup_timeout_s: float = Field(default=1800.0, ge=1.0, le=86_400.0, description="Longest wait for a job's first progress (image pull, model download)")
    hang_timeout_s: float = Field(
        default=900.0, ge=1.0, le=86_400.0, description="A job whose progress (metrics.jsonl step) stops this long is killed by the watchdog"
    )
    max_restarts: int = Field(default=1, ge=0, le=10, description="Times a job moves to a new pod after a preemption or a hang before it fails")
    billing_interval_s: int = Field(
        default=60, ge=1, le=3600, description="Ledger granularity: one charge per pod per interval of pod seconds (the last one partial)"
    )
    api_timeout_s: float = Field(default=20.0, gt=0.0, le=300.0, description="Deadline of one Runpod API read or idempotent write")
    api_retries: int = Field(default=4, ge=1, le=50, description="Tries of one API call on transient errors (timeouts, 5xx) before the stage sees an error")
    api_backoff_s: float = Field(default=1.0, ge=0.0, le=120.0, description="First backoff between tries; doubles per try, at most 15 s")
    max_poll_api_errors: int = Field(
        default=10, ge=1, le=10_000, description="Polls in a row that cannot reach the API before the stage counts a transient failure"
    )
    capacity_cooldown_s: float = Field(default=60.0, ge=0.0, le=86_400.0, description="A GPU type that had no capacity is tried after the others for this long")
    reap_interval_s: float = Field(default=60.0, ge=0.0, le=86_400.0, description="Seconds between orphan-reaper passes of one worker process")
    orphan_grace_s: float = Field(default=600.0, ge=0.0, le=86_400.0, description="A pod of ours with no assignment record is reaped once it is this old")
    storage_env: list[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")]] = Field(
        default_factory=lambda: list(DEFAULT_STORAGE_ENV),
        max_length=32,
        description="Variables of the train worker's environment copied into each pod's so its runner can reach artifact storage (those unset are skipped; rl never sees credential-like ones)",
    )
    estimated_usd_per_gpu_hour: dict[Annotated[str, Field(pattern=_GPU_TYPE)], Annotated[float, Field(ge=0.0, le=1000.0)]] = Field(
        default_factory=dict,
        max_length=16,
        description="Price per GPU-hour by GPU type, for the dry run's estimate only (billing uses the pod's costPerHr); --usd-per-gpu-hour overrides it",
    )

    @field_validator("gpu_count")
    @classmethod
    def _trainer_and_inference_gpu(cls, count: int) -> int:
        if count < 2:
            raise ValueError(
                f"gpu_count = {count} cannot run prime-rl v0.8.0: `rl` puts the trainer and vLLM inference on separate GPUs of the "
                "node (num_train_gpus + num_infer_gpus <= gpus_per_node, at least one of each); set backends.train.gpu_count = 2 or more"
            )
        return count

    @field_validator("storage_env")
    @classmethod
    def _storage_env_is_not_ours(cls, names: list[str]) -> list[str]:
        refused = [name for name in names if name.startswith(STORAGE_ENV_REFUSED_PREFIXES)]
        if refused:
            raise ValueError(
                f"{refused[0]} is not a storage setting: the Runpod and Tinker keys and METARL_ settings never go to a pod; "
                f"list only the storage variables (e.g. {', '.join(DEFAULT_STORAGE_ENV[:2])})"
            )
        return names

    @field_validator("estimated_usd_per_gpu_hour")
    @classmethod
    def _priced_types_are_used(cls, prices: dict[str, float], info: Any) -> dict[str, float]:
        unknown = sorted(set(prices) - set(info.data.get("gpu_types") or []))
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of gpu_types; price only the GPU types listed there, spelled as there")
        return prices

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: object) -> object:
        if isinstance(data, dict):
            found = sorted(str(key) for key in data if str(key).lower().replace("-", "_") in _SECRET_KEYS | {"runpod_api_key"})
            for key in list(data):
                if str(key) in found:
                    data[key] = "(redacted)"
            if found:
                raise ValueError(
                    f"`{found[0]}` must not be in the config: the Runpod API key is read only from the {RUNPOD_API_KEY_ENV} "
                    f"environment variable; remove `{found[0]}` and export {RUNPOD_API_KEY_ENV}"
                )
        return data

    @model_validator(mode="after")
    def _pool_fits(self) -> RunpodTrainBackend:
        if self.warm_pool_size > self.max_pods:
            if "warm_pool_size" in self.model_fields_set:
                raise ValueError("warm_pool_size must be at most max_pods (idle pods count towards the pool)")
            self.warm_pool_size = self.max_pods
        if self.startup_timeout_s < self.poll_interval_s or self.hang_timeout_s < self.poll_interval_s:
            raise ValueError("startup_timeout_s and hang_timeout_s must be at least poll_interval_s, or the watchdog fires between two polls")
        return self


AgentBackend = Annotated[SimAgentBackend | LocalAgentBackend | TinkerAgentBackend, Field(discriminator="type")]
TrainBackend = Annotated[SimTrainBackend | LocalTrainBackend | RunpodTrainBackend, Field(discriminator="type")]
EvalBackend = Annotated[SimEvalBackend | LocalEvalBackend | VllmEvalBackend | PodVllmEvalBackend, Field(discriminator="type")]
OuterBackend = Annotated[SimOuterBackend | LocalOuterBackend | TinkerOuterBackend, Field(discriminator="type")]


class Backends(StrictModel):
    """One backend per stage."""

    agent: AgentBackend = Field(description="Trainer-agent backend")
    train: TrainBackend = Field(description="Inner-trainer backend")
    eval: EvalBackend = Field(description="Hidden-eval scorer backend")
    outer: OuterBackend = Field(description="Outer-update backend")


class RunSection(StrictModel):
    """Identity and length of the run."""

    name: str = Field(pattern=IDENTIFIER, description="Run name (used in logs and pod names)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the run")
    tasks: list[Annotated[str, Field(pattern=IDENTIFIER)]] = Field(
        min_length=1, max_length=256, description="Task ids, resolved as <task_specs_dir>/<id>.toml, each listed once"
    )
    task_specs_dir: str = Field(default="tasks_specs", min_length=1, max_length=4096, description="Folder of task specs, relative to the config file")
    max_outer_steps: int = Field(default=5, ge=1, le=1_000_000, description="Stop after this many outer updates")

    @field_validator("tasks")
    @classmethod
    def _each_task_once(cls, tasks: list[str]) -> list[str]:
        first: dict[str, int] = {}
        for index, task in enumerate(tasks):
            if task in first:
                raise PydanticCustomError(
                    "duplicate_task",
                    "task '{task}' is listed twice (entries {first} and {second})",
                    {"task": task, "first": first[task], "second": index, "fix": f"list {task!r} once"},
                )
            first[task] = index
        return tasks


class WindowConfig(StrictModel):
    """How much work is kept in flight."""

    in_flight: int = Field(default=8, ge=1, le=100_000, description="Episodes kept in flight (rounded up to whole groups)")
    tick_s: float = Field(default=0.5, ge=0.01, le=60, description="Orchestrator loop period in seconds")


class OuterConfig(StrictModel):
    """Grouping, batching and staleness of the outer update."""

    group_size: int = Field(default=4, ge=1, le=1024, description="Episodes per group (same task, same policy version)")
    groups_per_batch: int = Field(default=2, ge=1, le=10_000, description="Complete groups per outer update")
    max_steps_off_policy: int = Field(default=2, ge=0, le=1000, description="Drop groups sampled more than this many versions ago")
    stale_groups: Literal["drop", "resample"] = Field(default="drop", description="What to do with a group that is too stale")
    learning_rate: float = Field(default=1e-4, gt=0, le=1.0, description="Outer learning rate")
    ratio_cap: float = Field(default=2.0, ge=1.0, le=100.0, description="Truncation of the importance ratio")
    held_out_eval_every: int = Field(default=1, ge=1, le=100_000, description="Evaluate held-out tasks every K outer steps")
    held_out_group_size: int | None = Field(
        default=None, ge=1, le=1024, description="Episodes per held-out evaluation (None = group_size); larger groups measure held-out reward more precisely"
    )


class RetryConfig(StrictModel):
    """Retry caps and liveness timing."""

    max_probe_attempts: int = Field(default=3, ge=1, le=100, description="Agent submissions per episode before it ends unvalidated")
    max_stage_attempts: int = Field(default=3, ge=1, le=100, description="Infrastructure retries of one stage before the episode fails")
    lease_s: float = Field(default=30.0, ge=1.0, le=86_400, description="A claimed stage whose heartbeat is older than this is taken over")
    redispatch_after_s: float = Field(default=30.0, ge=1.0, le=86_400, description="Re-send a dispatched stage nobody claimed after this long")


class StageDeadlines(StrictModel):
    """Hard wall-clock limit of one task message per stage: a backend that hangs past it has its worker
    process killed and replaced; the stage is then retried (claim takeover) up to `retries.max_stage_attempts`.

    A train message is one submit or one poll, not the whole inner job (the backend's own caps bound that).
    """

    agent_s: float = Field(default=1800.0, ge=1.0, le=86_400, description="One agent attempt (policy sampling and tool calls)")
    probe_s: float = Field(default=600.0, ge=1.0, le=86_400, description="One probe of a submission")
    train_s: float = Field(default=600.0, ge=1.0, le=86_400, description="One submit or poll of an inner job")
    eval_s: float = Field(default=1800.0, ge=1.0, le=86_400, description="Scoring base and trained model on the hidden eval")
    outer_s: float = Field(default=3600.0, ge=1.0, le=86_400, description="One outer update")

    def for_queue(self, queue: str) -> float:
        """The limit of messages on `queue` (agent, probe, train, eval, outer)."""
        return float(getattr(self, f"{queue}_s"))


class EpisodeRewardWeights(StrictModel):
    """Weights of the episode reward (docs/architecture.md, "The reward"), the outer reward of one trainer-agent episode.

    Not the inner job's rollout reward: its component weights are `metarl.learning.grpo.RewardComponentWeights`."""

    job: float = Field(default=1.0, ge=0.0, le=100.0, description="Weight of the normalised hidden-eval improvement")
    validation: float = Field(default=0.2, ge=0.0, le=100.0, description="Weight of passing the probe early")
    efficiency: float = Field(default=0.05, ge=0.0, le=100.0, description="Weight of using few agent tokens")
    speed: float = Field(default=0.02, ge=0.0, le=100.0, description="Weight of fast training (only when the job improved)")
    validation_decay: float = Field(default=0.5, ge=0.0, le=1.0, description="Validation credit multiplier per extra attempt")
    token_scale: int = Field(default=4000, ge=1, le=10**9, description="Agent tokens at which efficiency credit is halved")

    @model_validator(mode="after")
    def _speed_is_small(self) -> EpisodeRewardWeights:
        if self.speed > 0.5 * self.job:
            raise ValueError("speed weight must be at most half the job weight, or a fast flat job can outscore real learning")
        return self


class BudgetConfig(StrictModel):
    """Dollar caps."""

    max_run_usd: float = Field(default=100.0, ge=0.0, le=10_000_000, description="Stop launching once the run has cost this much")
    max_job_usd: float = Field(default=5.0, ge=0.0, le=1_000_000, description="Stop an inner job once it has cost this much")
    on_cap: Literal["drain", "stop"] = Field(default="drain", description="At the run cap: let running jobs finish, or stop them")


class ServicesConfig(StrictModel):
    """Where the database and broker are (environment variables override; empty = embedded default)."""

    database_url: str | None = Field(
        default=None, max_length=4096, description="SQLAlchemy URL of PostgreSQL; a user name but no password (that goes in METARL_DATABASE_URL)"
    )
    broker_url: str | None = Field(default=None, max_length=4096, description="Celery broker URL (Redis); no password (that goes in METARL_BROKER_URL)")

    @model_validator(mode="before")
    @classmethod
    def _hide_credentials(cls, data: object) -> object:
        return _hide_url_credentials(data, {"database_url": True, "broker_url": True})

    @field_validator("database_url", mode="before")
    @classmethod
    def _no_database_password(cls, value: object) -> object:
        return _credential_free(value, user_allowed=True, fix=DATABASE_URL_FIX)

    @field_validator("broker_url", mode="before")
    @classmethod
    def _no_broker_password(cls, value: object) -> object:
        return _credential_free(value, user_allowed=True, fix=BROKER_URL_FIX)


class SandboxConfig(StrictModel):
    """Isolation of agent-written code (the probe and the local trainer's reward session; metarl/sandbox/isolation.py)."""

    min_isolation: Literal["full", "process"] = Field(
        default="full",
        description=(
            "Least isolation the deployment accepts for agent-written code: full = bubblewrap namespaces, read-only root, "
            "seccomp, rlimits; process = no namespaces (hosts that refuse them): Landlock, the same seccomp filter, the uid "
            "nobody under a root worker, rlimits (needs Linux 5.13+ with Landlock enabled). docs/security.md says what each guarantees"
        ),
    )


class ArtifactsConfig(StrictModel):
    """Where checkpoints, logs and workspaces go."""

    root: str = Field(default=".metarl/artifacts", min_length=1, max_length=4096, description="Local folder or fsspec URL (no password in it)")

    @model_validator(mode="before")
    @classmethod
    def _hide_credentials(cls, data: object) -> object:
        return _hide_url_credentials(data, {"root": True})

    @field_validator("root", mode="before")
    @classmethod
    def _no_root_password(cls, value: object) -> object:
        return _credential_free(value, user_allowed=True, fix=ARTIFACTS_URL_FIX)


class RunConfig(StrictModel):
    """A complete run configuration (`metarl run CONFIG`)."""

    @model_validator(mode="after")
    def _same_models_for_train_and_eval(self) -> RunConfig:
        train, evaluate = self.backends.train, self.backends.eval
        if isinstance(train, LocalTrainBackend) and isinstance(evaluate, (LocalEvalBackend, VllmEvalBackend)) and train.model_scale != evaluate.model_scale:
            raise ValueError("backends.eval.model_scale must equal backends.train.model_scale (both score the same base models)")
        return self

    run: RunSection
    backends: Backends
    window: WindowConfig = Field(default_factory=WindowConfig)
    outer: OuterConfig = Field(default_factory=OuterConfig)
    retries: RetryConfig = Field(default_factory=RetryConfig)
    deadlines: StageDeadlines = Field(default_factory=StageDeadlines)
    reward: EpisodeRewardWeights = Field(default_factory=EpisodeRewardWeights)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    services: ServicesConfig = Field(default_factory=ServicesConfig)
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    @model_validator(mode="after")
    def _pod_eval_needs_runpod_train(self) -> RunConfig:
        if isinstance(self.backends.eval, PodVllmEvalBackend) and not isinstance(self.backends.train, RunpodTrainBackend):
            raise ValueError(
                'backends.eval.type = "pod_vllm" scores on the inner job\'s Runpod pod: it needs backends.train.type = "runpod"; '
                'with another train backend use type = "local" or "vllm"'
            )
        return self

    @model_validator(mode="after")
    def _local_agent_needs_local_outer(self) -> RunConfig:
        if isinstance(self.backends.agent, LocalAgentBackend) != isinstance(self.backends.outer, LocalOuterBackend):
            raise ValueError("backends.agent and backends.outer must both be `local` (the outer update trains the agent's policy) or neither")
        return self

    @model_validator(mode="after")
    def _tinker_agent_needs_tinker_outer(self) -> RunConfig:
        agent, outer = self.backends.agent, self.backends.outer
        if isinstance(agent, TinkerAgentBackend) != isinstance(outer, TinkerOuterBackend):
            raise ValueError("backends.agent and backends.outer must both be `tinker` (the outer update trains the agent's LoRA policy) or neither")
        if isinstance(agent, TinkerAgentBackend) and isinstance(outer, TinkerOuterBackend) and agent.base_url != outer.base_url:
            raise ValueError("backends.outer.base_url must equal backends.agent.base_url (the agent samples the weights the outer update saves)")
        return self


STORED_URL_FIELDS: dict[tuple[str, ...], bool] = {
    ("services", "database_url"): True,
    ("services", "broker_url"): True,
    ("artifacts", "root"): True,
    ("backends", "agent", "base_url"): False,
    ("backends", "outer", "base_url"): False,
}
"""The URL fields of a stored run config (path -> whether a user name alone is allowed), as the validators above check them."""


def stored_without_credentials(data: dict[str, Any]) -> dict[str, Any]:
    """A stored run config (``runs.config``) with the credentials of its URL fields removed (pure): a run stored before
    such URLs were refused still loads, and its row can be rewritten without the secret."""
    changes: dict[tuple[str, ...], str] = {}
    for path, user_allowed in STORED_URL_FIELDS.items():
        parent: Any = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        value = parent.get(path[-1]) if isinstance(parent, dict) else None
        if isinstance(value, str) and (cleaned_url := without_credentials(value, user_allowed=user_allowed)) != value:
            changes[path] = cleaned_url
    if not changes:
        return data  # the usual case, on every stage's read of its run: nothing copied
    cleaned = copy.deepcopy(data)
    for path, value in changes.items():
        parent = cleaned
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
    return cleaned


def stored_run_config(data: dict[str, Any]) -> RunConfig:
    """The validated config of a stored run (see :func:`stored_without_credentials`)."""
    return RunConfig.model_validate(stored_without_credentials(data))
