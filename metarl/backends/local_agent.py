"""The `local` trainer agent and outer update: a small torch policy over the compact job language,
trained with importance-sampling GRPO. Policy states are files under `<artifacts>/policy/<run>/`."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

from metarl.backends.base import AgentSubmission, EpisodeContext, OuterBatchEpisode, OuterResult, PolicySample
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


def write_workspace(ctx: EpisodeContext, job_toml: str) -> Path:
    """The attempt's workspace: TASK.md (public part of the task only) and job.toml."""
    folder = Path(ctx.artifacts_root) / "workspaces" / ctx.run_id / str(ctx.episode_id) / str(ctx.probe_attempt)
    folder.mkdir(parents=True, exist_ok=True)
    public = ctx.task.public
    task_md = f"# {public.title}\n\n{public.description}\n"
    if public.example_prompt:
        task_md += f"\nExample: `{public.example_prompt}` -> `{public.example_answer}`\n"
    (folder / "TASK.md").write_text(task_md, encoding="utf-8")
    (folder / "job.toml").write_text(job_toml, encoding="utf-8")
    return folder


class LocalAgent:
    """Samples a job from the episode's policy version, conditioned on task, attempt and probe feedback."""

    name = "local"
    simulated = False

    def __init__(self, config: LocalAgentBackend):
        self.config = config

    def run_attempt(self, ctx: EpisodeContext) -> AgentSubmission:
        import torch

        from metarl.policy.job_language import context_for_episode

        if ctx.policy_state_uri is None:
            raise ValueError(f"policy version {ctx.policy_version} of run {ctx.run_id} has no saved state")
        torch.set_num_threads(1)
        policy = load_policy(ctx.policy_state_uri)
        sampled = policy.sample(context_for_episode(ctx), seed=sample_seed(ctx.seed, ctx.probe_attempt), temperature=self.config.temperature)
        job_toml = sampled.render(seed=ctx.seed)
        workspace = write_workspace(ctx, job_toml)
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
