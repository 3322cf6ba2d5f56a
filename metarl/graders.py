"""The task families' graders, defined once: partial credit, exact match, the format check and the length penalty.

Standard library only (``re``, ``math``, ``sys``), and no import of metarl: the same file runs in three places.

- In metarl, :mod:`metarl.learning.families` grades with it (training rewards, hidden evals).
- In the sandbox (:mod:`metarl.sandbox`) it is importable by an environment module as ``metarl_graders``:
  the runner loads this file (bound read-only at ``/sandbox/metarl_graders.py`` under bubblewrap) before
  the audit hook, so the probe and the local trainer's reward session run the module with it.
- On a Runpod pod, each compiled environment package ships this file as ``metarl_graders.py``
  (:func:`metarl.backends.runpod.primerl.compiler.package_files`) and its ``__init__`` makes it
  importable as ``metarl_graders`` before the agent's module is imported.

A grader is data: a plain mapping with a ``kind`` (one of :data:`GRADER_KINDS`, or :data:`PLUGIN_KIND`)
and its options, validated by the models of :mod:`schemas.graders` (a task spec's ``[grader]`` table).
The six built-in families' graders are such mappings (:data:`BUILTIN_GRADERS`), so a family defined by
files alone grades with the same functions, wherever they run. The local agent's environment module
(:func:`metarl.backends.local.agent.environment_source`) takes its components from
:func:`reward_components`, so its reward is the built-in training signal.

Plugin graders: ``{"kind": "plugin", "plugin": NAME, "options": {...}}`` grades with a single-file,
standard-library-only module that a package registers under the entry-point group
:data:`PLUGIN_ENTRY_POINT_GROUP` (checked at registration by :mod:`metarl.learning.grader_plugins`).
This file finds it as the module ``metarl_grader_NAME`` (:func:`plugin_module`): the sandbox runner and
the pod's environment package load the file under that name beforehand; in metarl's own processes it
is imported through its entry point on first use. Its ``grade`` must return a number in [0, 1] and its
``is_exact`` and ``is_well_formed`` a bool; anything else raises :class:`PluginGraderError` (never a
clamped reward).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

GRADERS_MODULE = "metarl_graders"
"""The name under which an environment module imports this file (in the sandbox and on the pod)."""

MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")

GRADER_KINDS = ("exact", "numeric", "positional", "right_aligned_digits", "unordered_set", "sorted_list", "choice", "regex_extract")
"""Every built-in grader kind (the ``kind`` of a ``[grader]`` table)."""

PLUGIN_KIND = "plugin"
"""The grader kind that grades with a registered plugin module (``plugin`` names it, ``options`` go to it)."""

PLUGIN_ENTRY_POINT_GROUP = "metarl.graders"
"""Entry-point group under which a package registers a plugin grader: ``NAME = "package.module"``."""

PLUGIN_MODULE_PREFIX = "metarl_grader_"
"""A plugin grader called NAME is the module ``metarl_grader_NAME`` (in the sandbox, on the pod and in metarl)."""

PLUGIN_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
"""A plugin grader's name (so that ``metarl_grader_NAME`` is a module name)."""

IMPORT_PLUGINS = True
"""Whether a plugin grader not yet loaded is imported through its entry point. The sandbox runner and the
pod's environment package set it to False: there, the plugin graders they loaded are all there is."""

MAX_SHOWN_VALUE_CHARS = 80

DEFAULT_PARTIAL_CREDIT = 0.5
"""Weight of partial credit when the answer is not exact (an exact answer scores 1)."""

UNKNOWN_FAMILY_MAX_CHARS = 100
"""The format check's bound for a family this module does not know."""

DATE_ANSWER = re.compile(r"\d{2} (" + "|".join(MONTH_NAMES) + r") \d{4}")

Grader = Mapping[str, Any]
"""A grader: ``{"kind": ..., options...}`` (see :mod:`schemas.graders` for the options of each kind)."""

