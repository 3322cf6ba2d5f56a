"""Issue 41: the store has one front door. Code outside metarl/store (tests and migrations aside) imports store names
from `metarl.store` only, never from a module inside it; every exported name loads, and loading the package alone
imports no SQLAlchemy (so `metarl status` stays light)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import metarl.store as store

REPO = Path(__file__).resolve().parents[2]
SUBMODULES = {path.stem for path in (REPO / "metarl" / "store").glob("*.py") if path.stem != "__init__"}


def back_doors(source: str) -> list[str]:
    """The imports of a module that reach inside the store (pure)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("metarl.store."):
                found.append(f"from {node.module} import ...")
            elif node.module == "metarl.store":
                found += [f"from metarl.store import {alias.name}" for alias in node.names if alias.name in SUBMODULES]
        elif isinstance(node, ast.Import):
            found += [f"import {alias.name}" for alias in node.names if alias.name.startswith("metarl.store.")]
    return found


def test_the_checker_sees_a_back_door() -> None:
    assert back_doors("from metarl.store.claims import Claim\nfrom metarl.store import db\nimport metarl.store.records\n") == [
        "from metarl.store.claims import ...",
        "from metarl.store import db",
        "import metarl.store.records",
    ]
    assert back_doors("from metarl.store import Claim, runs_transaction\n") == []


def test_code_outside_the_store_uses_only_its_front_door() -> None:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = [name for name in listed if not name.startswith(("metarl/store/", "tests/", "migrations/"))]
    assert len(outside) > 50
    found = {name: doors for name in outside if (doors := back_doors((REPO / name).read_text(encoding="utf-8")))}
    assert found == {}, found


def test_every_exported_name_loads_and_is_listed() -> None:
    assert store.__all__ == sorted(store._EXPORTS)
    assert not set(store._EXPORTS) & SUBMODULES, "an export named as a submodule is replaced by the module once it loads"
    for name in store.__all__:
        assert getattr(store, name) is not None, name


def test_the_package_alone_imports_no_sqlalchemy() -> None:
    code = "import sys, metarl.store as s; s.RunIdError; s.without_password; print('sqlalchemy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
