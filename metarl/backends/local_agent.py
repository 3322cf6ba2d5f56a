"""The `local` trainer agent and outer update: a small torch policy over the compact job language,
trained with importance-sampling GRPO. Policy states are files under `<artifacts>/policy/<run>/`."""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from metarl.backends.base import (
    AgentSubmission,
    EpisodeContext,
    OuterBatchEpisode,
    OuterResult,
    PolicySample,
)
from metarl.backends.local import dataset_text
from schemas.run_config import LocalAgentBackend, LocalOuterBackend, RunConfig

_POLICY_CACHE: OrderedDict[str, object] = OrderedDict()
POLICY_CACHE_SIZE = 4


def policy_path(artifacts_root: str, run_id: str, version: int) -> Path:
    return Path(artifacts_root) / "policy" / run_id / f"v{version:05d}.pt"


def load_policy(state_uri: str):  # type: ignore[no-untyped-def]
    """Load a saved policy version (cached per process: versions are immutable once saved)."""
    from metarl.policy.local_policy import LocalPolicy

    if state_uri in _POLICY_CACHE:
        _POLICY_CACHE.move_to_end(state_uri)
        return _POLICY_CACHE[state_uri]
    policy = LocalPolicy.from_state(state_uri)
    _POLICY_CACHE[state_uri] = policy
    while len(_POLICY_CACHE) > POLICY_CACHE_SIZE:
        _POLICY_CACHE.popitem(last=False)
    return policy


def sample_seed(episode_seed: int, attempt: int) -> int:
    digest = hashlib.sha256(f"{episode_seed}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


ENVIRONMENT_TEMPLATE = '''"""Reward of the job: the weighted components of [reward.components] (written by the local policy)."""

import difflib


def correctness(prompt, completion, answer):
    return difflib.SequenceMatcher(None, completion.strip(), answer).ratio()


def exact(prompt, completion, answer):
    return 1.0 if completion.strip() == answer else 0.0


def well_formed(prompt, completion, answer):
    text = completion.strip()
    return 1.0 if text and len(text) <= 2 * len(answer) + 2 and "\\n" not in text else 0.0


def length_penalty(prompt, completion, answer):
    return -min(1.0, abs(len(completion.strip()) - len(answer)) / max(1, len(answer)))


COMPONENTS = {"correctness": correctness, "exact": exact, "format": well_formed, "length_penalty": length_penalty}
WEIGHTS = %s


def reward(prompt, completion, answer):
    return sum(weight * COMPONENTS[name](prompt, completion, answer) for name, weight in WEIGHTS.items() if name in COMPONENTS)
'''


def environment_source(weights: dict[str, float]) -> str:
    """The environment module for a job's reward components (the contract of metarl.workspace)."""
    return ENVIRONMENT_TEMPLATE % json.dumps(weights, sort_keys=True)


def workspace_root(ctx: EpisodeContext) -> Path:
    return Path(ctx.artifacts_root) / "workspaces" / ctx.run_id / str(ctx.episode_id) / str(ctx.probe_attempt)


def write_workspace(ctx: EpisodeContext, job_toml: str, baseline: Callable[[str], float] | None = None) -> Path:
    """Render the sampled job into the attempt's workspace through the agent's own tools."""
    from metarl.workspace import Workspace

    workspace = Workspace(workspace_root(ctx), ctx.task, feedback=ctx.feedback, baseline=baseline)
    workspace.write_file("job.toml", job_toml)
    parsed = _parse_job(job_toml)
    if parsed is not None:
        weights = {name: float(weight) for name, weight in parsed.get("reward", {}).get("components", {"correctness": 1.0}).items()}
        dataset = parsed.get("dataset", {})
        size = int(dataset.get("size", 1000))
        if 0 < size <= MAX_RENDERED_DATASET:
            workspace.write_file(str(dataset.get("path", "dataset.jsonl")), dataset_text(ctx.task.family, size, float(dataset.get("difficulty", 0.5)), ctx.seed))
        workspace.write_file(str(parsed.get("environment", {}).get("module", "environment.py")), environment_source(weights))
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

    def __init__(self, config: LocalAgentBackend):
        self.config = config

    def run_attempt(self, ctx: EpisodeContext, baseline: Callable[[str], float] | None = None) -> AgentSubmission:
        import torch

        from metarl.policy.job_language import context_for_episode

        if ctx.policy_state_uri is None:
            raise ValueError(f"policy version {ctx.policy_version} of run {ctx.run_id} has no saved state")
        torch.set_num_threads(1)
        policy = load_policy(ctx.policy_state_uri)
        sampled = policy.sample(context_for_episode(ctx), seed=sample_seed(ctx.seed, ctx.probe_attempt), temperature=self.config.temperature)
        job_toml = sampled.render(seed=ctx.seed)
        workspace = write_workspace(ctx, job_toml, baseline)
        return AgentSubmission(
            job_toml=job_toml,
            agent_tokens=len(sampled.job_tokens),
            workspace_uri=str(workspace),
            sample=PolicySample(tokens=list(sampled.tokens), logprobs=list(sampled.logprobs), prompt_length=sampled.prompt_length),
        )


class LocalOuter:
    """One importance-sampling GRPO step per outer step; the new version is saved before it is used."""

    name = "local"
    simulated = False

    def __init__(self, config: LocalOuterBackend, agent: LocalAgentBackend):
        self.config = config
        self.agent = agent

    def initial_state(self, run_id: str, config: RunConfig) -> str:
        from metarl.policy.local_policy import LocalPolicy, PolicyConfig

        path = policy_path(config.artifacts.root, run_id, 0)
        if not path.exists():
            LocalPolicy(PolicyConfig(init_seed=self.agent.init_seed)).save_state(path)
        return str(path)

    def update(
        self, run_id: str, step: int, version: int, batch: list[OuterBatchEpisode], config: RunConfig, base_state_uri: str | None
    ) -> OuterResult:
        import torch

        from metarl.outer_update import build_datum, group_advantages, local_outer_step
        from metarl.policy.local_policy import LocalPolicy

        if base_state_uri is None:
            raise ValueError(f"policy version {version - 1} of run {run_id} has no saved state")
        torch.set_num_threads(1)
        policy = LocalPolicy.from_state(base_state_uri)
        groups: dict[int, list[OuterBatchEpisode]] = {}
        for episode in batch:
            groups.setdefault(episode.group_id, []).append(episode)
        advantages = group_advantages([[e.reward for e in members] for members in groups.values()], normalize_std=self.config.normalize_std)
        datums = []
        for members, group_advantage in zip(groups.values(), advantages):
            for episode, advantage in zip(members, group_advantage):
                for sample in episode.samples:
                    datums.append(build_datum(sample.tokens[: sample.prompt_length], sample.tokens[sample.prompt_length :], sample.logprobs, advantage))
        metrics = local_outer_step(
            policy,
            None,
            datums,
            ratio_cap=config.outer.ratio_cap,
            lr=config.outer.learning_rate,
            max_grad_norm=self.config.max_grad_norm,
            temperature=self.agent.temperature,
        )
        path = policy_path(config.artifacts.root, run_id, version)
        policy.save_state(path)
        return OuterResult(state_uri=str(path), metrics={key: float(value) for key, value in metrics.items()})