BUILTIN_GRADERS: dict[str, dict[str, Any]] = {
    "addition": {"kind": "right_aligned_digits", "charset": "digits", "max_chars": 3},
    "reversal": {"kind": "positional", "charset": "letters", "max_chars": 6},
    "caesar": {"kind": "positional", "charset": "letters", "max_chars": 4},
    "max_of_list": {"kind": "positional", "charset": "digits", "min_chars": 2, "max_chars": 2},
    "sorting": {"kind": "positional", "charset": "digits", "max_chars": 6},
    "date_format": {"kind": "positional", "format_pattern": DATE_ANSWER.pattern, "max_chars": 11},
}
"""The six built-in families' graders."""

MAX_ANSWER_CHARS = {name: grader["max_chars"] for name, grader in BUILTIN_GRADERS.items()}
"""Longest reference answer of each built-in family (its format check's bound)."""

RIGHT_ALIGNED_FAMILIES = frozenset(name for name, grader in BUILTIN_GRADERS.items() if grader["kind"] == "right_aligned_digits")
"""Built-in families whose partial credit compares strings from the right (numbers)."""

REWARD_COMPONENTS = ("correctness", "exact", "format", "length_penalty")
"""The reward components of an inner job (job.toml ``[reward.components]``), in their canonical order."""

RewardComponent = Callable[[str, str, str], float]
"""A reward component: ``(prompt, completion, answer) -> float``."""

NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


class PluginGraderError(ValueError):
    """A plugin grader that is not installed, or that returned something other than a score or a bool."""


def plugin_module_name(name: str) -> str:
    """The module name a plugin grader is loaded under: ``metarl_grader_NAME``."""
    return PLUGIN_MODULE_PREFIX + name


def plugin_names(grader: Grader) -> list[str]:
    """The plugin graders a grader mapping uses (its own, or its ``regex_extract`` inner grader's)."""
    if grader.get("kind") == PLUGIN_KIND:
        return [str(grader["plugin"])]
    inner = grader.get("inner")
    return plugin_names(inner) if isinstance(inner, Mapping) else []


def plugin_module(name: str) -> Any:
    """The plugin grader module called ``name``: ``sys.modules["metarl_grader_NAME"]`` when loaded (the
    sandbox and the pod load it before any agent code), else imported through its entry point."""
    loaded = sys.modules.get(plugin_module_name(name))
    if loaded is not None:
        return loaded
    if not IMPORT_PLUGINS:
        raise PluginGraderError(f"plugin grader {name[:MAX_SHOWN_VALUE_CHARS]!r} is not loaded here: only the registered plugin graders are")
    return _import_plugin(name)


def _import_plugin(name: str) -> Any:
    """Import the plugin grader ``name`` through its entry point and alias it as ``metarl_grader_NAME`` (metarl's processes)."""
    if PLUGIN_NAME.fullmatch(name) is None:
        raise PluginGraderError(f"{name[:MAX_SHOWN_VALUE_CHARS]!r} is not a plugin grader name (lower-case letters, digits and _)")
    import importlib
    from importlib.metadata import entry_points

    found = sorted({entry.value for entry in entry_points(group=PLUGIN_ENTRY_POINT_GROUP, name=name)})
    if not found:
        raise PluginGraderError(
            f"no plugin grader {name!r} is installed: install the package that registers it under the entry-point group {PLUGIN_ENTRY_POINT_GROUP!r}"
        )
    if len(found) > 1:
        raise PluginGraderError(f"plugin grader {name!r} is registered by several modules ({', '.join(found)}): uninstall all but one")
    module = importlib.import_module(found[0])
    sys.modules[plugin_module_name(name)] = module
    return module


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE_CHARS else text[:MAX_SHOWN_VALUE_CHARS] + "..."


def plugin_score(grader: Grader, answer: str, completion: str) -> float:
    """The plugin's ``grade(answer, completion, options)``, checked: a finite number in [0, 1], else :class:`PluginGraderError`."""
    value = plugin_module(grader["plugin"]).grade(answer, completion, dict(grader.get("options", {})))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise PluginGraderError(f"plugin grader {grader['plugin']!r}: grade returned {_shown(value)}; it must return a finite number in [0, 1]")
    return float(value)


