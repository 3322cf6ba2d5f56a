"""The pure pieces of the pluggable reward source: checks and clamping of returned rewards, sandbox
outcomes turned into job failures, the local job's reward section, and the local agent's rendered
environment module giving exactly the built-in graders' training signal."""

from __future__ import annotations

import json
import math
import random
import sys
import tomllib

import pytest
from pydantic import ValidationError

from metarl import graders
from metarl.backends.local.agent import effective_weights, environment_source
from metarl.backends.local.train import REWARD_COMPONENTS, compile_local_job, reward_process_cpu_seconds
from metarl.learning.grpo import LocalTrainConfig, RewardComponentWeights, rollout_reward
from metarl.learning.registry import FAMILIES
from metarl.learning.reward_checks import RewardBounds, RewardFunctionError, checked_rewards, clamp_reward, reward_problem
from metarl.learning.tokenizer import CHARACTERS
from metarl.probe.reward_source import EnvironmentRewardSpec, RewardStats, failed_job_status, reward_calls, sandbox_error_message, values_from_result
from metarl.sandbox.results import CallOutcome, SandboxError, SandboxResult
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec
from tests.conftest import REPO

BATCH = [("add 1+2=", "3", "3"), ("add 1+2=", "4", "3"), ("add 2+2=", "", "4")]
BOUNDS = RewardBounds(clip=10.0, reject_above=1000.0)


def test_checked_rewards_accepts_numbers_and_clamps() -> None:
    assert checked_rewards([1, 0.5, -2], BATCH, BOUNDS) == [1.0, 0.5, -2.0]
    assert checked_rewards((11.0, -999.0, 10.0), BATCH, BOUNDS) == [10.0, -10.0, 10.0]
    assert all(type(value) is float for value in checked_rewards([1, 2, 3], BATCH, BOUNDS))
    assert checked_rewards([], [], BOUNDS) == []


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ([1.0, 2.0], "2 rewards for 3 rollouts"),
        ([1.0, 2.0, 3.0, 4.0], "4 rewards for 3 rollouts"),
        ("1.0", "returned str, not a list"),
        (None, "returned NoneType"),
        ({"a": 1}, "returned dict"),
        ([1.0, math.nan, 0.0], "NaN for rollout 1"),
        ([1.0, 0.0, math.inf], "inf for rollout 2"),
        ([-math.inf, 0.0, 0.0], "-inf for rollout 0"),
        ([1.0, True, 0.0], "bool"),
        ([1.0, "0.5", 0.0], "str"),
        ([None, 0.0, 0.0], "NoneType"),
        ([1.0, [1.0], 0.0], "list"),
        ([1.0, 0.0, 1e4], "beyond the allowed magnitude"),
    ],
)
def test_checked_rewards_rejects_unusable_rewards(values: object, needle: str) -> None:
    with pytest.raises(RewardFunctionError) as caught:
        checked_rewards(values, BATCH, BOUNDS)
    assert needle in caught.value.message
    assert caught.value.step is None


def test_rejection_names_the_rollout() -> None:
    with pytest.raises(RewardFunctionError, match=r"rollout 1 \(prompt='add 1\+2=', completion='4', answer='3'\)"):
        checked_rewards([0.0, math.nan, 0.0], BATCH, BOUNDS)
    long_completion = [("p", "x" * 500 + "\x1b[31m", "a")]
    with pytest.raises(RewardFunctionError) as caught:
        checked_rewards([math.nan], long_completion, BOUNDS)
    assert "\x1b" not in caught.value.message and len(caught.value.message) < 400


def test_clamp_and_problem_and_bounds() -> None:
    assert clamp_reward(5.0, BOUNDS) == 5.0 and clamp_reward(50.0, BOUNDS) == 10.0 and clamp_reward(-50.0, BOUNDS) == -10.0
    assert reward_problem(3, BOUNDS) is None and reward_problem(-1000.0, BOUNDS) is None
    assert reward_problem(1000.5, BOUNDS) is not None and reward_problem(False, BOUNDS) is not None
    with pytest.raises(ValidationError):
        RewardBounds(clip=10.0, reject_above=1.0)
    with pytest.raises(ValidationError):
        RewardBounds(clip=0.0)


def test_error_at_step_keeps_the_message() -> None:
    located = RewardFunctionError("reward() returned NaN").at_step(4)
    assert located.step == 4 and located.message == "step 4: reward() returned NaN"


def ok(value: object) -> CallOutcome:
    return CallOutcome(ok=True, value=value)


def test_values_from_result_passes_values_through() -> None:
    result = SandboxResult(ok=True, calls=[ok(1.0), ok(0), ok("odd")])
    assert values_from_result(result, BATCH) == [1.0, 0, "odd"]  # types are checked_rewards' job


def test_values_from_result_turns_failures_into_clear_errors() -> None:
    timeout = SandboxError(kind="timeout", message="the module ran past the wall-clock limit of 2 s", fix="make the module fast")
    with pytest.raises(RewardFunctionError, match=r"\(timeout\): the module ran past .* Fix: make the module fast"):
        values_from_result(SandboxResult(ok=False, error=timeout), BATCH)
    crash = SandboxError(kind="crash", message="division by zero", fix="fix it", exception_type="ZeroDivisionError", line=3)
    failed = SandboxResult(ok=True, calls=[ok(1.0), CallOutcome(ok=False, error=crash), CallOutcome(ok=False, error=crash)])
    with pytest.raises(RewardFunctionError) as caught:
        values_from_result(failed, BATCH)
    message = caught.value.message
    assert "failed on 2 of 3 rollouts" in message and "rollout 1" in message and "completion='4'" in message
    assert "ZeroDivisionError: division by zero (line 3)" in message
    with pytest.raises(RewardFunctionError, match="answered 1 of 3"):
        values_from_result(SandboxResult(ok=True, calls=[ok(1.0)]), BATCH)


