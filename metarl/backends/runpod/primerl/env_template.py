"""A classic (v0) verifiers environment compiled by metarl from a trainer agent's workspace.

This file is the ``__init__.py`` of every compiled environment package (``metarl_env_<digest>``);
metarl never imports it itself. It runs inside the prime-rl image, where ``verifiers`` (the
commit pinned by prime-rl's ``deps/verifiers``) and ``datasets`` are installed, and the legacy
bridge calls ``verifiers.load_environment("<this module>")``, which calls
:func:`load_environment` below.

- Dataset: ``dataset.jsonl`` of the workspace (``{"prompt", "answer"}`` per line); each prompt
  is the user message (no system prompt), each answer the rubric's ``answer``.
- Graders: the package ships metarl's task-family graders (metarl/graders.py) as its submodule
  ``metarl_graders`` and each plugin grader the task's grader uses as ``metarl_grader_NAME``;
  importing the package makes them importable under those top-level names, as in metarl's
  sandbox, so the agent's module may ``import metarl_graders`` and its plugin graders are found.
- Rubric: when the agent's module defines ``COMPONENTS``, one reward function per component
  named in job.toml ``[reward.components]``, with its weight (``reward`` itself is logged as a
  zero-weight metric); otherwise the module's ``reward`` with weight 1.
- Each reward function gets plain strings, as the environment contract promises: the text of
  the last user message, the text of the completion (a leading ``<think>...</think>`` block is
  dropped) and the reference answer.
- Scores follow the reward rule the probe and the local trainer apply (metarl/reward_rule.py,
  shipped as the submodule ``metarl_reward_rule``): a finite number of magnitude at most 1e6,
  clamped to [-100, 100]. A value the rule refuses (a bool, a non-number, NaN, infinity, beyond
  1e6) or one of the usual errors raised scores 0.0 instead of ending the run (the probe has
  already refused such a module on sample items). With ``COMPONENTS`` the rule applies to each
  component's value before its weight.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from importlib import resources
from typing import Any

DATASET_FILE = "dataset.jsonl"
REWARD_CONFIG_FILE = "job_reward.json"
AGENT_MODULE = "agent_environment"
GRADERS_MODULE = "metarl_graders"
PLUGIN_MODULE_PREFIX = "metarl_grader_"
REWARD_RULE_MODULE = "metarl_reward_rule"
SCORE_ERRORS = (ArithmeticError, AttributeError, LookupError, TypeError, ValueError, RecursionError)
_THINK_BLOCK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)

sys.modules[GRADERS_MODULE] = importlib.import_module(f"{__name__}.{GRADERS_MODULE}")
for _plugin in sorted(
    entry.name[: -len(".py")] for entry in resources.files(__name__).iterdir() if entry.name.startswith(PLUGIN_MODULE_PREFIX) and entry.name.endswith(".py")
):
    sys.modules[_plugin] = importlib.import_module(f"{__name__}.{_plugin}")
sys.modules[GRADERS_MODULE].IMPORT_PLUGINS = False  # the plugin graders shipped here are all there is
_RULE = importlib.import_module(f"{__name__}.{REWARD_RULE_MODULE}")  # metarl/reward_rule.py itself


def _field(message: Any, name: str) -> Any:
    if isinstance(message, dict):
        return message.get(name)
    return getattr(message, name, None)


def content_text(content: Any) -> str:
    """Text of a message's content: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_field(part, "text") if not isinstance(part, str) else part for part in content]
        return "".join(part for part in parts if isinstance(part, str))
    return ""


def last_text(messages: Any, role: str) -> str:
    """Text of the last message with this role (a plain string is returned as it is)."""
    if isinstance(messages, str):
        return messages
    for message in reversed(list(messages or [])):
        if _field(message, "role") == role:
            return content_text(_field(message, "content"))
    return ""


def completion_text(completion: Any) -> str:
    """The model's answer text: the last assistant message, without a leading think block."""
    return _THINK_BLOCK.sub("", last_text(completion, "assistant"), count=1)


def prompt_text(prompt: Any) -> str:
    """The task prompt: the last user message."""
    return last_text(prompt, "user")


def safe_score(function: Any, prompt: str, completion: str, answer: str) -> float:
    """The agent's function on plain strings, judged by the reward rule: its clamped value, or 0.0
    when it fails or returns something the rule refuses."""
    try:
        value = function(prompt, completion, answer)
    except SCORE_ERRORS:
        return 0.0
    reward = _RULE.training_reward(value)
    return 0.0 if reward is None else float(reward)


def reward_function(function: Any, name: str) -> Any:
    """A verifiers reward function (named ``name``) that calls an agent function on plain strings."""

    def score(prompt: Any, completion: Any, answer: Any = "", **kwargs: Any) -> float:
        return safe_score(function, prompt_text(prompt), completion_text(completion), "" if answer is None else str(answer))

    score.__name__ = name
    score.__qualname__ = name
    return score


def rubric_parts(agent: Any, weights: dict[str, float]) -> tuple[list[Any], list[float]]:
    """Reward functions and weights for the rubric (see the module docstring)."""
    components = getattr(agent, "COMPONENTS", None)
    reward = getattr(agent, "reward", None)
    if isinstance(components, dict):
        missing = sorted(name for name in weights if name not in components)
        if missing:
            raise ValueError(f"reward components {missing} are not keys of COMPONENTS in the environment module")
        funcs = [reward_function(components[name], name) for name in weights]
        values = [float(weights[name]) for name in weights]
        if callable(reward) and "reward" not in weights:
            funcs.append(reward_function(reward, "reward"))
            values.append(0.0)
        return funcs, values
    if not callable(reward):
        raise ValueError("the environment module defines no reward(prompt, completion, answer)")
    return [reward_function(reward, "reward")], [1.0]


def read_items(text: str) -> list[dict[str, str]]:
    """Dataset items from JSON Lines text (blank lines skipped)."""
    items = []
    for line in text.splitlines():
        if line.strip():
            data = json.loads(line)
            items.append({"question": str(data["prompt"]), "answer": str(data["answer"])})
    return items


def _resource_text(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def load_environment(system_prompt: str | None = None, **kwargs: Any) -> Any:
    """The verifiers environment of this job: SingleTurnEnv over the dataset, scored by the agent's rubric."""
    import verifiers as vf
    from datasets import Dataset

    config = json.loads(_resource_text(REWARD_CONFIG_FILE))
    agent = importlib.import_module(f"{__name__}.{AGENT_MODULE}")
    funcs, weights = rubric_parts(agent, {str(k): float(v) for k, v in config["weights"].items()})
    dataset = Dataset.from_list(read_items(_resource_text(DATASET_FILE)))
    rubric = vf.Rubric(funcs=funcs, weights=weights)
    return vf.SingleTurnEnv(dataset=dataset, system_prompt=system_prompt, rubric=rubric, **kwargs)
