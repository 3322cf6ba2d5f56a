"""The task families' graders, defined once: partial credit, exact match, the format check and the length penalty.

One file on purpose (over 600 lines): the sandbox and the pod import this very file alone as ``metarl_graders``, so it cannot import a sibling.

Standard library only (``re``, ``math``, ``sys``, ``functools``), plus ``re2`` (the google-re2 wheel) where it can be
imported, and no import of metarl: the same file runs in three places.

- In metarl, :mod:`metarl.learning.families` grades with it (training rewards, hidden evals).
- In the sandbox (:mod:`metarl.sandbox.parent`) it is importable by an environment module as ``metarl_graders``:
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

Regular expressions (``regex_extract``'s ``pattern``, a ``format_pattern``) run in time linear in the text,
with RE2's syntax and semantics (no backreferences or lookaround, ``\\d``, ``\\w``, ``\\s`` and ``\\b`` ASCII,
``$`` the end of the text unless ``(?m)``): with RE2 itself where ``re2`` can be imported (metarl's
processes), else with :class:`LinearPattern`, a Pike VM in pure Python (the sandbox, whose ``python -I -S``
sees no site-packages, and a pod image without google-re2). :mod:`schemas.graders` refuses a pattern that
RE2 cannot compile when the task spec is loaded.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Callable, Mapping
from re import _constants as _sre  # type: ignore[attr-defined]
from re import _parser as _sre_parser  # type: ignore[attr-defined]
from typing import Any

try:
    import re2 as _re2
except ImportError:  # the sandbox (python -I -S: no site-packages) and a pod image without google-re2: LinearPattern
    _re2 = None

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


class PatternError(ValueError):
    """A grader pattern the linear-time engines cannot run (a backreference, lookaround or another feature RE2 lacks)."""


def _encodable(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8, and so RE2, cannot hold) replaced by U+FFFD, one for one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


_ASCII_DIGITS = frozenset("0123456789")
_ASCII_SPACE = frozenset("\t\n\f\r ")
_ASCII_WORD = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    _sre.CATEGORY_DIGIT: lambda ch: ch in _ASCII_DIGITS,
    _sre.CATEGORY_NOT_DIGIT: lambda ch: ch not in _ASCII_DIGITS,
    _sre.CATEGORY_SPACE: lambda ch: ch in _ASCII_SPACE,
    _sre.CATEGORY_NOT_SPACE: lambda ch: ch not in _ASCII_SPACE,
    _sre.CATEGORY_WORD: lambda ch: ch in _ASCII_WORD,
    _sre.CATEGORY_NOT_WORD: lambda ch: ch not in _ASCII_WORD,
}
"""RE2's character classes: ASCII only."""
_CHAR, _SPLIT, _JMP, _SAVE, _ASSERT, _MATCH = range(6)
_MAX_PROGRAM = 50_000
"""Most instructions of one compiled pattern (RE2 caps repetition at 1000, so its patterns stay far below this)."""


def _folded_variants(ch: str) -> tuple[str, ...]:
    return (ch, ch.lower(), ch.upper())


