"""SIMULATOR backends: a simulated cloud for tests, capacity planning and fault drills.

Nothing here trains or scores a model. Every record these backends produce is marked
`simulated`, their backend name is `sim`, and their log lines start with [SIMULATOR].
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metarl.artifact_store import ArtifactStore
from metarl.backends.sim.config import SimAgentBackend, SimDuration, SimEvalBackend, SimOuterBackend, SimTrainBackend
from metarl.errors import CapacityError
from metarl.interfaces import (
    AgentSubmission,
    BackendServices,
    BaseModelIdentity,
    CostItem,
    EpisodeContext,
    LaunchResult,
    OuterBatchEpisode,
    OuterResult,
    PollResult,
    Score,
)
from schemas.backend_config import expect_config
from schemas.base import dump_toml_model
from schemas.job import JobDataset, JobModel, JobRollout, JobSpec, JobTraining
from schemas.run_config import RunConfig
from schemas.task_spec import TaskSpec

log = logging.getLogger("metarl.sim")

SMALL_MODEL, LARGE_MODEL = "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B"


def seeded_rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def sample_duration(duration: SimDuration, rng: random.Random) -> float:
    """Lognormal duration around the median, clamped to [0, max_s]."""
    if duration.median_s <= 0:
        return 0.0
    value = duration.median_s * math.exp(rng.gauss(0.0, duration.sigma)) if duration.sigma > 0 else duration.median_s
    return max(0.0, min(duration.max_s, value))


def simulated_skill(policy_version: int, rate: float = 0.25) -> float:
    """How far the simulated policy has 'learned' (0 -> 1) after some updates; a simulator knob, not a measurement."""
    return 1.0 - math.exp(-rate * policy_version)


INVALID_KINDS = ("syntax", "indivisible", "unknown_model", "over_budget", "unknown_key")


def _valid_job(rng: random.Random, skill: float, task: TaskSpec) -> JobSpec:
    large = rng.random() < 0.3 + 0.6 * skill and LARGE_MODEL in task.budget.allowed_models
    explicit = rng.random() < 0.2 + 0.7 * skill
    group = rng.choice([4, 8]) if explicit else None
    training = JobTraining(
        learning_rate=10 ** rng.uniform(-3.5 - (1 - skill), -2.5 + (1 - skill)) if explicit else None,
        max_steps=rng.choice([20, 40, 60]) if explicit else None,
        batch_size=(group or 8) * rng.choice([4, 8]) if explicit else None,
        group_size=group,
        seed=rng.randrange(1000),
    )
    rollout = JobRollout(temperature=rng.choice([0.8, 1.0, 1.2]) if explicit else None, max_tokens=16 if explicit else None)
    size = max(task.data.min_dataset_size, min(task.data.max_dataset_size, 1000))
    return JobSpec(
        model=JobModel(name=LARGE_MODEL if large else task.budget.allowed_models[0]),
        training=training,
        rollout=rollout,
        dataset=JobDataset(size=size, difficulty=round(rng.uniform(0.2, 0.8), 2)),
    )


def _invalid_job_text(kind: str, valid: JobSpec) -> str:
    text = dump_toml_model(valid)
    if kind == "syntax":
        return text + "\n[training\nlearning_rate = \n"
    if kind == "indivisible":
        return dump_toml_model(valid.model_copy(update={"training": valid.training.model_copy(update={"batch_size": 30, "group_size": 8})}))
    if kind == "unknown_model":
        return text.replace(valid.model.name, "gpt-17-ultra")
    if kind == "over_budget":
        return dump_toml_model(
            valid.model_copy(update={"training": valid.training.model_copy(update={"max_steps": 100_000, "batch_size": 512, "group_size": 8})})
        )
    return text + "\n[extras]\nturbo = true\n"


class SimAgent:
    """SIMULATOR of a trainer agent whose invalid-job rate falls with the policy version and with feedback."""

    name = "sim"
    simulated = True

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> SimAgent:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.agent, SimAgentBackend))

    def __init__(self, config: SimAgentBackend):
        self.config = config

    def run_attempt(self, ctx: EpisodeContext, baseline: Callable[[str], float] | None = None) -> AgentSubmission:
        rng = seeded_rng("agent", ctx.seed, ctx.episode_id, ctx.probe_attempt)
        time.sleep(sample_duration(self.config.duration, rng))
        skill = simulated_skill(ctx.policy_version)
        invalid_rate = self.config.invalid_rate * self.config.invalid_decay**ctx.policy_version
        if ctx.feedback:
            invalid_rate *= 0.5
        valid = _valid_job(rng, skill, ctx.task)
        text = _invalid_job_text(rng.choice(INVALID_KINDS), valid) if rng.random() < invalid_rate else dump_toml_model(valid)
        tokens = max(1, int(rng.expovariate(1.0 / self.config.tokens_mean)))
        log.info("[SIMULATOR] agent episode=%s attempt=%s tokens=%s", ctx.episode_id, ctx.probe_attempt, tokens)
        costs = []
        if self.config.usd_per_million_tokens > 0:
            costs.append(
                CostItem(
                    source="sim",
                    description="[SIMULATOR] policy tokens",
                    quantity=tokens,
                    unit="token",
                    unit_price_usd=self.config.usd_per_million_tokens / 1e6,
                    key=f"agent:{ctx.episode_id}:{ctx.probe_attempt}",
                )
            )
        return AgentSubmission(job_toml=text, agent_tokens=tokens, costs=costs)


def _create_once(path: Path, text: str) -> bool:
    """Create `path` holding `text`, all or nothing; False if it exists already.

    The text goes to a temporary file that is then hard-linked into place (link fails if the name
    exists), so a write that fails half-way (a full disk) leaves no empty or partial record behind
    for a later launch to choke on.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(temporary, "x", encoding="utf-8") as handle:
            handle.write(text)
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)
    return True


