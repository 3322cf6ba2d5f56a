"""Config models of the `local` backends: GRPO inner jobs and scoring on this machine's CPU, the local torch policy and its update."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, Literal

from pydantic import Field

from schemas.backend_config import AgentBackendConfig, BackendConfig, EvalBackendConfig, OuterBackendConfig, StageName, TrainBackendConfig


class LocalTrainBackend(TrainBackendConfig):
    """Real GRPO on the local CPU: each inner job is a detached trainer process, submitted then polled."""

    type: Literal["local"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.local.train:LocalTrain"
    planner: ClassVar[str] = "metarl.backends.local.plan:train_plan"
    weights: ClassVar[str] = "local"
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

    def combination_problem(self, backends: Mapping[StageName, BackendConfig]) -> str | None:
        """A scorer of local stand-in models (local, vllm) must build them at this backend's scale."""
        scale = getattr(backends["eval"], "model_scale", None)
        if scale is not None and scale != self.model_scale:
            return "backends.eval.model_scale must equal backends.train.model_scale (both score the same base models)"
        return None


class LocalEvalBackend(EvalBackendConfig):
    """Real hidden-eval scoring on the local CPU (torch greedy generation, or pass@k with a seed)."""

    type: Literal["local"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.local.train:LocalEval"
    planner: ClassVar[str] = "metarl.backends.local.plan:eval_plan"
    scores: ClassVar[frozenset[str]] = frozenset({"local"})
    model_scale: float = Field(default=1.0, gt=0.0, le=10.0, description="Must match the train backend's model_scale")
    model_cache_dir: str | None = Field(default=None, max_length=4096, description="Base-model cache")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of pass@k sampling")


class LocalAgentBackend(AgentBackendConfig):
    """The local trainer-agent policy: a small torch policy writing jobs in a compact job language."""

    type: Literal["local"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.local.agent:LocalAgent"
    planner: ClassVar[str] = "metarl.backends.local.plan:agent_plan"
    temperature: float = Field(default=1.0, gt=0.0, le=5.0, description="Sampling temperature of the policy")
    init_seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the untrained policy's weights")
    prior_default_bias: float = Field(
        default=3.0, ge=0.0, le=20.0, description="Initial logit bonus of `default` tokens: how strongly the untrained policy leaves settings to defaults"
    )
    exploration_floor: float = Field(
        default=0.0,
        ge=0.0,
        le=0.5,
        description="Share of each job slot's probability spread evenly over its allowed choices, whatever the policy learned (0 = none): keeps every choice tried",
    )

    def combination_problem(self, backends: Mapping[StageName, BackendConfig]) -> str | None:
        """The local policy and its update come together."""
        return local_pair_problem(backends)


class LocalOuterBackend(OuterBackendConfig):
    """Importance-sampling GRPO update of the local policy with Adam (torch on the CPU)."""

    type: Literal["local"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.local.agent:LocalOuter"
    planner: ClassVar[str] = "metarl.backends.local.plan:outer_plan"
    normalize_std: bool = Field(default=False, description="Divide group-relative advantages by the group's std")
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0, description="Gradient-norm clip of the outer step")
    entropy_coef: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Entropy bonus of the outer step: weight of the policy's entropy over the job tokens against the importance-sampling term (0 = none)",
    )
    replay_batches: int = Field(
        default=0,
        ge=0,
        le=8,
        description="Batches of the previous outer steps that each step trains on again beside its own (importance-weighted against the"
        " policy that sampled them, ratios capped by outer.ratio_cap; 0 = each batch is used once)",
    )

    def combination_problem(self, backends: Mapping[StageName, BackendConfig]) -> str | None:
        """The local policy and its update come together."""
        return local_pair_problem(backends)

    def saved_state_problem(self, fetch_state: Callable[[], str]) -> str | None:
        """The saved policy must load in this code (its job-language vocabulary and sizes): a state of another version of
        the job language cannot sample jobs here."""
        from metarl.policy.local_policy import state_file_problem

        problem = state_file_problem(fetch_state())
        if problem is None:
            return None
        return (
            f"its saved local policy state does not load in this code ({problem}), which cannot sample jobs with it. "
            "Run the code the run was started with, or start a new run (`metarl run CONFIG --new`)"
        )


def local_pair_problem(backends: Mapping[StageName, BackendConfig]) -> str | None:
    """Why the agent and outer backends are not both local or both something else (None: they are)."""
    if isinstance(backends["agent"], LocalAgentBackend) != isinstance(backends["outer"], LocalOuterBackend):
        return "backends.agent and backends.outer must both be `local` (the outer update trains the agent's policy) or neither"
    return None


CONFIGS = (LocalAgentBackend, LocalTrainBackend, LocalEvalBackend, LocalOuterBackend)
