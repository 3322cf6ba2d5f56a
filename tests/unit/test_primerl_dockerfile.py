"""docker/inner.Dockerfile cannot be built here: parse it and hold it to the pin and the runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

from metarl.primerl import pin

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
    assert entry == [["/app/docker-entrypoint.sh", "/opt/metarl-runner/bin/python", "-m", "metarl.pod_supervisor"]]
    assert [word for word, _ in instructions()][-1] == "CMD"
    assert ("USER", "appuser") in instructions()


def test_copied_files_exist_in_the_build_context() -> None:
    copies = [rest.split() for word, rest in instructions() if word == "COPY"]
    sources = [part for copy in copies for part in copy[:-1] if not part.startswith("--")]
    assert sources
    for source in sources:
        assert (CONTEXT / source).exists(), source
    assert {"pod_runner.py", "pod_supervisor.py", "pod_eval.py", "pod_scoring.py", "pod_lora_merge.py", "__init__.py", "primerl/"} <= set(sources)


def test_runner_imports_only_what_the_image_installs() -> None:
    """The runner venv has pydantic, fsspec and s3fs: the runner and the modules it imports use nothing else."""
    allowed = {"pydantic", "fsspec", "metarl"}
    stdlib_like = re.compile(r"^(from|import) (__future__|argparse|base64|fnmatch|json|os|re|shutil|signal|subprocess|sys|time|tomllib|hashlib|collections|pathlib|typing)\b")
    runner_modules = ("pod_runner.py", "pod_supervisor.py", "pod_eval.py", "primerl/manifest.py", "primerl/pin.py")
    for path in (REPO / "metarl" / name for name in runner_modules):
        for line in path.read_text().splitlines():
            if re.match(r"^\s*(from \S+ import|import \S+)", line) and not stdlib_like.match(line.strip()):
                module = line.split()[1].split(".")[0]
                assert module in allowed, f"{path.name}: {line.strip()}"
    for name in ("pod_runner.py", "pod_supervisor.py", "pod_eval.py"):
        for line in (REPO / "metarl" / name).read_text().splitlines():
            if line.lstrip().startswith("from metarl"):
                assert line.split()[1] in ("metarl.pod_runner", "metarl.pod_eval", "metarl.primerl.manifest", "metarl.primerl.pin"), line
    installs = " ".join(rest for word, rest in instructions() if word == "RUN")
    for package in ("pydantic==", "fsspec==", "s3fs=="):
        assert package in installs


def test_pod_scripts_import_nothing_of_metarl() -> None:
    """The merge and scoring scripts run by path with prime-rl's Python, where metarl is not importable."""
    for name in ("pod_scoring.py", "pod_lora_merge.py"):
        for line in (REPO / "metarl" / name).read_text().splitlines():
            assert not re.match(r"^\s*(from|import) metarl\b", line), f"{name}: {line.strip()}"


def test_the_agent_cannot_sudo_or_rewrite_the_runner() -> None:
    runs = " ".join(rest for word, rest in instructions() if word == "RUN")
    assert "NOPASSWD:ALL$/d' /etc/sudoers" in runs and "gpasswd -d appuser sudo" in runs
    assert "chown -R root:root /opt/metarl-runner" in runs and "chown -R appuser:appuser /opt/metarl-runner" not in runs
    envs = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "METARL_RUNNER_AGENT_SWEEP=uid" in envs
    manifest = "/opt/metarl-runner/scoring-stack.json"
    assert f"-m metarl.pod_eval --write-manifest {manifest} /app/.venv /app/src" in runs and f"METARL_RUNNER_EVAL_STACK_MANIFEST={manifest}" in envs
    assert runs.index("--write-manifest") > runs.index('"setuptools>=64"'), "the manifest must record the venv after the image's own installs"