class SimTrain:
    """SIMULATOR of a GPU cloud: a launched job's duration and fate are drawn at launch and kept in the
    simulated cloud's own folder, so launching the same name again re-attaches; nothing is trained."""

    name = "sim"
    simulated = True

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> SimTrain:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.train, SimTrainBackend), ArtifactStore(config.artifacts.root).working_dir("sim-cloud"))

    def __init__(self, config: SimTrainBackend, cloud_dir: Path):
        self.config = config
        self.cloud_dir = cloud_dir

    def capacity(self) -> int:
        return self.config.max_concurrent_jobs

    def poll_interval_s(self) -> float:
        return self.config.poll_interval_s

    def launch(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> LaunchResult:
        """Idempotent by name: the first call creates the simulated job, later calls return it."""
        rng = seeded_rng("train", job_name)
        if rng.random() < self.config.capacity_error_rate:
            raise CapacityError(f"[SIMULATOR] no capacity for {job_name}")
        self.cloud_dir.mkdir(parents=True, exist_ok=True)
        record = self.cloud_dir / f"{job_name}.json"
        state = {"launched_at": time.time(), "duration_s": sample_duration(self.config.duration, rng), "fails": rng.random() < self.config.failure_rate}
        if _create_once(record, json.dumps(state)):
            log.info("[SIMULATOR] launch %s duration=%.2fs fails=%s", job_name, state["duration_s"], state["fails"])
        else:
            state = json.loads(record.read_text(encoding="utf-8"))
            log.info("[SIMULATOR] re-attach %s", job_name)
        return LaunchResult(external_id=f"sim-{job_name}", state=state)

    def poll(self, ctx: EpisodeContext, job: JobSpec, external_id: str, state: dict[str, Any]) -> PollResult:
        elapsed = time.time() - float(state["launched_at"])
        duration = float(state["duration_s"])
        if elapsed < duration:
            return PollResult(status="running", state=state)
        cost = CostItem(
            source="sim",
            description="[SIMULATOR] 2x A40 pod time",
            quantity=round(duration, 3),
            unit="pod_second",
            unit_price_usd=self.config.usd_per_hour / 3600.0,
            key=f"train:{external_id}",
        )
        if state["fails"]:
            return PollResult(status="failed", state=state, train_seconds=duration, error="[SIMULATOR] injected job failure", costs=[cost])
        return PollResult(status="succeeded", state=state, train_seconds=duration, checkpoint_uri=f"sim://{external_id}/final", costs=[cost])


def simulated_improvement(job: JobSpec, skill_noise: float, rng: random.Random) -> float:
    """SIMULATOR response surface: share of headroom a job closes, from its hyperparameters."""
    resolved = job.resolved()
    lr_quality = math.exp(-((math.log10(resolved.learning_rate) + 3.0) ** 2) / (2 * 0.5**2))
    steps_quality = 1.0 - math.exp(-resolved.max_steps / 40.0)
    group_quality = 0.0 if resolved.group_size <= 1 else 1.0 - 1.0 / resolved.group_size
    model_factor = 1.25 if job.model.name == LARGE_MODEL else 1.0
    return max(0.0, min(1.0, 0.6 * lr_quality * steps_quality * group_quality * model_factor + rng.gauss(0.0, skill_noise)))


class SimEval:
    """SIMULATOR of the hidden-eval scorer: base scores from a hash, trained scores from a response surface."""

    name = "sim"
    simulated = True

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> SimEval:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.eval, SimEvalBackend))

    def __init__(self, config: SimEvalBackend):
        self.config = config

    @staticmethod
    def base_model_identity(config: SimEvalBackend, model_name: str, task: TaskSpec) -> BaseModelIdentity:
        """The simulator's base scores depend on the task, the model name and the eval version only."""
        return BaseModelIdentity(build="simulator", scale=1.0, scorer="simulator")

    def score_base(self, task: TaskSpec, model_name: str) -> Score:
        rng = seeded_rng("base", task.id, model_name, task.hidden_eval.version)
        bonus = 0.05 if model_name == LARGE_MODEL else 0.0
        return Score(score=round(0.1 + 0.2 * rng.random() + bonus, 4), n_items=task.hidden_eval.n_items)

    def score_trained(self, ctx: EpisodeContext, job: JobSpec, checkpoint_uri: str | None, train_state: dict[str, Any]) -> Score:
        rng = seeded_rng("eval", ctx.episode_id, checkpoint_uri)
        time.sleep(sample_duration(self.config.duration, rng))
        base = self.score_base(ctx.task, job.model.name).score
        gain = simulated_improvement(job, self.config.noise, rng)
        score = max(0.0, min(1.0, base + (1.0 - base) * gain))
        log.info("[SIMULATOR] eval episode=%s base=%.3f trained=%.3f", ctx.episode_id, base, score)
        return Score(score=round(score, 4), n_items=ctx.task.hidden_eval.n_items)


class SimOuter:
    """SIMULATOR of the outer update: records batch statistics and bumps the version; no weights change."""

    name = "sim"
    simulated = True

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> SimOuter:
        """Built from the run's config (metarl/composition.py)."""
        return cls(expect_config(config.backends.outer, SimOuterBackend))

    def __init__(self, config: SimOuterBackend):
        self.config = config

    def initial_state(self, run_id: str, config: RunConfig) -> str | None:
        return None

    def update(self, run_id: str, step: int, version: int, batch: list[OuterBatchEpisode], config: RunConfig, base_state_uri: str | None) -> OuterResult:
        rng = seeded_rng("outer", run_id, step)
        time.sleep(sample_duration(self.config.duration, rng))
        rewards = [episode.reward for episode in batch]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        log.info("[SIMULATOR] outer step=%s episodes=%s mean_reward=%.3f", step, len(batch), mean)
        return OuterResult(state_uri=None, metrics={"batch_reward_mean": mean, "simulated": 1.0})
