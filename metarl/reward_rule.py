"""The reward rule: what a value returned by the agent's reward function counts as, wherever it is scored.

One definition, applied alike by

- the probe (:mod:`metarl.probe.workspace`): it judges the sample calls by this rule, so the
  correct answer must score strictly higher than wrong ones *after* clamping;
- the local trainer (:func:`metarl.learning.reward_checks.checked_rewards`, used by
  :func:`metarl.learning.grpo.train` in :mod:`metarl.backends.local.job`);
- the compiled prime-rl environment (:mod:`metarl.backends.runpod.primerl.env_template`): the
  compiler ships this very file in the environment package as ``metarl_reward_rule.py``
  (:func:`metarl.backends.runpod.primerl.compiler.reward_rule_source`), so the pod scores with the
  same code without importing metarl.

The rule: a reward is an ``int`` or ``float`` (not a ``bool``), finite, of magnitude at most
``reject_above`` (default :data:`REJECT_ABOVE`); it counts clamped to ``[-clip, clip]`` (default
:data:`CLIP`). Anything else is a problem: the local trainer fails the job with it, the probe
refuses the module, the prime-rl environment scores the rollout 0.0 (it cannot end a prime-rl run
cleanly; the probe has already refused such a module on its sample items).

Nothing here raises, whatever the value (a 400-digit integer, NaN, a subclass with a hostile
``__float__``): every comparison is exact (Python compares ``int`` with ``float`` without
converting), and a conversion happens only once the value is known to be in range.

Standard library only, no metarl import: the file runs as it is inside the prime-rl image.
"""

import math

CLIP = 100.0
"""Accepted rewards are clamped to ``[-CLIP, CLIP]``."""
REJECT_ABOVE = 1e6
"""A reward of larger magnitude is a bug, not a signal: a problem, never clamped."""
SHOWN_CHARS = 40


def _shown(value: object) -> str:
    """A short description of a value that is not a number (its type, and its text for plain str)."""
    kind = type(value).__name__
    if type(value) is str:
        text = "".join(ch if ch.isprintable() else "?" for ch in value[: SHOWN_CHARS + 1])
        return f"{kind} {text[:SHOWN_CHARS] + '...' if len(text) > SHOWN_CHARS else text!r}"
    return kind


def _number(value: object) -> int | float | None:
    """The value as an exact ``int`` or ``float`` (subclasses read through their base), or None: not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int.__index__(value) if isinstance(value, int) else float.__float__(value)  # the base types' own methods: no override runs


def reward_problem(value: object, reject_above: float = REJECT_ABOVE) -> str | None:
    """Why ``value`` is not a reward (None when it is): a bool, a non-number, NaN, infinity, or beyond ``reject_above``."""
    number = _number(value)
    if number is None:
        return f"returned {_shown(value)}, not a number"
    if isinstance(number, float) and math.isnan(number):
        return "returned NaN"
    if isinstance(number, float) and math.isinf(number):
        return f"returned {number}"
    if not -reject_above <= number <= reject_above:  # exact for ints of any size
        shown = f"{number:g}" if isinstance(number, float) or abs(number) < 10**300 else f"an integer of about {int(number.bit_length() * 0.30103) + 1} digits"
        return f"returned {shown}, beyond the allowed magnitude {reject_above:g}"
    return None


def clamp(value: float, clip: float = CLIP) -> float:
    """``value`` clamped to ``[-clip, clip]``."""
    return max(-clip, min(clip, value))


def training_reward(value: object, clip: float = CLIP, reject_above: float = REJECT_ABOVE) -> float | None:
    """The reward training uses for ``value`` (a float in ``[-clip, clip]``), or None when :func:`reward_problem` names a problem."""
    if reward_problem(value, reject_above) is not None:
        return None
    number = _number(value)
    assert number is not None  # reward_problem accepted it
    return clamp(float(number), clip)  # in range, so float() cannot overflow


def clamp_note(value: object, clip: float = CLIP) -> str:
    """`` (R before clamping)`` when ``value`` is a reward that the clamp changed, else ``""``: for messages."""
    number = _number(value)
    if number is None or not -1e300 < number < 1e300 or -clip <= number <= clip:
        return ""
    return f" ({float(number):g} before clamping to [{-clip:g}, {clip:g}])"
