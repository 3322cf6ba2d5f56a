"""docker/inner.Dockerfile cannot be built here: parse it and hold it to the pin and the runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

from metarl.backends.runpod.pod import pin

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "inner.Dockerfile"
CONTEXT = REPO / "metarl"  # the build context named in the Dockerfile's header


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args() -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)


def test_base_image_and_build_args_match_the_pin() -> None:
    values = args()
    assert values["PRIME_RL_IMAGE"] == pin.PRIME_RL_IMAGE
    assert pin.PRIME_RL_IMAGE.endswith(":" + pin.PRIME_RL_TAG)
    assert values["PRIME_RL_TAG"] == pin.PRIME_RL_TAG == "v0.8.0"
    assert values["PRIME_RL_VERSION"] == pin.PRIME_RL_VERSION
    assert values["PRIME_RL_COMMIT"] == pin.PRIME_RL_COMMIT
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert froms == ["${PRIME_RL_IMAGE}"]


def test_the_build_refuses_another_prime_rl_version() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "m.version('prime-rl')" in runs and "${PRIME_RL_VERSION}" in runs
    assert "import verifiers, datasets" in runs


def test_entrypoint_runs_the_pod_supervisor_through_prime_rls_entry_script() -> None:
    entry = [json.loads(rest) for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry == [["/app/docker-entrypoint.sh", "/opt/metarl-runner/bin/python", "-m", "metarl.backends.runpod.pod.supervisor"]]
    assert [word for word, _ in instructions()][-1] == "CMD"
    assert ("USER", "appuser") in instructions()


POD = CONTEXT / "backends" / "runpod" / "pod"
POD_SCRIPTS = ("scoring.py", "lora_merge.py")
"""Pod scripts run by path with prime-rl's own Python, where metarl is not importable."""
RUNNER_DEPENDENCIES = ("pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection", "fsspec")
"""What the image's runner venv installs (pydantic, fsspec; s3fs loads only for s3:// URLs) with what pydantic needs."""


def test_copied_files_exist_in_the_build_context() -> None:
    copies = [rest.split() for word, rest in instructions() if word == "COPY"]
    sources = [part for copy in copies for part in copy[:-1] if not part.startswith("--")]
    assert sources
    for source in sources:
        assert (CONTEXT / source).exists(), source
    # the pod subpackage, and only the (docstring-only) package files above it
    assert set(sources) == {"__init__.py", "backends/__init__.py", "backends/runpod/__init__.py", "backends/runpod/pod/"}
    for init in ("__init__.py", "backends/__init__.py", "backends/runpod/__init__.py"):
        assert not re.search(r"^\s*(from|import) ", (CONTEXT / init).read_text(), re.M), f"{init} must import nothing: the image has only the pod subpackage"


def test_the_pod_subpackage_imports_with_only_the_images_dependencies(tmp_path: Path) -> None:
    """Copy the subpackage as the Dockerfile does and import every module with any other top-level package refused."""
    import shutil
    import subprocess
    import sys

    target = tmp_path / "src" / "metarl"
    for init in ("__init__.py", "backends/__init__.py", "backends/runpod/__init__.py"):
        (target / init).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(CONTEXT / init, target / init)
    shutil.copytree(POD, target / "backends" / "runpod" / "pod", ignore=shutil.ignore_patterns("__pycache__"))
    modules = [f"metarl.backends.runpod.pod.{path.stem}" for path in sorted(POD.glob("*.py")) if path.stem != "__init__"]
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path / "src")!r})
allowed = set(sys.stdlib_module_names) | {set(RUNNER_DEPENDENCIES) | {"metarl"}!r}
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in allowed and not name.startswith("_sysconfigdata"):
            raise ImportError("the pod image has no " + name)
        return None
sys.meta_path.insert(0, Refuse())
import importlib
for name in {modules!r}:
    module = importlib.import_module(name)
    assert module.__file__.startswith({str(tmp_path)!r}), module.__file__
print("ok", len({modules!r}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", str(len(modules))] and len(modules) >= 7


def test_runner_dependencies_are_what_the_image_installs() -> None:
    installs = " ".join(rest for word, rest in instructions() if word == "RUN")
    for package in ("pydantic==", "fsspec==", "s3fs=="):
        assert package in installs


def test_pod_scripts_import_nothing_of_metarl() -> None:
    for name in POD_SCRIPTS:
        for line in (POD / name).read_text().splitlines():
            assert not re.match(r"^\s*(from|import) metarl\b", line), f"{name}: {line.strip()}"


def test_the_agent_cannot_sudo_or_rewrite_the_runner() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "NOPASSWD:ALL$/d' /etc/sudoers" in runs and "gpasswd -d appuser sudo" in runs
    assert "chown -R root:root /opt/metarl-runner" in runs and "chown -R appuser:appuser /opt/metarl-runner" not in runs
    envs = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "METARL_RUNNER_AGENT_SWEEP=uid" in envs
    manifest = "/opt/metarl-runner/scoring-stack.json"
    assert (
        f"-m metarl.backends.runpod.pod.eval_server --write-manifest {manifest} /app/.venv /app/src" in runs
        and f"METARL_RUNNER_EVAL_STACK_MANIFEST={manifest}" in envs
    )
    assert runs.index("--write-manifest") > runs.index('"setuptools>=64"'), "the manifest must record the venv after the image's own installs"
