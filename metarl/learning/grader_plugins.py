"""Plugin graders: single-file, standard-library-only modules that packages register under the entry-point group ``metarl.graders``.

A package declares each of its graders in its packaging metadata, by a name and a module::

    [project.entry-points."metarl.graders"]
    spelled_count = "my_package.grader"

The module is one ``.py`` file that defines ``grade(answer, completion, options) -> float`` (in [0, 1]),
``is_exact(answer, completion, options) -> bool``, ``is_well_formed(completion, options) -> bool`` and
optionally ``check_options(options) -> list[str]`` (what is wrong with a spec's options; empty when
they are fine). A grader ``{"kind": "plugin", "plugin": NAME, "options": {...}}`` (a spec's
``[grader]``, schemas/graders.py, or a registered family's own) grades with it through metarl/graders.py,
wherever that file runs: in metarl, in the sandbox (metarl/sandbox/parent.py binds every registered plugin
file read-only next to the graders and the runner loads it as ``metarl_grader_NAME`` before the audit
hook) and on a Runpod pod (the compiled environment package ships the files its grader uses as
``metarl_grader_NAME.py``). So when the registry is built (:func:`registered_graders`) each entry
point is checked, and a problem is one :class:`GraderPluginError` naming the entry point, its
distribution, the file, the line and the fix:

- the entry point names a module (no ``:attribute``) that is a single ``.py`` file, not a package;
- every import in it (read from the source, not run) is a module the sandbox loads
  (metarl/sandbox_runner.py ``ALLOWED_MODULES``) or ``__future__``: standard library only, never
  metarl, no relative import;
- ``grade``, ``is_exact`` and ``is_well_formed`` are top-level functions with those parameters
  (and ``check_options``, when defined, takes ``options``).

Then the module is imported once and aliased as ``metarl_grader_NAME``, where metarl/graders.py finds it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from metarl import graders
from metarl.errors import MetarlError
from metarl.sandbox_runner import ALLOWED_MODULES
from schemas.base import FieldProblem, printable

GRADER_ENTRY_POINT_GROUP = graders.PLUGIN_ENTRY_POINT_GROUP
"""Entry-point group under which a package registers plugin graders (``NAME = "package.module"``)."""

REQUIRED_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "grade": ("answer", "completion", "options"),
    "is_exact": ("answer", "completion", "options"),
    "is_well_formed": ("completion", "options"),
}
"""The functions a plugin grader defines, with their parameters."""

OPTIONAL_FUNCTIONS: dict[str, tuple[str, ...]] = {"check_options": ("options",)}
"""The functions a plugin grader may define, with their parameters."""

EXTRA_IMPORTS = frozenset({"__future__"})
"""Imports a plugin grader may have besides the sandbox's modules."""

MAX_PLUGIN_BYTES = 256 * 1024
"""Largest plugin grader file."""

PLUGIN_IMPORT_ERRORS = (ImportError, ArithmeticError, AttributeError, LookupError, NameError, TypeError, ValueError, RuntimeError)
"""What importing a checked plugin grader, or its ``check_options``, may raise (reported, naming the plugin)."""


def allowed_imports() -> list[str]:
    """The modules a plugin grader may import, sorted (as the fixes name them)."""
    return sorted(name for name in {*ALLOWED_MODULES, *EXTRA_IMPORTS} if not name.startswith(("_", "encodings.")) and name != graders.GRADERS_MODULE)


def _signatures() -> str:
    return ", ".join(f"{name}({', '.join(params)})" for name, params in REQUIRED_FUNCTIONS.items())


RULES_FIX = (
    "a plugin grader is one .py file (it runs in the sandbox and on the pod) that imports only these standard modules: "
    + ", ".join(allowed_imports())
    + f"; and defines {_signatures()} (optionally check_options(options))"
)