def test_sandbox_error_message_and_failed_status() -> None:
    error = SandboxError(kind="forbidden", message="the sandbox refused os.fork", fix="no processes", event="os.fork")
    message = sandbox_error_message(error, "importing it")
    assert message.startswith("the environment module failed in the sandbox while importing it (forbidden)")
    stats = RewardStats(mode="persistent", steps=2, rollouts=32, seconds=0.01)
    status = failed_job_status(RewardFunctionError("step 2: boom", step=2), 2, 1.23456, stats)
    assert status["status"] == "failed" and status["error"] == "reward module: step 2: boom"
    assert status["error_kind"] == "reward_function" and status["steps"] == 2 and status["train_seconds"] == 1.235
    assert status["reward"]["rollouts"] == 32
    json.dumps(status)
    huge = failed_job_status(RewardFunctionError("x" * 50_000), 0, -1.0, None)
    assert len(str(huge["error"])) < 2000 and huge["train_seconds"] == 0.0 and "reward" not in huge
    assert stats.seconds_per_step == pytest.approx(0.005) and RewardStats(mode="builtin").seconds_per_step == 0.0


def test_reward_calls_one_per_rollout() -> None:
    calls = reward_calls(BATCH)
    assert [call.function for call in calls] == ["reward"] * 3
    assert [call.args for call in calls] == [list(rollout) for rollout in BATCH]


def test_environment_reward_spec_bounds() -> None:
    spec = EnvironmentRewardSpec()
    assert spec.mode == "persistent" and spec.module == "environment.py"
    for bad in ({"workspace": "../up"}, {"module": "a/b.py"}, {"step_wall_seconds": 0}, {"cpu_seconds": 0}, {"mode": "thread"}, {"extra": 1}):
        with pytest.raises(ValidationError):
            EnvironmentRewardSpec(**bad)


TASK = TaskSpec.model_validate(tomllib.loads((REPO / "tasks_specs" / "addition.toml").read_text()))


def test_compile_local_job_adds_the_reward_section_only_with_a_workspace() -> None:
    job = JobSpec.model_validate({"model": {"name": "local-s"}, "reward": {"components": {"exact": 1.0}}, "environment": {"module": "env.py"}})
    builtin = compile_local_job(job, TASK)
    assert "reward" not in builtin
    agent = compile_local_job(job, TASK, environment_reward=True)
    spec = EnvironmentRewardSpec.model_validate(agent["reward"])
    assert spec.module == "env.py" and spec.workspace == "workspace" and spec.mode == "persistent"
    assert spec.cpu_seconds == reward_process_cpu_seconds(TASK.budget.max_train_seconds)
    assert agent["train"] == builtin["train"]  # the built-in weights stay for the record
    assert reward_process_cpu_seconds(1.0) == 30 and reward_process_cpu_seconds(10_000.0) == 3600 and reward_process_cpu_seconds(99.5) == 100


def rendered_reward(weights: dict[str, float], family: str, max_tokens: int):  # type: ignore[no-untyped-def]
    """The local agent's environment module, imported here (trusted: we generated it), with metarl's graders
    importable as `metarl_graders`, as the sandbox and the pod's environment package provide them."""
    namespace: dict[str, object] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, graders.GRADERS_MODULE, graders)
        exec(compile(environment_source(weights, family, max_tokens), "environment.py", "exec"), namespace)
    return namespace


WEIGHT_CASES = [
    {"correctness": 1.0},
    {"format": 1.0},
    {"exact": 2.0, "format": 0.1, "length_penalty": -1.0},
    {"correctness": 0.5, "exact": -1.0, "format": 1.0, "length_penalty": 0.5},
    {"correctness": 2.0, "exact": 1.0, "format": 0.5, "length_penalty": 2.0},
]


@pytest.mark.parametrize("family_name", sorted(FAMILIES))
def test_local_agent_module_is_the_builtin_training_signal(family_name: str) -> None:
    """The rendered module's reward equals the built-in reward of compile_local_job's config, exactly."""
    family = FAMILIES[family_name]
    rng = random.Random(family_name)
    for weights in WEIGHT_CASES:
        for max_tokens in (6, 16):
            namespace = rendered_reward(weights, family_name, max_tokens)
            assert set(namespace["COMPONENTS"]) == set(REWARD_COMPONENTS)  # type: ignore[arg-type]
            config = LocalTrainConfig(max_tokens=max_tokens, rewards=RewardComponentWeights(**effective_weights(weights)))
            for _ in range(200):
                example = family.generate(rng, rng.random())
                length = rng.randrange(0, max_tokens + 1)
                if rng.random() < 0.4:
                    text = (example.answer + " " * rng.randrange(2))[:length]
                else:
                    text = "".join(rng.choice(CHARACTERS) for _ in range(length))
                tokens = max_tokens if len(text) == max_tokens else len(text) + 1  # + the end token, unless cut off
                expected, _ = rollout_reward(family, example, text, tokens, config)
                assert namespace["reward"](example.prompt, text, example.answer) == expected, (weights, text)  # type: ignore[operator]


def test_effective_weights_follow_compile_local_job() -> None:
    job = JobSpec.model_validate({"model": {"name": "local-s"}, "reward": {"components": {"exact": 2.0, "format": -1.0, "length_penalty": -0.5}}})
    compiled = compile_local_job(job, TASK)["train"]["rewards"]
    assert effective_weights(job.reward.components) == compiled
    assert effective_weights({"format": 1.0}) == {"correctness": 1.0, "exact": 0.0, "format": 1.0, "length_penalty": 0.0}
