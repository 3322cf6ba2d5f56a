"""Metrics of one outer step, computed from the records of its batch."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from metarl.domain.batching import staleness
from metarl.store.db import run_sql
from metarl.store.ledger import run_total_usd
from metarl.store.status import HELD_OUT_REWARD_SQL, held_out_means

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


STEP_FACTS_SQL = """
SELECT e.policy_version, rw.total, rw.job, rw.validation, rw.efficiency, rw.speed, rw.raw_improvement,
       first_try.passed, last_job.model_name, last_job.explicit_hyperparameters
FROM episode_groups g
JOIN episodes e ON e.group_id = g.id
JOIN rewards rw ON rw.episode_id = e.id
LEFT JOIN LATERAL (
    SELECT pa.passed FROM probe_attempts pa WHERE pa.episode_id = e.id ORDER BY pa.attempt LIMIT 1
) first_try ON true
LEFT JOIN LATERAL (
    SELECT pa.model_name, pa.explicit_hyperparameters FROM probe_attempts pa
    WHERE pa.episode_id = e.id AND pa.model_name IS NOT NULL ORDER BY pa.attempt DESC LIMIT 1
) last_job ON true
WHERE g.outer_step_id = %(outer_step_id)s
"""
"""Sent as written (no ORM compilation): one row per batched episode, with its first and last parsed attempt."""


def outer_step_metrics(session: Session, outer_step_id: int, run_id: str, version_before: int) -> dict[str, float | None]:
    """The step's batch summary, the held-out reward of its base version (if evaluated yet) and the run's cost so far."""
    facts = [
        EpisodeFacts(
            reward=total,
            job=job,
            validation=validation,
            efficiency=efficiency,
            speed=speed,
            raw_improvement=raw,
            staleness=staleness(version, version_before),
            first_try_passed=bool(first_passed),
            large_model=(model_name in LARGE_MODELS) if model_name is not None else None,
            explicit_share=(explicit / 7.0) if model_name is not None and explicit is not None else None,
        )
        for version, total, job, validation, efficiency, speed, raw, first_passed, model_name, explicit in run_sql(
            session, STEP_FACTS_SQL, {"outer_step_id": outer_step_id}
        )
    ]
    summary = summarise(facts)
    summary["held_out_reward_mean"] = held_out_reward_by_version(session, run_id, version_before).get(version_before)
    summary["cost_usd_total"] = run_total_usd(session, run_id)
    return summary


def held_out_reward_by_version(session: Session, run_id: str, version: int | None = None) -> dict[int, float]:
    """Mean reward of the evaluated held-out groups sampled under each policy version (or only `version`), from the records.

    An outer step stores the value known when its update ran; a held-out group evaluated later is
    only found here, so `metarl status` and the report read this, not the stored step metrics.
    """
    return held_out_means(run_sql(session, HELD_OUT_REWARD_SQL, {"run_id": run_id, "version": version}))
