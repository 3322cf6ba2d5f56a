"""The reward rule (metarl/reward_rule.py): one definition that the probe, the local trainer and the
compiled prime-rl environment all apply, and that never raises on what a module returns (issue 40)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metarl import reward_rule
from metarl.backends.runpod.primerl import compiler
from metarl.backends.runpod.primerl.compiler import build_bundle
from metarl.learning.reward_checks import RewardBounds, RewardFunctionError, checked_rewards
from metarl.reward_rule import CLIP, REJECT_ABOVE, clamp, clamp_note, reward_problem, training_reward
from schemas.job import JobSpec
from tests.unit.test_primerl_package import ITEMS, fake_vf, install  # noqa: F401 - fixture

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=300, suppress_health_check=list(HealthCheck))


class HostileFloat(float):
    def __float__(self) -> float:
        raise RuntimeError("no")

    def __abs__(self) -> float:
        raise RuntimeError("no")


class HostileInt(int):
    def __index__(self) -> int:
        raise RuntimeError("no")

    def __float__(self) -> float:
        raise RuntimeError("no")


def test_the_rule() -> None:
    assert (CLIP, REJECT_ABOVE) == (100.0, 1e6)
    assert training_reward(0.5) == 0.5 and training_reward(3) == 3.0 and type(training_reward(3)) is float
    assert training_reward(200.0) == 100.0 and training_reward(-150) == -100.0
    assert training_reward(1e6) == 100.0 and training_reward(1e6 + 1) is None and training_reward(-1e7) is None
    for bad in (True, False, None, "1.0", [1.0], {"a": 1}, math.nan, math.inf, -math.inf, 10**400, -(10**5000)):
        assert training_reward(bad) is None
        assert reward_problem(bad) is not None
    assert reward_problem(math.nan) == "returned NaN" and reward_problem(-math.inf) == "returned -inf"
    assert reward_problem("x" * 100) == f"returned str {'x' * 40 + '...'!r}, not a number"
    assert reward_problem([1.0]) == "returned list, not a number"
    assert reward_problem(2e6) == "returned 2e+06, beyond the allowed magnitude 1e+06"
    assert reward_problem(10**400) == "returned an integer of about 401 digits, beyond the allowed magnitude 1e+06"
    assert "digits" in str(reward_problem(10**5000))  # past Python's int-to-str limit: still no exception
    assert clamp(5.0, 2.0) == 2.0 and clamp(-5.0, 2.0) == -2.0 and clamp(1.5, 2.0) == 1.5
    assert clamp_note(200.0) == " (200 before clamping to [-100, 100])" and clamp_note(50.0) == "" and clamp_note("x") == "" and clamp_note(10**400) == ""


def test_subclasses_are_read_through_their_base_type() -> None:
    """A float or int subclass with hostile methods (possible in the prime-rl pod, where the module is not sandboxed) is read as its value."""
    assert training_reward(HostileFloat(150.0)) == 100.0 and training_reward(HostileInt(7)) == 7.0
    assert training_reward(HostileFloat(math.nan)) is None and training_reward(HostileInt(10**400)) is None


def test_bounds_are_parameters_with_the_rules_defaults() -> None:
    assert RewardBounds() == RewardBounds(clip=CLIP, reject_above=REJECT_ABOVE)
    assert training_reward(15.0, clip=10.0, reject_above=20.0) == 10.0 and training_reward(25.0, clip=10.0, reject_above=20.0) is None


VALUES = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=50),
    st.lists(st.floats(), max_size=3),
)


@PROPERTY
@given(value=VALUES)
def test_property_the_rule_never_raises_and_agrees_with_itself(value: object) -> None:
    problem = reward_problem(value)
    reward = training_reward(value)
    assert (reward is None) is (problem is not None)
    if reward is not None:
        assert -CLIP <= reward <= CLIP and math.isfinite(reward)
    clamp_note(value)


@PROPERTY
@given(value=VALUES)
def test_property_the_local_trainer_applies_the_rule(value: object) -> None:
    """checked_rewards: exactly the rule's reward, or a RewardFunctionError naming the rule's problem (never another exception)."""
    try:
        [reward] = checked_rewards([value], [("p", "c", "a")], RewardBounds())
    except RewardFunctionError as err:
        assert training_reward(value) is None and str(reward_problem(value)) in err.message
    else:
        assert reward == training_reward(value)


def test_the_local_trainer_turns_a_huge_integer_into_a_job_failure() -> None:
    """Issue 40: a reward of 10**400 made checked_rewards raise OverflowError, so the local job died without a status."""
    with pytest.raises(RewardFunctionError, match="integer of about 401 digits, beyond the allowed magnitude"):
        checked_rewards([1.0, 10**400], [("p", "1", "1"), ("p", "2", "1")], RewardBounds())


def test_the_prime_rl_package_scores_by_the_same_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    """The package ships metarl/reward_rule.py itself and its rubric's scores are the rule's rewards (0.0 for what the rule refuses)."""
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "dataset": {"size": 2}})
    source = "def reward(p, c, a):\n    return 1.0\n"
    bundle = build_bundle(spec, source.encode(), b"{}\n")
    shipped = f"env/{bundle.manifest.env_module}/{compiler.REWARD_RULE_MODULE}.py"
    assert bundle.files[shipped] == Path(reward_rule.__file__).read_bytes()  # the file itself: one definition
    package = install(tmp_path, monkeypatch, spec, source, ITEMS)
    assert package.REWARD_RULE_MODULE == compiler.REWARD_RULE_MODULE
    for value in (0.25, 7, 200.0, -150, 1e6, 2e6, 10**400, math.nan, math.inf, True, "1", None, [1.0], HostileFloat(150.0)):
        expected = training_reward(value)
        assert package.safe_score(lambda p, c, a, value=value: value, "p", "c", "a") == (0.0 if expected is None else expected), value


def test_a_module_that_pays_beyond_the_clamp_gets_the_same_rewards_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_vf: None) -> None:
    """Issue 40's module (200 when right, 150 when wrong): the local trainer and the prime-rl rubric both see [100, 100]
    (the probe refuses it: tests/unit/test_workspace_probe.py)."""
    source = "def reward(prompt, completion, answer):\n    return 200.0 if completion.strip() == answer else 150.0\n"
    spec = JobSpec.model_validate({"model": {"name": "Qwen/Qwen3-0.6B"}, "dataset": {"size": 2}})
    package = install(tmp_path, monkeypatch, spec, source, ITEMS)
    [score] = package.load_environment().rubric.funcs
    rubric = [score(prompt=[{"role": "user", "content": "add 2+3="}], completion=[{"role": "assistant", "content": text}], answer="5") for text in ("5", "7")]
    trainer = checked_rewards([200.0, 150.0], [("add 2+3=", "5", "5"), ("add 2+3=", "7", "5")], RewardBounds())
    assert rubric == trainer == [100.0, 100.0]