def plugin_verdict(grader: Grader, function: str, *texts: str) -> bool:
    """The plugin's ``is_exact`` or ``is_well_formed`` on ``texts`` and the options, checked: a bool, else :class:`PluginGraderError`."""
    value = getattr(plugin_module(grader["plugin"]), function)(*texts, dict(grader.get("options", {})))
    if not isinstance(value, bool):
        raise PluginGraderError(f"plugin grader {grader['plugin']!r}: {function} returned {_shown(value)}; it must return True or False")
    return value


def normalize_completion(completion: str) -> str:
    """The completion as graded: surrounding whitespace removed."""
    return completion.strip()


def positional_similarity(expected: str, actual: str) -> float:
    """Fraction of positions (over the longer string) where the two strings agree."""
    longest = max(len(expected), len(actual))
    if longest == 0:
        return 1.0
    matches = sum(1 for left, right in zip(expected, actual) if left == right)
    return matches / longest


def right_aligned_similarity(expected: str, actual: str) -> float:
    """Positional similarity with both strings aligned at their last character (for numbers)."""
    return positional_similarity(expected[::-1], actual[::-1])


def grader_for(family: str | Grader) -> Grader:
    """A grader mapping: ``family`` itself, the built-in family's grader, or the plain fallback for an unknown name."""
    if not isinstance(family, str):
        return family
    return BUILTIN_GRADERS.get(family, {"kind": "positional", "max_chars": UNKNOWN_FAMILY_MAX_CHARS})


def _folded(grader: Grader, text: str) -> str:
    """``text`` stripped, and case-folded unless the grader is case sensitive."""
    text = normalize_completion(text)
    return text if grader.get("case_sensitive", True) else text.casefold()


def _items(grader: Grader, text: str) -> list[str]:
    """The non-empty items of a separated list (each stripped, case-folded unless case sensitive)."""
    separator = grader.get("separator", ",")
    return [_folded(grader, part) for part in text.split(separator) if part.strip()]


def _number(text: str) -> float | None:
    """The number ``text`` holds (surrounding whitespace aside), or None."""
    text = text.strip()
    if NUMBER.fullmatch(text) is None:
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def extracted(grader: Grader, completion: str) -> str | None:
    """The text a ``regex_extract`` grader grades: its ``group`` of the pattern's first match, or None."""
    match = re.search(grader["pattern"], completion)
    if match is None:
        return None
    group = match.group(int(grader.get("group", 0)))
    return group if group is not None else None


def is_exact(answer: str, completion: str, grader: Grader | None = None) -> bool:
    """True when the completion is exactly the reference answer (as the grader compares them; surrounding whitespace aside)."""
    if grader is None:
        return normalize_completion(completion) == answer
    kind = grader["kind"]
    if kind == PLUGIN_KIND:
        return plugin_verdict(grader, "is_exact", answer, completion)
    if kind == "regex_extract":
        text = extracted(grader, completion)
        return text is not None and is_exact(answer, text, grader["inner"])
    if kind == "numeric":
        expected, actual = _number(answer), _number(completion)
        if expected is None or actual is None:
            return False
        return abs(actual - expected) <= max(float(grader.get("tolerance", 0.0)), float(grader.get("relative_tolerance", 0.0)) * abs(expected))
    if kind == "unordered_set":
        return set(_items(grader, completion)) == set(_items(grader, answer)) and bool(_items(grader, answer))
    if kind == "sorted_list":
        return _items(grader, completion) == sorted(_items(grader, answer))
    return _folded(grader, completion) == _folded(grader, answer)


