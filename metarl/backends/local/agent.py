"""The `local` trainer agent and outer update: a small torch policy over the compact job language,
trained with importance-sampling GRPO. Policy states are files under `<artifacts>/policy/<run>/`, stored and read
through the run's artifact store (`metarl.artifact_store`)."""

from __future__ import annotations

import hashlib
import json
import tomllib
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from metarl.artifact_store import ArtifactStore
from metarl.backends.local.config import LocalAgentBackend, LocalOuterBackend
from metarl.backends.local.train import dataset_text
from metarl.graders import grader_for
from metarl.interfaces import (
    AgentSubmission,
    BackendServices,
    EpisodeContext,
    OuterBatchEpisode,
    OuterResult,
    PolicySample,
)
from schemas.backend_config import expect_config
from schemas.job import DEFAULT_MAX_TOKENS
from schemas.run_config import RunConfig

_POLICY_CACHE: OrderedDict[str, object] = OrderedDict()
POLICY_CACHE_SIZE = 4


def policy_key(run_id: str, version: int, attempt: str | None = None) -> str:
    """The store key of a policy version's state: `vNNNNN.pt` for the initial version, `vNNNNN-<attempt>.pt`
    for an update, so that an update taken over while it ran never overwrites the state of the
    attempt that published the version (the published reference is the one in policy_versions)."""
    name = f"v{version:05d}" if attempt is None else f"v{version:05d}-{attempt}"
    return f"policy/{run_id}/{name}.pt"


def saved_states(artifacts_root: str, run_id: str, version: int) -> list[Path]:
    """Every state saved for a version by any update attempt under a local root, published or not."""
    return sorted((Path(artifacts_root) / "policy" / run_id).glob(f"v{version:05d}-*.pt"))


def save_policy_state(policy: Any, artifacts_root: str, run_id: str, version: int, attempt: str | None = None) -> str:
    """Save a policy's state into the run's artifact store; its reference."""
    store = ArtifactStore(artifacts_root)
    key = policy_key(run_id, version, attempt)
    path = store.working_dir(key)
    policy.save_state(path)
    reference = store.put_file(path, key)
    if store.remote:
        path.unlink(missing_ok=True)
    return reference


def load_policy(state_uri: str, artifacts_root: str | None = None):
    """Load a saved policy version through the run's artifact store (cached per process: versions are immutable once saved)."""
    from metarl.policy.local_policy import LocalPolicy

    if state_uri in _POLICY_CACHE:
        _POLICY_CACHE.move_to_end(state_uri)
        return _POLICY_CACHE[state_uri]
    policy = LocalPolicy.from_state(ArtifactStore(artifacts_root or ".").file(state_uri))
    _POLICY_CACHE[state_uri] = policy
    while len(_POLICY_CACHE) > POLICY_CACHE_SIZE:
        _POLICY_CACHE.popitem(last=False)
    return policy


