"""A Python 3.12 virtual environment holding prime-rl's own config classes and launcher at the pinned tag.

Used by ``scripts/derive_primerl_schema.py`` and ``scripts/check_bundles_with_primerl.py``; run
them with the project's interpreter from the repository root. Nothing here is imported by metarl.

What the environment holds:

- ``packages/prime-rl-configs`` installed from a prime-rl checkout at the tag (the slim config
  package: ``prime_rl.configs`` and ``prime_rl.utils.{config,validation,parsers}``);
- its three path dependencies, which the tag pins as git submodules, from the package registry at
  the versions that match those submodule commits (:data:`SUBMODULE_RELEASES`);
- every other package at the version of the tag's ``uv.lock`` (passed to pip as constraints), so
  pydantic, pydantic-core and transformers are the tag's;
- the launcher's light imports (:data:`LAUNCHER_PACKAGES`), so ``prime_rl.entrypoints.rl`` from the
  checkout's ``src/`` (put on ``PYTHONPATH``, unmodified) runs ``rl @ rl.toml --dry-run``.

The GPU stack (torch, vLLM, flash-attn) is not installed: the dry run never imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metarl.backends.runpod.pod.pin import PRIME_RL_COMMIT, PRIME_RL_TAG, VERIFIERS_COMMIT  # noqa: E402

SUBMODULE_RELEASES: dict[str, tuple[str, str]] = {
    "verifiers": (
        "0.2.2.dev76",
        f"deps/verifiers at {VERIFIERS_COMMIT[:9]} is `git describe` v0.2.1-76-gd30a3f48e; hatch-vcs names that 0.2.2.dev76, "
        "the floor prime-rl-configs' pyproject sets",
    ),
    "renderers": (
        "0.1.9.dev10",
        "deps/renderers at d4707862 was set by prime-rl 9f0d41e23, the commit that also raised prime-rl-configs' floor to "
        "renderers>=0.1.9.dev10; the registry wheel carries no commit id, so this is the closest match",
    ),
    "prime-pydantic-config": (
        "0.4.2",
        "deps/pydantic-config at 4f5ae373 is its v0.4.2 (prime-rl 445392294: 'deps/pydantic-config -> v0.4.2 (4f5ae37)')",
    ),
}
"""Registry release used for each submodule-pinned package of the tag: (version, why it matches)."""

LAUNCHER_PACKAGES = ("nvidia-ml-py", "psutil", "setproctitle", "jinja2", "loguru", "tomli-w")
"""Imports of ``prime_rl.entrypoints.rl`` and the modules it loads beyond prime-rl-configs (versions from uv.lock)."""

PYTHON_CANDIDATES = ("python3.12", "/root/.pyenv/versions/3.12.1/bin/python3.12")
STAMP_FILE = "metarl-primerl-env.json"


class TagEnvError(RuntimeError):
    """The checkout or the environment is not what the pinned tag needs."""


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command, raising TagEnvError with its output when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise TagEnvError(f"{' '.join(command[:6])} ... failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def check_checkout(checkout: Path) -> None:
    """The checkout must be prime-rl at the pinned commit (a clean ``git worktree add ... v0.8.0``)."""
    if not (checkout / "packages" / "prime-rl-configs" / "pyproject.toml").is_file():
        raise TagEnvError(f"{checkout} is not a prime-rl checkout (no packages/prime-rl-configs)")
    head = run(["git", "-C", str(checkout), "rev-parse", "HEAD"]).stdout.strip()
    if head != PRIME_RL_COMMIT:
        raise TagEnvError(f"{checkout} is at {head}, not {PRIME_RL_TAG} ({PRIME_RL_COMMIT}); check out the tag")
    dirty = run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    if dirty:
        raise TagEnvError(f"{checkout} has local changes; the checks use the tag's code unmodified:\n{dirty[:500]}")


def lock_constraints(checkout: Path) -> list[str]:
    """``name==version`` of every registry package in the tag's uv.lock (the tag's resolution)."""
    lock = tomllib.loads((checkout / "uv.lock").read_text())
    pins = {}
    for package in lock.get("package", []):
        source = package.get("source", {})
        if "registry" in source and "version" in package and package["name"] not in SUBMODULE_RELEASES:
            pins[package["name"]] = package["version"]
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def find_python(explicit: str | None) -> str:
    """A Python 3.12 interpreter (prime-rl-configs requires ~=3.12.0)."""
    for candidate in ([explicit] if explicit else []) + [os.environ.get("METARL_PYTHON312", "")] + list(PYTHON_CANDIDATES):
        if not candidate:
            continue
        found = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if not found:
            continue
        probe = subprocess.run([found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "3.12":
            return found
    raise TagEnvError("no Python 3.12 found: pass --python /path/to/python3.12 (prime-rl-configs requires ~=3.12.0)")


def requirements(checkout: Path) -> list[str]:
    """What pip installs into the environment."""
    pinned = [f"{name}=={version}" for name, (version, _) in SUBMODULE_RELEASES.items()]
    return [str(checkout / "packages" / "prime-rl-configs"), *pinned, *LAUNCHER_PACKAGES]


def ensure_env(venv: Path, checkout: Path, python: str | None = None) -> Path:
    """Create (once) the environment at ``venv``; returns its interpreter. Reinstalls when the inputs changed."""
    check_checkout(checkout)
    wanted = {"tag": PRIME_RL_TAG, "commit": PRIME_RL_COMMIT, "requirements": requirements(checkout), "constraints": lock_constraints(checkout)}
    interpreter = venv / "bin" / "python"
    stamp = venv / STAMP_FILE
    if interpreter.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return interpreter
    if not interpreter.is_file():
        run([find_python(python), "-m", "venv", str(venv)])
    constraints = venv / "uv-lock-constraints.txt"
    constraints.write_text("\n".join(wanted["constraints"]) + "\n")
    run([str(interpreter), "-m", "pip", "install", "-q", "-c", str(constraints), *wanted["requirements"]])
    stamp.write_text(json.dumps(wanted, indent=1))
    return interpreter


def installed_versions(interpreter: Path) -> dict[str, str]:
    """Versions of the packages that decide the schema, as installed in the environment."""
    names = ["prime-rl-configs", *SUBMODULE_RELEASES, "pydantic", "pydantic-core", "transformers"]
    code = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    return json.loads(run([str(interpreter), "-c", code, *names]).stdout)