def similarity(family: str | Grader, answer: str, text: str) -> float:
    """Partial-credit similarity in [0, 1] between the answer and a normalised completion (a plugin's: its grade)."""
    grader = grader_for(family)
    kind = grader["kind"]
    if kind == PLUGIN_KIND:
        return plugin_score(grader, answer, text)
    if kind == "right_aligned_digits":
        return right_aligned_similarity(answer, text)
    if kind == "positional":
        return positional_similarity(_folded(grader, answer), _folded(grader, text))
    if kind == "numeric":
        expected, actual = _number(answer), _number(text)
        if expected is None or actual is None:
            return 0.0
        return max(0.0, 1.0 - abs(actual - expected) / max(abs(expected), 1.0))
    if kind == "unordered_set":
        wanted, given = set(_items(grader, answer)), set(_items(grader, text))
        union = wanted | given
        return len(wanted & given) / len(union) if union else 1.0
    if kind == "sorted_list":
        wanted_list, given_list = sorted(_items(grader, answer)), _items(grader, text)
        longest = max(len(wanted_list), len(given_list))
        return sum(1 for left, right in zip(wanted_list, given_list) if left == right) / longest if longest else 1.0
    if kind == "regex_extract":
        inner_text = extracted(grader, text)
        return 0.0 if inner_text is None else similarity(grader["inner"], answer, normalize_completion(inner_text))
    return 0.0


def grade(family: str | Grader, answer: str, completion: str) -> float:
    """Score in [0, 1]: 1 for an exact answer, otherwise the grader's ``partial_credit`` share of its similarity (a plugin's: its grade)."""
    grader = grader_for(family)
    if grader["kind"] == PLUGIN_KIND:
        return plugin_score(grader, answer, completion)
    if is_exact(answer, completion, grader):
        return 1.0
    if grader["kind"] in ("exact", "choice"):
        return 0.0
    credit = float(grader.get("partial_credit", DEFAULT_PARTIAL_CREDIT))
    if grader["kind"] == "regex_extract":
        return credit * similarity(grader, answer, completion)
    return credit * similarity(grader, answer, normalize_completion(completion))


def _charset_ok(charset: str, text: str) -> bool:
    if charset == "digits":
        return text.isdigit()
    if charset == "letters":
        return text.isalpha()
    if charset == "number":
        return _number(text) is not None
    return True


def is_well_formed(family: str | Grader, completion: str) -> bool:
    """True when the completion has the shape of the family's answers (the format reward)."""
    grader = grader_for(family)
    if grader["kind"] == PLUGIN_KIND:
        return plugin_verdict(grader, "is_well_formed", completion)
    if grader["kind"] == "regex_extract":
        text = extracted(grader, completion)
        return text is not None and is_well_formed(grader["inner"], text)
    text = normalize_completion(completion)
    if grader["kind"] == "choice":
        return _folded(grader, text) in {_folded(grader, choice) for choice in grader["choices"]}
    pattern = grader.get("format_pattern")
    if pattern is not None:
        return re.fullmatch(pattern, text) is not None
    charset = grader.get("charset", "number" if grader["kind"] == "numeric" else "any")
    if not _charset_ok(charset, text):
        return False
    return max(1, int(grader.get("min_chars", 1))) <= len(text) <= int(grader.get("max_chars", UNKNOWN_FAMILY_MAX_CHARS))


def length_penalty(completion: str, max_tokens: int) -> float:
    """Minus the completion's share of ``max_tokens``, counted from the text: one token per character plus the end token."""
    return -min(1.0, (len(completion) + 1) / max_tokens)


def reward_components(family: str, max_tokens: int, grader: Grader | None = None) -> dict[str, RewardComponent]:
    """The reward component functions ``(prompt, completion, answer) -> float`` of a family, by component name.

    ``grader`` is the family's grader mapping; without it, the built-in family ``family``'s grader."""
    chosen = grader_for(family) if grader is None else grader

    def correctness(prompt: str, completion: str, answer: str) -> float:
        return grade(chosen, answer, completion)

    def exact(prompt: str, completion: str, answer: str) -> float:
        return 1.0 if is_exact(answer, completion, chosen) else 0.0

    def well_formed(prompt: str, completion: str, answer: str) -> float:
        return 1.0 if is_well_formed(chosen, completion) else 0.0

    def penalty(prompt: str, completion: str, answer: str) -> float:
        return length_penalty(completion, max_tokens)

    return dict(zip(REWARD_COMPONENTS, (correctness, exact, well_formed, penalty)))