class LinearPattern:
    """A regular expression run by a Pike VM (a Thompson NFA that tracks captures): time linear in the text, whatever the pattern.

    The pattern is parsed by the standard library's parser and compiled to a small program; matching
    keeps at most one thread per instruction, ordered by priority, so the leftmost match is the one a
    backtracking engine would prefer (RE2's leftmost-first semantics). Only what RE2 supports is
    accepted (:class:`PatternError` otherwise), with RE2's meanings: ``\\d``, ``\\w``, ``\\s`` and ``\\b``
    are ASCII, ``$`` is the end of the text (the end of a line with ``(?m)``), ``.`` is any character but
    a newline (any with ``(?s)``).
    """

    def __init__(self, pattern: str) -> None:
        try:
            parsed = _sre_parser.parse(pattern, 0)
        except re.error as exc:
            raise PatternError(f"not a valid regular expression: {exc}") from None
        self.pattern = pattern
        self.groups = parsed.state.groups - 1
        self.program: list[tuple[Any, ...]] = [(_SAVE, 0)]
        self._emit(parsed, parsed.state.flags)
        self.program += [(_SAVE, 1), (_MATCH,)]

    # -- compiling --------------------------------------------------------------------------

    def _add(self, instruction: tuple[Any, ...]) -> int:
        if len(self.program) >= _MAX_PROGRAM:
            raise PatternError(f"the pattern compiles to more than {_MAX_PROGRAM} instructions: use smaller repetition counts")
        self.program.append(instruction)
        return len(self.program) - 1

    def _patch(self, at: int, instruction: tuple[Any, ...]) -> None:
        self.program[at] = instruction

    def _emit(self, items: Any, flags: int) -> None:
        for op, arg in items:
            self._emit_one(op, arg, flags)

    def _emit_one(self, op: Any, arg: Any, flags: int) -> None:
        if op in (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN):
            self._add((_CHAR, self._char_test(op, arg, flags)))
        elif op is _sre.SUBPATTERN:
            group, add_flags, del_flags, body = arg
            inner = (flags | add_flags) & ~del_flags
            if group is not None:
                self._add((_SAVE, 2 * group))
            self._emit(body, inner)
            if group is not None:
                self._add((_SAVE, 2 * group + 1))
        elif op is _sre.BRANCH:
            self._emit_branch(arg[1], flags)
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT):
            self._emit_repeat(arg, flags, greedy=op is _sre.MAX_REPEAT)
        elif op is _sre.AT:
            self._add((_ASSERT, self._assertion(arg, flags)))
        else:
            raise PatternError(f"{str(op).lower()} is not supported (graders match in linear time, as RE2 does: no backreferences or lookaround)")

    def _emit_branch(self, alternatives: list[Any], flags: int) -> None:
        jumps = []
        for index, alternative in enumerate(alternatives):
            if index < len(alternatives) - 1:
                split = self._add((_SPLIT, 0, 0))
                self._emit(alternative, flags)
                jumps.append(self._add((_JMP, 0)))
                self._patch(split, (_SPLIT, split + 1, len(self.program)))
            else:
                self._emit(alternative, flags)
        for jump in jumps:
            self._patch(jump, (_JMP, len(self.program)))

    def _emit_repeat(self, arg: tuple[int, int, Any], flags: int, *, greedy: bool) -> None:
        least, most, body = arg
        if most == _sre.MAXREPEAT:
            # x{n,} is n-1 copies and x+, and x* is (x+)?, as RE2 compiles them: a body that can match the empty
            # string then still gets its one empty iteration (its groups set), which a plain loop back would lose
            for _ in range(max(least - 1, 0)):
                self._emit(body, flags)
            skip = self._add((_SPLIT, 0, 0)) if least == 0 else None
            start = len(self.program)
            self._emit(body, flags)
            again = self._add((_SPLIT, 0, 0))
            after = len(self.program)
            for split, target in ((skip, start), (again, start)):
                if split is not None:
                    self._patch(split, (_SPLIT, target, after) if greedy else (_SPLIT, after, target))
            return
        for _ in range(least):
            self._emit(body, flags)
        splits = []
        for _ in range(most - least):
            splits.append(self._add((_SPLIT, 0, 0)))
            self._emit(body, flags)
        after = len(self.program)
        for split in splits:
            self._patch(split, (_SPLIT, split + 1, after) if greedy else (_SPLIT, after, split + 1))

    @staticmethod
    def _assertion(code: Any, flags: int) -> str:
        multiline = bool(flags & _sre.SRE_FLAG_MULTILINE)
        if code is _sre.AT_BEGINNING:
            return "line_start" if multiline else "text_start"
        if code is _sre.AT_BEGINNING_STRING:
            return "text_start"
        if code is _sre.AT_END:
            return "line_end" if multiline else "text_end"
        if code is _sre.AT_END_STRING:
            return "text_end"
        if code is _sre.AT_BOUNDARY:
            return "word_boundary"
        if code is _sre.AT_NON_BOUNDARY:
            return "not_word_boundary"
        raise PatternError(f"the anchor {str(code).lower()} is not supported")

    @staticmethod
    def _char_test(op: Any, arg: Any, flags: int) -> Callable[[str], bool]:
        fold = bool(flags & _sre.SRE_FLAG_IGNORECASE)
        if op is _sre.ANY:
            if flags & _sre.SRE_FLAG_DOTALL:
                return lambda ch: True
            return lambda ch: ch != "\n"
        if op in (_sre.LITERAL, _sre.NOT_LITERAL):
            wanted = chr(arg)
            if fold:
                options = frozenset(_folded_variants(wanted))
                positive: Callable[[str], bool] = lambda ch: any(variant in options for variant in _folded_variants(ch))  # noqa: E731
            else:
                positive = lambda ch: ch == wanted  # noqa: E731
            if op is _sre.NOT_LITERAL:
                return lambda ch: not positive(ch)
            return positive
        negate = False
        literals: set[str] = set()
        ranges: list[tuple[int, int]] = []
        categories: list[Callable[[str], bool]] = []
        for item_op, item_arg in arg:
            if item_op is _sre.NEGATE:
                negate = True
            elif item_op is _sre.LITERAL:
                literals.add(chr(item_arg))
            elif item_op is _sre.RANGE:
                ranges.append(item_arg)
            elif item_op is _sre.CATEGORY and item_arg in _CATEGORIES:
                categories.append(_CATEGORIES[item_arg])
            else:
                raise PatternError(f"{str(item_op).lower()} in a character class is not supported")

        def member(ch: str) -> bool:
            code = ord(ch)
            return ch in literals or any(low <= code <= high for low, high in ranges) or any(test(ch) for test in categories)

        def test(ch: str) -> bool:
            found = any(member(variant) for variant in _folded_variants(ch)) if fold else member(ch)
            return found != negate

        return test

    # -- matching ---------------------------------------------------------------------------

    @staticmethod
    def _holds(kind: str, text: str, position: int) -> bool:
        before = text[position - 1] if position > 0 else ""
        after = text[position] if position < len(text) else ""
        if kind == "text_start":
            return position == 0
        if kind == "text_end":
            return position == len(text)
        if kind == "line_start":
            return position == 0 or before == "\n"
        if kind == "line_end":
            return position == len(text) or after == "\n"
        boundary = (before in _ASCII_WORD and before != "") != (after in _ASCII_WORD and after != "")
        return boundary if kind == "word_boundary" else not boundary

    def _follow(self, threads: list[tuple[int, tuple[Any, ...]]], seen: set[int], start: int, captures: tuple[Any, ...], text: str, position: int) -> None:
        """Add the thread at ``start`` and every thread it reaches without reading a character, in priority order."""
        program = self.program
        stack = [(start, captures)]
        while stack:
            pc, caps = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            instruction = program[pc]
            kind = instruction[0]
            if kind == _JMP:
                stack.append((instruction[1], caps))
            elif kind == _SPLIT:
                stack.append((instruction[2], caps))
                stack.append((instruction[1], caps))
            elif kind == _SAVE:
                slot = instruction[1]
                stack.append((pc + 1, caps[:slot] + (position,) + caps[slot + 1 :]))
            elif kind == _ASSERT:
                if self._holds(instruction[1], text, position):
                    stack.append((pc + 1, caps))
            else:
                threads.append((pc, caps))

    def _run(self, text: str, *, anchored: bool, full: bool) -> LinearMatch | None:
        program = self.program
        empty: tuple[Any, ...] = (None,) * (2 * self.groups + 2)
        threads: list[tuple[int, tuple[Any, ...]]] = []
        seen: set[int] = set()
        found: tuple[Any, ...] | None = None
        for position in range(len(text) + 1):
            if found is None and (position == 0 or not anchored):
                self._follow(threads, seen, 0, empty, text, position)
            if not threads:
                if found is not None or anchored:
                    break
                seen = set()
                continue
            char = text[position] if position < len(text) else None
            following: list[tuple[int, tuple[Any, ...]]] = []
            following_seen: set[int] = set()
            for pc, caps in threads:
                instruction = program[pc]
                if instruction[0] == _MATCH:
                    if full and position != len(text):
                        continue
                    found = caps
                    break  # the threads after this one have lower priority
                if char is not None and instruction[1](char):
                    self._follow(following, following_seen, pc + 1, caps, text, position + 1)
            threads, seen = following, following_seen
        return None if found is None else LinearMatch(text, found)

    def search(self, text: str) -> LinearMatch | None:
        """The leftmost match in ``text`` (as ``re.search``), or None."""
        return self._run(text, anchored=False, full=False)

    def fullmatch(self, text: str) -> LinearMatch | None:
        """A match of the whole of ``text`` (as ``re.fullmatch``), or None."""
        return self._run(text, anchored=True, full=True)


