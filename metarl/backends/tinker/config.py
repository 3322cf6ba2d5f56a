"""Config models of the `tinker` backends: the trainer agent as an LLM on Tinker and its LoRA update."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.backend_config import AgentBackendConfig, BackendConfig, OuterBackendConfig, StageName
from schemas.config_guards import credential_free, hide_url_credentials, refuse_secrets

TINKER_API_KEY_ENV = "TINKER_API_KEY"
"""The only place the Tinker API key is read from (never the config, records or logs)."""

TinkerRendererName = Literal["qwen3", "qwen3_disable_thinking", "qwen3_instruct", "qwen3_5", "qwen3_5_disable_thinking"]
TINKER_URL_FIX = f"remove the userinfo (and any key parameter) from the URL: the Tinker API key is read only from the {TINKER_API_KEY_ENV} environment variable"

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


class TinkerTable(BackendConfig):
    """What the two Tinker tables share: no API key in them, no credentials in `base_url`, and they come together."""

    def combination_problem(self, backends: Mapping[StageName, BackendConfig]) -> str | None:
        """The Tinker agent and the Tinker update come together, on one Tinker service."""
        return tinker_pair_problem(backends)

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: object) -> object:
        return refuse_secrets(hide_url_credentials(data, {"base_url": False}), TINKER_API_KEY_ENV, "the Tinker API key")

    @field_validator("base_url", mode="before", check_fields=False)
    @classmethod
    def _no_url_credentials(cls, value: object) -> object:
        return credential_free(value, user_allowed=False, fix=TINKER_URL_FIX)


class TinkerAgentBackend(TinkerTable, AgentBackendConfig):
    """The trainer agent as an LLM on Tinker: snapshot sampling client per policy version, chat renderer, tool calls."""

    type: Literal["tinker"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.tinker.agent:TinkerAgent"
    planner: ClassVar[str] = "metarl.backends.tinker.plan:agent_plan"
    api_key_env: ClassVar[str | None] = TINKER_API_KEY_ENV
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


class TinkerOuterBackend(TinkerTable, OuterBackendConfig):
    """GRPO of the Tinker LoRA policy with a clipped importance weight: forward_backward, Adam optim_step, save_state every step."""

    type: Literal["tinker"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.tinker.outer:TinkerOuter"
    planner: ClassVar[str] = "metarl.backends.tinker.plan:outer_plan"
    api_key_env: ClassVar[str | None] = TINKER_API_KEY_ENV
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

    def saved_state_ttl(self, version: int, max_outer_steps: int) -> int | None:
        """Seconds a version's saved state and sampler weights live on Tinker (None: kept); the run's last version has its own."""
        return self.final_checkpoint_ttl_s if version >= max_outer_steps else self.checkpoint_ttl_s

    def resume_problem(self, version: int, saved_at: dt.datetime, now: dt.datetime, max_outer_steps: int) -> str | None:
        """The state of ``version`` has expired on Tinker: the run cannot continue from it."""
        ttl = self.saved_state_ttl(version, max_outer_steps)
        if ttl is None or now < saved_at + dt.timedelta(seconds=ttl):
            return None
        expired = saved_at + dt.timedelta(seconds=ttl)
        return (
            f"policy version {version}'s saved state on Tinker expired at {expired:%Y-%m-%d %H:%M} UTC "
            f"(saved {saved_at:%Y-%m-%d %H:%M} UTC, backends.outer.checkpoint_ttl_s = {ttl} s): this run cannot continue from it. "
            "Start a new run (its first version is the base model), and give a run you may pause longer a larger checkpoint_ttl_s"
        )


CONFIGS = (TinkerAgentBackend, TinkerOuterBackend)


def tinker_pair_problem(backends: Mapping[StageName, BackendConfig]) -> str | None:
    """Why the agent and outer backends are not a Tinker pair that can work together (None: they are, or neither is Tinker)."""
    agent, outer = backends["agent"], backends["outer"]
    if isinstance(agent, TinkerAgentBackend) != isinstance(outer, TinkerOuterBackend):
        return "backends.agent and backends.outer must both be `tinker` (the outer update trains the agent's LoRA policy) or neither"
    if isinstance(agent, TinkerAgentBackend) and isinstance(outer, TinkerOuterBackend) and agent.base_url != outer.base_url:
        return "backends.outer.base_url must equal backends.agent.base_url (the agent samples the weights the outer update saves)"
    return None
