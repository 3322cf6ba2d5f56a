"""Metrics of one outer step, computed from the records of its batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from metarl.ledger import run_total_usd
from schemas.records import Episode, EpisodeGroup, GroupStatus, OuterStep, ProbeAttempt, Reward

LARGE_MODELS = ("Qwen/Qwen3-1.7B",)


@dataclass(frozen=True)
class EpisodeFacts:
    """What the step metrics need of one batched episode."""

    reward: float
    job: float
    validation: float
    efficiency: float
    speed: float
    raw_improvement: float | None
    staleness: int
    first_try_passed: bool
    large_model: bool | None
    explicit_share: float | None


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(facts: list[EpisodeFacts]) -> dict[str, float | None]:
    """Pure summary of a batch: reward components, behaviour shares, staleness."""
    jobs = [f for f in facts if f.large_model is not None]
    improvements = [f.raw_improvement for f in facts if f.raw_improvement is not None]
    return {
        "episodes": float(len(facts)),
        "reward_mean": mean([f.reward for f in facts]),
        "job_mean": mean([f.job for f in facts]),
        "validation_mean": mean([f.validation for f in facts]),
        "efficiency_mean": mean([f.efficiency for f in facts]),
        "speed_mean": mean([f.speed for f in facts]),
        "raw_improvement_mean": mean(improvements),
        "large_model_share": mean([1.0 if f.large_model else 0.0 for f in jobs]),
        "explicit_hparam_share": mean([f.explicit_share for f in jobs if f.explicit_share is not None]),
        "first_try_pass_rate": mean([1.0 if f.first_try_passed else 0.0 for f in facts]),
        "staleness_min": float(min(f.staleness for f in facts)) if facts else None,
        "staleness_mean": mean([float(f.staleness) for f in facts]),
        "staleness_max": float(max(f.staleness for f in facts)) if facts else None,
    }


def outer_step_metrics(session: Session, outer_step_id: int, run_id: str) -> dict[str, float | None]:
    step = session.get(OuterStep, outer_step_id)
    rows = session.execute(
        select(Episode.id, Episode.policy_version, Reward)
        .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
        .join(Reward, Reward.episode_id == Episode.id)
        .where(EpisodeGroup.outer_step_id == outer_step_id)
    ).all()
    attempts_of: dict[int, list[Row[Any]]] = {}
    if rows:
        # only the columns the facts use: the attempts' policy tokens and logprobs are not parsed again here
        for attempt in session.execute(
            select(ProbeAttempt.episode_id, ProbeAttempt.passed, ProbeAttempt.model_name, ProbeAttempt.explicit_hyperparameters)
            .where(ProbeAttempt.episode_id.in_([row[0] for row in rows]))
            .order_by(ProbeAttempt.episode_id, ProbeAttempt.attempt)
        ):
            attempts_of.setdefault(attempt.episode_id, []).append(attempt)
    facts = []
    for episode_id, version, reward in rows:
        attempts = attempts_of.get(episode_id, [])
        parsed = [a for a in attempts if a.model_name is not None]
        last = parsed[-1] if parsed else None
        facts.append(
            EpisodeFacts(
                reward=reward.total,
                job=reward.job,
                validation=reward.validation,
                efficiency=reward.efficiency,
                speed=reward.speed,
                raw_improvement=reward.raw_improvement,
                staleness=step.policy_version_before - version,
                first_try_passed=bool(attempts and attempts[0].passed),
                large_model=(last.model_name in LARGE_MODELS) if last else None,
                explicit_share=(last.explicit_hyperparameters / 7.0) if last and last.explicit_hyperparameters is not None else None,
            )
        )
    summary = summarise(facts)
    summary["held_out_reward_mean"] = held_out_reward_by_version(session, run_id, step.policy_version_before).get(step.policy_version_before)
    summary["cost_usd_total"] = run_total_usd(session, run_id)
    return summary


def held_out_reward_by_version(session: Session, run_id: str, version: int | None = None) -> dict[int, float]:
    """Mean reward of the evaluated held-out groups sampled under each policy version (or only `version`), from the records.

    An outer step stores the value known when its update ran; a held-out group evaluated later is
    only found here, so `metarl status` and the report read this, not the stored step metrics.
    """
    query = (
        select(Episode.policy_version, func.avg(Reward.total))
        .join(Reward, Reward.episode_id == Episode.id)
        .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
        .where(EpisodeGroup.run_id == run_id, EpisodeGroup.held_out.is_(True), EpisodeGroup.status == GroupStatus.evaluated)
        .group_by(Episode.policy_version)
    )
    if version is not None:
        query = query.where(Episode.policy_version == version)
    return {int(found): float(mean_reward) for found, mean_reward in session.execute(query).all()}
