"""Issue 41: no import cycle inside the library, between files or between folders.

Every import statement counts, the ones inside functions too (a lazy import is still a dependency);
only imports under ``if TYPE_CHECKING:`` are left out, since they never run. A folder is a direct
subfolder of ``metarl/`` (``metarl/store``, ``metarl/backends``...) or a loose module there; ``schemas``
is one folder.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("metarl", "schemas")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(tree: ast.AST, package: str) -> set[str]:
    """Modules (and module.name candidates) an AST imports at run time."""
    found: set[str] = set()
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(child) for statement in node.body for child in ast.walk(statement))
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports."""
    paths = [path for package in PACKAGES for path in (REPO / package).rglob("*.py")]
    modules = {module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = imported_names(ast.parse(path.read_text(encoding="utf-8")), package)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "metarl" else ".".join(parts[:2])


def folder_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for source, targets in graph.items():
        edges = folders.setdefault(folder_of(source), set())
        edges.update(folder_of(target) for target in targets if folder_of(target) != folder_of(source))
    return folders


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_loop_and_nothing_else() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import metarl.x\ndef f():\n    from . import y\n")
    assert imported_names(tree, "metarl.pkg") == {"typing", "typing.TYPE_CHECKING", "metarl.pkg", "metarl.pkg.y"}


def test_no_two_library_files_import_each_other_even_through_others() -> None:
    assert cycles(import_graph()) == []


def test_no_two_library_folders_import_each_other() -> None:
    assert cycles(folder_graph(import_graph())) == []
