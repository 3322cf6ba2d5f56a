"""The episode reward (metarl/domain/reward.py) as pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metarl.domain.reward import RewardInputs, compute_reward, efficiency_credit, job_credit, speed_credit, validation_credit
from schemas.run_config import EpisodeRewardWeights

WEIGHTS = EpisodeRewardWeights()


def inputs(**overrides):
    values = dict(
        passed_on_attempt=1, max_probe_attempts=3, agent_tokens=1000, base_score=0.2, trained_score=0.6, train_seconds=60.0, train_budget_seconds=120.0
    )
    values.update(overrides)
    return RewardInputs(**values)


def test_job_credit_is_share_of_headroom():
    assert job_credit(0.2, 0.6, 0.1) == pytest.approx(0.5)
    assert job_credit(0.2, 1.0, 0.1) == pytest.approx(1.0)
    assert job_credit(0.5, 0.5, 0.1) == 0.0
    assert job_credit(0.5, 0.25, 0.1) == pytest.approx(-0.5)


def test_a_family_the_base_nearly_solves_earns_by_the_floor_not_by_its_last_items():
    # seed 1 of the 2026-12-07 benchmark, episode 340: base 0.995, trained 0.985 on 200 items
    assert job_credit(0.995, 0.985, min_headroom=1e-6) == -1.0  # without a floor one item is worth the whole range
    assert job_credit(0.995, 0.985, min_headroom=0.1) == pytest.approx(-0.1)
    assert job_credit(0.995, 1.0, min_headroom=0.1) == pytest.approx(0.05)
    assert job_credit(0.2, 0.6, min_headroom=0.1) == pytest.approx(0.5)  # a base at 0.9 or less is unaffected
    assert job_credit(0.9, 1.0, min_headroom=0.1) == pytest.approx(1.0)
    weights = EpisodeRewardWeights()
    inputs = RewardInputs(passed_on_attempt=1, max_probe_attempts=3, agent_tokens=0, base_score=0.995, trained_score=0.985, train_budget_seconds=60.0)
    assert compute_reward(inputs, weights).job == pytest.approx(-0.1)


def test_validation_decays_per_attempt_and_is_zero_at_cap():
    assert validation_credit(1, 0.5) == 1.0
    assert validation_credit(2, 0.5) == 0.5
    assert validation_credit(3, 0.5) == 0.25
    assert validation_credit(None, 0.5) == 0.0


def test_efficiency_halves_at_token_scale_and_needs_a_pass():
    assert efficiency_credit(4000, 4000, passed=True) == pytest.approx(0.5)
    assert efficiency_credit(0, 4000, passed=True) == 1.0
    assert efficiency_credit(10, 4000, passed=False) == 0.0


def test_speed_only_for_improved_jobs():
    assert speed_credit(30.0, 120.0, improved=True) == pytest.approx(0.75)
    assert speed_credit(30.0, 120.0, improved=False) == 0.0
    assert speed_credit(500.0, 120.0, improved=True) == 0.0


def test_unvalidated_episode_gets_nothing_but_zero():
    breakdown = compute_reward(inputs(passed_on_attempt=None, base_score=None, trained_score=None, train_seconds=None), WEIGHTS)
    assert breakdown.total == 0.0 and breakdown.raw_improvement is None


def test_components_are_weighted():
    breakdown = compute_reward(inputs(), WEIGHTS)
    expected = WEIGHTS.job * 0.5 + WEIGHTS.validation * 1.0 + WEIGHTS.efficiency * (4000 / 5000) + WEIGHTS.speed * 0.5
    assert breakdown.total == pytest.approx(expected)
    assert breakdown.raw_improvement == pytest.approx(0.4)


def test_speed_weight_above_half_the_job_weight_is_rejected():
    with pytest.raises(ValueError, match="speed weight"):
        EpisodeRewardWeights(job=0.1, speed=0.1)


@given(
    base=st.floats(0.0, 0.99),
    gain=st.floats(0.005, 1.0),
    slow_seconds=st.floats(1.0, 120.0),
    fast_seconds=st.floats(0.0, 120.0),
    attempt=st.integers(1, 3),
    tokens=st.integers(0, 100_000),
    speed_weight=st.floats(0.0, 0.5),
)
def test_fast_flat_job_never_beats_slower_real_improvement(base, gain, slow_seconds, fast_seconds, attempt, tokens, speed_weight):
    weights = EpisodeRewardWeights(speed=speed_weight)
    trained = min(1.0, base + gain * (1.0 - base))
    if trained <= base:
        return
    improved = compute_reward(
        inputs(base_score=base, trained_score=trained, train_seconds=slow_seconds, passed_on_attempt=attempt, agent_tokens=tokens), weights
    )
    flat = compute_reward(inputs(base_score=base, trained_score=base, train_seconds=fast_seconds, passed_on_attempt=attempt, agent_tokens=tokens), weights)
    assert improved.total > flat.total