class GraderPluginError(MetarlError):
    """A registered plugin grader cannot be used: the message names the entry point, its distribution, the file and line; ``fix`` says what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(f"{message} (fix: {fix})")
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class PluginGraderFile:
    """A registered, checked plugin grader: its name, module, distribution and its one source file."""

    name: str
    module: str
    distribution: str
    path: Path

    def source(self) -> bytes:
        """The file's bytes (what the sandbox loads and the pod's package ships)."""
        return self.path.read_bytes()


def import_problem(module: str) -> str | None:
    """Why a plugin grader may not import ``module`` (pure); None when it may."""
    top = module.split(".")[0]
    if top == "metarl":
        return f"imports {module}: a plugin grader must not import metarl (the sandbox and the pod have only the standard library)"
    if module in ALLOWED_MODULES or module in EXTRA_IMPORTS:
        return None
    if top not in sys.stdlib_module_names:
        return f"imports {module}, which is not in the standard library"
    return f"imports {module}, a standard-library module the sandbox does not load"


def _function_problem(node: ast.FunctionDef, params: tuple[str, ...]) -> str | None:
    positional = [argument.arg for argument in [*node.args.posonlyargs, *node.args.args]]
    required_keywords = [argument.arg for argument, default in zip(node.args.kwonlyargs, node.args.kw_defaults) if default is None]
    if len(positional) == len(params) and not required_keywords:
        return None
    return f"{node.name} takes ({', '.join(positional + required_keywords)}); define {node.name}({', '.join(params)})"


def source_problems(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, problem) of a plugin grader's source (pure): syntax, imports, the functions it must define; line 0 is the whole file."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as exc:
        return [(exc.lineno or 0, f"is not valid Python: {exc.msg}")]
    problems: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [(node.lineno, problem) for alias in node.names if (problem := import_problem(alias.name)) is not None]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                problems.append((node.lineno, "has a relative import: a plugin grader is one file, importing nothing of its package"))
            elif (problem := import_problem(node.module or "")) is not None:
                problems.append((node.lineno, problem))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            problems.append((node.lineno, "calls __import__: import standard modules with import statements"))
    defined = {statement.name: statement for statement in tree.body if isinstance(statement, ast.FunctionDef)}
    for name, params in {**REQUIRED_FUNCTIONS, **OPTIONAL_FUNCTIONS}.items():
        function = defined.get(name)
        if function is None:
            if name in REQUIRED_FUNCTIONS:
                problems.append((0, f"defines no top-level function {name}({', '.join(params)})"))
        elif (problem := _function_problem(function, params)) is not None:
            problems.append((function.lineno, problem))
    return sorted(problems)


def _where(name: str, module: str, distribution: str) -> str:
    return f"plugin grader {name!r} (entry point {name} = {module!r} of {distribution}, group {GRADER_ENTRY_POINT_GROUP!r})"


def plugin_file(name: str, module: str, distribution: str) -> PluginGraderFile:
    """Find and check one entry point's module without running it; :class:`GraderPluginError` says what to fix."""
    where = _where(name, module, distribution)
    if graders.PLUGIN_NAME.fullmatch(name) is None:
        raise GraderPluginError(
            f"{where}: the name is not usable", "rename the entry point: a lower-case letter, then lower-case letters, digits or _ (40 at most)"
        )
    if ":" in module:
        raise GraderPluginError(f"{where} names an attribute", f'name the module itself: {name} = "{module.partition(":")[0]}"')
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise GraderPluginError(f"{where}: its module cannot be found ({exc})", "install the package, or correct the entry point's module path") from None
    if spec is None:
        raise GraderPluginError(f"{where}: its module cannot be found", "install the package, or correct the entry point's module path")
    if spec.submodule_search_locations is not None:
        raise GraderPluginError(f"{where}: {spec.origin} is a package", "point the entry point at one .py module (package.module), not at a package")
    origin = Path(spec.origin) if spec.origin else None
    if origin is None or origin.suffix != ".py" or not origin.is_file():
        raise GraderPluginError(f"{where}: {spec.origin} is not a Python source file", "ship the grader as a .py file")
    path = origin.resolve()
    try:
        data = path.read_bytes()
        if len(data) > MAX_PLUGIN_BYTES:
            raise GraderPluginError(f"{where}: {path} has {len(data)} bytes", f"keep a plugin grader under {MAX_PLUGIN_BYTES} bytes")
        text = data.decode("utf-8")
    except OSError as exc:
        raise GraderPluginError(f"{where}: {path} cannot be read ({exc.strerror})", "make the file readable") from None
    except UnicodeDecodeError as exc:
        raise GraderPluginError(f"{where}: {path} is not UTF-8 at byte {exc.start}", "save the file as UTF-8") from None
    problems = source_problems(text, str(path))
    if problems:
        listed = "; ".join(f"{path} line {line}: {problem}" if line else f"{path}: {problem}" for line, problem in problems)
        raise GraderPluginError(f"{where}: {listed}", RULES_FIX)
    return PluginGraderFile(name=name, module=module, distribution=distribution, path=path)


def load_plugin(plugin: PluginGraderFile) -> Any:
    """Import a checked plugin grader once and alias it as ``metarl_grader_NAME`` (where metarl/graders.py finds it)."""
    where = _where(plugin.name, plugin.module, plugin.distribution)
    try:
        module = importlib.import_module(plugin.module)
    except PLUGIN_IMPORT_ERRORS as exc:
        raise GraderPluginError(f"{where}: importing {plugin.path} failed: {type(exc).__name__}: {exc}", "fix the module so that it imports cleanly") from None
    loaded_from = getattr(module, "__file__", None)
    if loaded_from is None or Path(loaded_from).resolve() != plugin.path:
        raise GraderPluginError(f"{where}: the module imported from {loaded_from}, not the checked file {plugin.path}", "remove the other copy from the path")
    missing = [name for name in REQUIRED_FUNCTIONS if not callable(getattr(module, name, None))]
    if missing:
        raise GraderPluginError(f"{where}: {plugin.path} leaves {', '.join(missing)} undefined after import", RULES_FIX)
    sys.modules[graders.plugin_module_name(plugin.name)] = module
    return module