def sample_seed(episode_seed: int, attempt: int) -> int:
    digest = hashlib.sha256(f"{episode_seed}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


ENVIRONMENT_TEMPLATE = '''"""Reward of the job: the weighted components of [reward.components] (written by the local policy).

Task family %(family)s; completions of at most %(max_tokens)d tokens (one per character, plus the end token).
The components are the family's own graders (metarl_graders: metarl's graders module, importable here).
Weights as the local trainer applies them: negative ones of the positive components count as 0,
the length penalty always penalises, and correctness keeps weight 1 unless the job sets it.
"""

import metarl_graders

FAMILY = %(family_literal)s
GRADER = %(grader)s
MAX_TOKENS = %(max_tokens)d
COMPONENTS = metarl_graders.reward_components(FAMILY, MAX_TOKENS, GRADER)
WEIGHTS = %(weights)s


def reward(prompt, completion, answer):
    return sum(weight * COMPONENTS[name](prompt, completion, answer) for name, weight in WEIGHTS.items() if name in COMPONENTS)
'''


def effective_weights(weights: dict[str, float]) -> dict[str, float]:
    """The job's weights as the local trainer's built-in graders apply them (see compile_local_job):
    negative weights of the positive components count as 0, the length penalty's by magnitude, and
    a component the job leaves out keeps its built-in default (correctness 1, the others 0)."""
    from metarl.learning.grpo import RewardComponentWeights

    out = {name: float(field.default) for name, field in RewardComponentWeights.model_fields.items()}
    for name, weight in weights.items():
        if name == "length_penalty":
            out[name] = abs(float(weight))
        elif name in out:
            out[name] = max(0.0, float(weight))
    return out


def environment_source(weights: dict[str, float], family: str = "", max_tokens: int = DEFAULT_MAX_TOKENS, grader: Mapping[str, Any] | None = None) -> str:
    """The environment module for a job's reward components (the contract of metarl.workspace).

    Its ``reward`` gives the same training signal as the local trainer's built-in graders with the
    job's weights (:func:`metarl.learning.grpo.rollout_reward`): it imports the graders themselves
    (:mod:`metarl.graders`, as ``metarl_graders``) for the family's partial credit, exact match and
    format check, and the completion-length penalty for ``max_tokens`` (counted from the text: one
    token per character plus the end token, so a sampled ``<unk>``, which decoding drops, is the one
    case where the penalty differs from the built-in token count). ``grader`` is the family's grader
    mapping (written into the module as data; the built-in family's own when None).
    """
    return ENVIRONMENT_TEMPLATE % {
        "family": family or "(unknown)",
        "family_literal": repr(family),
        "grader": repr(json.loads(json.dumps(dict(grader if grader is not None else grader_for(family)), sort_keys=True))),
        "max_tokens": max(1, int(max_tokens)),
        "weights": json.dumps(effective_weights(weights), sort_keys=True),
    }


def rollout_max_tokens(parsed: dict) -> int:
    """The job's completion-token limit (the default when unset, or when the job does not validate)."""
    from pydantic import ValidationError

    from schemas.job import JobSpec

    try:
        return JobSpec.model_validate(parsed).resolved().max_tokens
    except ValidationError:
        return DEFAULT_MAX_TOKENS


def workspace_key(ctx: EpisodeContext) -> str:
    """The store key of an attempt's workspace folder (the agent's tools write its `files/` and transcript there)."""
    return f"workspaces/{ctx.run_id}/{ctx.episode_id}/{ctx.probe_attempt}"


def workspace_root(ctx: EpisodeContext) -> Path:
    """Where the agent builds the attempt's workspace on this host (its place under a local root, else a scratch folder)."""
    return ArtifactStore(ctx.artifacts_root).working_dir(workspace_key(ctx))


def write_workspace(ctx: EpisodeContext, job_toml: str, baseline: Callable[[str], float] | None = None) -> Path:
    """Render the sampled job into the attempt's workspace through the agent's own tools."""
    from metarl.learning.data_families import family_for
    from metarl.workspace import Workspace

    workspace = Workspace(workspace_root(ctx), ctx.task, feedback=ctx.feedback, baseline=baseline, train_seconds=ctx.train_seconds)
    workspace.write_file("job.toml", job_toml)
    parsed = _parse_job(job_toml)
    if parsed is not None:
        weights = {name: float(weight) for name, weight in parsed.get("reward", {}).get("components", {"correctness": 1.0}).items()}
        dataset = parsed.get("dataset", {})
        size = int(dataset.get("size", 1000))
        if 0 < size <= MAX_RENDERED_DATASET:
            workspace.write_file(
                str(dataset.get("path", "dataset.jsonl")), dataset_text(family_for(ctx.task), size, float(dataset.get("difficulty", 0.5)), ctx.seed)
            )
        module_source = environment_source(weights, ctx.task.family, rollout_max_tokens(parsed), family_for(ctx.task).grader)
        workspace.write_file(str(parsed.get("environment", {}).get("module", "environment.py")), module_source)
    workspace.submit()
    return workspace.files_dir


MAX_RENDERED_DATASET = 100_000


def _parse_job(job_toml: str) -> dict | None:
    try:
        return tomllib.loads(job_toml)
    except tomllib.TOMLDecodeError:
        return None


class LocalAgent:
    """Samples a job from the episode's policy version, conditioned on task, attempt and probe feedback."""

    name = "local"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> LocalAgent:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.agent, LocalAgentBackend))

    def __init__(self, config: LocalAgentBackend):
        self.config = config

    def run_attempt(self, ctx: EpisodeContext, baseline: Callable[[str], float] | None = None) -> AgentSubmission:
        import torch

        from metarl.policy.job_language import context_for_episode
        from metarl.policy.job_limits import job_limits

        if ctx.policy_state_uri is None:
            raise ValueError(f"policy version {ctx.policy_version} of run {ctx.run_id} has no saved state")
        torch.set_num_threads(1)
        policy = load_policy(ctx.policy_state_uri, ctx.artifacts_root)
        sampled = policy.sample(
            context_for_episode(ctx), seed=sample_seed(ctx.seed, ctx.probe_attempt), temperature=self.config.temperature, floor=self.config.exploration_floor
        )
        job_toml = sampled.render(seed=ctx.seed, limits=job_limits(ctx.task, ctx.train_seconds))
        workspace = write_workspace(ctx, job_toml, baseline)
        return AgentSubmission(
            job_toml=job_toml,
            agent_tokens=len(sampled.job_tokens),
            workspace_uri=str(workspace),
            sample=PolicySample(tokens=list(sampled.tokens), logprobs=list(sampled.logprobs), prompt_length=sampled.prompt_length),
        )


