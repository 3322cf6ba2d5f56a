"""The task-family registry: built-in families and plugin packages' families, found by one mechanism.

A family is registered by a reference ``"module:attribute"`` naming a :class:`TaskFamily` subclass
(or instance) under a name. Plugin packages declare theirs as entry points of the group
:data:`FAMILY_ENTRY_POINT_GROUP` in their packaging metadata, for example::

    [project.entry-points."metarl.task_families"]
    word_count = "my_package.families:WordCountFamily"

The six built-in families are registered through the same references (:data:`BUILTIN_FAMILIES`),
loaded by the same function, so a plugin family is used exactly as a built-in one. A family grades
with its ``grader`` mapping through metarl/graders.py, the one file shipped to the sandbox and the pod:
a built-in grader kind, or a plugin grader (``{"kind": "plugin", "plugin": NAME, ...}``) that a package
registers under the entry-point group ``metarl.graders`` (:mod:`metarl.learning.grader_plugins`);
a family whose grader names an unregistered plugin, or options the plugin refuses, is not registered.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable

from metarl.learning.families import TaskFamily
from metarl.learning.grader_plugins import grader_problems, installed_entry_points, refresh_graders

FAMILY_ENTRY_POINT_GROUP = "metarl.task_families"
"""Entry-point group under which a package registers task families."""

BUILTIN_FAMILIES: dict[str, str] = {
    "addition": "metarl.learning.families:AdditionFamily",
    "reversal": "metarl.learning.families:ReversalFamily",
    "caesar": "metarl.learning.families:CaesarFamily",
    "max_of_list": "metarl.learning.families:MaxOfListFamily",
    "sorting": "metarl.learning.families:SortingFamily",
    "date_format": "metarl.learning.families:DateFormatFamily",
}
"""The built-in families' references, by name (registered as a plugin's entry points are)."""


class FamilyRegistryError(RuntimeError):
    """A registered family cannot be loaded or clashes with another."""


def load_reference(name: str, reference: str, source: str) -> TaskFamily:
    """The family a ``module:attribute`` reference names (a subclass is instantiated), checked against ``name``."""
    module_name, _, attribute = reference.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute) if attribute else importlib.import_module(module_name)
    except (ImportError, AttributeError) as exc:
        raise FamilyRegistryError(f"{source}: family {name!r} -> {reference!r} cannot be loaded: {exc}") from None
    family = target() if isinstance(target, type) and issubclass(target, TaskFamily) else target
    if not isinstance(family, TaskFamily):
        raise FamilyRegistryError(f"{source}: family {name!r} -> {reference!r} is not a metarl TaskFamily")
    if family.name != name:
        raise FamilyRegistryError(f"{source}: family registered as {name!r} calls itself {family.name!r}; register it under its own name")
    problems = grader_problems(family.grader)
    if problems:
        listed = "; ".join(f"{problem.field}: {problem.message} ({problem.fix})" for problem in problems)
        raise FamilyRegistryError(f"{source}: family {name!r} -> {reference!r} has an unusable grader: {listed}")
    return family


def plugin_references() -> list[tuple[str, str, str]]:
    """(name, reference, distribution) of every installed package's family entry point."""
    return installed_entry_points(FAMILY_ENTRY_POINT_GROUP)


def build_registry(references: Iterable[tuple[str, str, str]]) -> dict[str, TaskFamily]:
    """Families by name from (name, reference, source) triples; a name registered twice is an error."""
    families: dict[str, TaskFamily] = {}
    sources: dict[str, str] = {}
    for name, reference, source in references:
        if name in families:
            raise FamilyRegistryError(f"task family {name!r} is registered by both {sources[name]} and {source}: uninstall one or rename it")
        families[name] = load_reference(name, reference, source)
        sources[name] = source
    return families


@functools.cache
def registered_families() -> dict[str, TaskFamily]:
    """Every registered family (built-ins, then installed plugins), loaded once per process."""
    builtins = [(name, reference, "metarl (built-in)") for name, reference in BUILTIN_FAMILIES.items()]
    plugins = [
        (name, reference, source) for name, reference, source in plugin_references() if not (name in BUILTIN_FAMILIES and reference == BUILTIN_FAMILIES[name])
    ]
    return build_registry(builtins + plugins)


def registered_family(name: str) -> TaskFamily:
    """The registered family called ``name``; a ``KeyError`` naming the valid names otherwise."""
    families = registered_families()
    if name not in families:
        raise KeyError(f"unknown task family {name!r}; valid names: {', '.join(sorted(families))}")
    return families[name]


def refresh_registry() -> None:
    """Forget the loaded registry and plugin graders (after installing a plugin into a running process)."""
    registered_families.cache_clear()
    refresh_graders()


def get_family(name: str) -> TaskFamily:
    """The registered family called ``name`` (built-in or plugin); a ``KeyError`` naming the valid names otherwise."""
    return registered_family(name)


def is_hidden_eval_item(family: str | TaskFamily, prompt: str) -> bool:
    """True when ``prompt`` is (or canonically equals) an item of the family's hidden-eval partition."""
    resolved = get_family(family) if isinstance(family, str) else family
    return resolved.is_hidden_eval_item(prompt)


def contaminated_prompts(family: str | TaskFamily, prompts: Iterable[str]) -> list[str]:
    """The prompts of a dataset that fall in the family's hidden-eval partition (empty when clean).

    Strict: about one random item in ``EVAL_PARTITION_MODULUS`` is flagged, whether or not it is
    in a drawn eval set; datasets made with ``TaskFamily.generate`` are always clean.
    """
    resolved = get_family(family) if isinstance(family, str) else family
    return [prompt for prompt in prompts if resolved.is_hidden_eval_item(prompt)]


def hidden_eval_overlap(family: str | TaskFamily, prompts: Iterable[str], n: int, version: int = 1) -> list[str]:
    """The prompts whose canonical item is in the drawn hidden eval ``hidden_eval(n, version)`` (set-based)."""
    resolved = get_family(family) if isinstance(family, str) else family
    hidden_keys = {resolved.item_key(example.prompt) for example in resolved.hidden_eval(n, version)}
    return [prompt for prompt in prompts if resolved.item_key(prompt) in hidden_keys]


def __getattr__(name: str) -> dict[str, TaskFamily]:
    """``FAMILIES``: every registered family by name (built-ins and plugins)."""
    if name == "FAMILIES":
        return registered_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