def installed_entry_points(group: str) -> list[tuple[str, str, str]]:
    """(name, value, distribution) of every installed package's entry point in ``group``, each once."""
    found: set[tuple[str, str, str]] = set()
    for entry in entry_points(group=group):
        distribution = entry.dist.name if entry.dist is not None else "an unnamed distribution"
        found.add((entry.name, entry.value, distribution))
    return sorted(found)


def plugin_entries() -> list[tuple[str, str, str]]:
    """(name, module, distribution) of every installed package's plugin grader entry point."""
    return installed_entry_points(GRADER_ENTRY_POINT_GROUP)


def build_grader_registry(entries: Iterable[tuple[str, str, str]]) -> dict[str, PluginGraderFile]:
    """Checked plugin graders by name from (name, module, distribution) triples, each imported and aliased; a name registered twice is an error."""
    plugins: dict[str, PluginGraderFile] = {}
    for name, module, distribution in entries:
        if name in plugins:
            first = plugins[name]
            raise GraderPluginError(
                f"plugin grader {name!r} is registered by both {first.distribution} ({first.module}) and {distribution} ({module})",
                "uninstall one of the packages or rename one entry point",
            )
        plugins[name] = plugin_file(name, module, distribution)
    for plugin in plugins.values():
        load_plugin(plugin)
    return plugins


@functools.cache
def registered_graders() -> dict[str, PluginGraderFile]:
    """Every installed plugin grader, checked and loaded once per process."""
    return build_grader_registry(plugin_entries())


def refresh_graders() -> None:
    """Forget the registered plugin graders and their ``metarl_grader_*`` aliases (after installing or removing a plugin)."""
    registered_graders.cache_clear()
    for name in [name for name in sys.modules if name.startswith(graders.PLUGIN_MODULE_PREFIX)]:
        del sys.modules[name]


def grader_sources(grader: graders.Grader) -> dict[str, bytes]:
    """The source of each plugin grader a grader mapping uses, by name (what a pod's environment package ships)."""
    plugins = registered_graders()
    missing = [name for name in graders.plugin_names(grader) if name not in plugins]
    if missing:
        raise GraderPluginError(
            f"the grader uses plugin grader(s) {', '.join(map(repr, missing))}, which no installed package registers", _install_fix(plugins)
        )
    return {name: plugins[name].source() for name in graders.plugin_names(grader)}


def _install_fix(plugins: Mapping[str, PluginGraderFile]) -> str:
    known = f"registered: {', '.join(sorted(plugins))}" if plugins else "none is installed"
    return f"install the package that registers it under the entry-point group {GRADER_ENTRY_POINT_GROUP!r}, or name a registered one ({known})"


def option_problems(name: str, options: Mapping[str, Any]) -> list[str]:
    """What the plugin grader's ``check_options`` finds wrong with ``options`` (none when it defines no such function)."""
    module = graders.plugin_module(name)
    check = getattr(module, "check_options", None)
    if check is None:
        return []
    where = f"plugin grader {name!r} ({registered_graders()[name].path})"
    try:
        found = check(dict(options))
    except PLUGIN_IMPORT_ERRORS as exc:
        raise GraderPluginError(
            f"{where}: check_options raised {type(exc).__name__}: {exc}", "make check_options return a list of problems instead of raising"
        ) from None
    if not isinstance(found, list) or not all(isinstance(problem, str) for problem in found):
        raise GraderPluginError(
            f"{where}: check_options returned {type(found).__name__}", "make check_options return a list of strings (empty when the options are fine)"
        )
    return found


def grader_problems(grader: graders.Grader, field: str = "grader") -> list[FieldProblem]:
    """Problems of the plugin graders a grader mapping names (``field`` is its place in the spec): unregistered, or options refused."""
    if grader.get("kind") != graders.PLUGIN_KIND:
        inner = grader.get("inner")
        return grader_problems(inner, f"{field}.inner") if isinstance(inner, Mapping) else []
    plugins = registered_graders()
    name = str(grader["plugin"])
    if name not in plugins:
        return [FieldProblem(field=f"{field}.plugin", message=f"no plugin grader {printable(name)!r} is registered", fix=_install_fix(plugins))]
    return [
        FieldProblem(
            field=f"{field}.options",
            message=printable(problem)[:500],
            fix=f"correct the options for plugin grader {name!r} (see {plugins[name].path})",
        )
        for problem in option_problems(name, grader.get("options", {}))[:20]
    ]
