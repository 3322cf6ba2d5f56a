"""The import-linter contracts in pyproject.toml: they pass, they cover every module, and breaking one fails.

`lint-imports` reads `[tool.importlinter]`; CI runs it too (.ci/run). Here it also runs on a copy of the
packages with one rule broken on purpose, to show each contract fails when its rule is broken.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("metarl_cli", "orchestrator", "workers", "metarl", "schemas")
POD = "metarl.backends.runpod.pod"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def modules_of(package: str) -> set[str]:
    root = REPO / package
    return {".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for path in root.rglob("*.py") if "__pycache__" not in path.parts}


def test_the_contracts_hold() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-4000:]
    assert done.stdout.count("KEPT") == len(contracts())


def test_the_pod_contract_forbids_every_server_side_module() -> None:
    """A new module of metarl is server side unless it lives in the pod subpackage: the list must name it."""
    [pod] = [contract for contract in contracts() if contract.get("source_modules") == [POD]]
    forbidden = set(pod["forbidden_modules"])
    pod_ancestors = {POD.rsplit(".", depth)[0] for depth in range(1, POD.count(".") + 1)}
    for module in sorted(modules_of("metarl")):
        if module == POD or module.startswith(POD + ".") or module in pod_ancestors:
            continue
        assert any(module == name or module.startswith(name + ".") for name in forbidden), f"{module} is missing from the pod contract"
    assert {"metarl_cli", "orchestrator", "workers", "schemas", "sqlalchemy", "psycopg", "celery"} <= forbidden


BREAKS = {
    "layers": ("metarl/store/violation_for_test.py", "import orchestrator.loop\n"),
    "store": ("orchestrator/violation_for_test.py", "import sqlalchemy\n"),
    "pod": ("metarl/backends/runpod/pod/violation_for_test.py", "from metarl.store import db\n"),
    "inner layers": ("metarl/learning/violation_for_test.py", "import metarl.sandbox.parent\n"),
    "inner siblings": ("metarl/store/violation_for_test.py", "import metarl.backends.local.train\n"),
}


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_breaking_a_rule_on_purpose_fails(rule: str, tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    assert lint_imports(tmp_path).returncode == 0, "the copy must pass before it is broken"
    path, line = BREAKS[rule]
    (tmp_path / path).write_text(line)
    broken = lint_imports(tmp_path)
    assert broken.returncode != 0 and "BROKEN" in broken.stdout, broken.stdout[-2000:]
    assert "violation_for_test" in broken.stdout