class LinearMatch:
    """A match of a :class:`LinearPattern`: its groups, as ``re.Match.group``."""

    def __init__(self, text: str, captures: tuple[Any, ...]) -> None:
        self._text = text
        self._captures = captures

    def group(self, index: int = 0) -> str | None:
        """The text group ``index`` matched (0: the whole match), or None when it took no part in the match."""
        start, end = self._captures[2 * index], self._captures[2 * index + 1]
        return None if start is None or end is None else self._text[start:end]

    def span(self, index: int = 0) -> tuple[int, int]:
        """(start, end) of group ``index``, (-1, -1) when it took no part in the match."""
        start, end = self._captures[2 * index], self._captures[2 * index + 1]
        return (-1, -1) if start is None or end is None else (start, end)


def _re2_options() -> Any:
    options = _re2.Options()
    options.log_errors = False  # a refused pattern is reported by the caller, not logged by the C++ library
    return options


@functools.lru_cache(maxsize=256)
def compiled_pattern(pattern: str) -> Any:
    """A grader pattern compiled for linear-time matching (``.search``, ``.fullmatch``, ``.group``): RE2 where ``re2``
    can be imported, else :class:`LinearPattern`; :class:`PatternError` for a pattern neither accepts."""
    if _re2 is None:
        return LinearPattern(pattern)
    try:
        return _re2.compile(pattern, _re2_options())
    except _re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternError(f"RE2 cannot compile it: {reason}") from None


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
    match = compiled_pattern(grader["pattern"]).search(_encodable(completion))
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
        return compiled_pattern(pattern).fullmatch(_encodable(text)) is not None
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