class LocalOuter:
    """One importance-sampling GRPO step per outer step, on its batch and (`replay_batches`) the batches of the steps before
    kept in the policy state; the new version is saved before it is used."""

    name = "local"
    simulated = False

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> LocalOuter:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.outer, LocalOuterBackend), expect_config(config.backends.agent, LocalAgentBackend))

    def __init__(self, config: LocalOuterBackend, agent: LocalAgentBackend):
        self.config = config
        self.agent = agent

    def initial_state(self, run_id: str, config: RunConfig) -> str:
        from metarl.policy.local_policy import LocalPolicy, PolicyConfig

        policy = LocalPolicy(PolicyConfig(init_seed=self.agent.init_seed, default_bias=self.agent.prior_default_bias))
        return save_policy_state(policy, config.artifacts.root, run_id, 0)

    def update(self, run_id: str, step: int, version: int, batch: list[OuterBatchEpisode], config: RunConfig, base_state_uri: str | None) -> OuterResult:
        import torch

        from metarl.domain.advantages import group_advantages
        from metarl.outer_update import build_datum, datum_from_record, datum_record, kept_batches, local_outer_step
        from metarl.policy.local_policy import LocalPolicy

        if base_state_uri is None:
            raise ValueError(f"policy version {version - 1} of run {run_id} has no saved state")
        torch.set_num_threads(1)
        policy = LocalPolicy.from_state(ArtifactStore(config.artifacts.root).file(base_state_uri))
        groups: dict[int, list[OuterBatchEpisode]] = {}
        for episode in batch:
            groups.setdefault(episode.group_id, []).append(episode)
        advantages = group_advantages([[e.reward for e in members] for members in groups.values()], normalize_std=self.config.normalize_std)
        datums = []
        for members, group_advantage in zip(groups.values(), advantages):
            for episode, advantage in zip(members, group_advantage):
                for sample in episode.samples:
                    datums.append(build_datum(sample.tokens[: sample.prompt_length], sample.tokens[sample.prompt_length :], sample.logprobs, advantage))
        replayed = [datum_from_record(record) for batch in policy.replay[: self.config.replay_batches] for record in batch]
        metrics = local_outer_step(
            policy,
            None,
            datums + replayed,
            ratio_cap=config.outer.ratio_cap,
            lr=config.outer.learning_rate,
            max_grad_norm=self.config.max_grad_norm,
            temperature=self.agent.temperature,
            floor=self.agent.exploration_floor,
            entropy_coef=self.config.entropy_coef,
        )
        metrics["replayed_datums"] = float(len(replayed))
        policy.replay = kept_batches([datum_record(datum) for datum in datums], policy.replay, self.config.replay_batches)
        state_uri = save_policy_state(policy, config.artifacts.root, run_id, version, attempt=uuid.uuid4().hex[:12])
        return OuterResult(state_uri=state_uri, metrics={key: float(value) for key, value in metrics.items()})
