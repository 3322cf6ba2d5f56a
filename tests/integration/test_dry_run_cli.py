"""The real `metarl run CONFIG --dry-run` on the shipped examples: the plan is printed, and no API,
service or file is touched.

Every endpoint the run could reach (Runpod, Tinker, an HTTP proxy, the Hugging Face hub, and in
services mode the database and broker) points at one listening socket on 127.0.0.1 that records
each connection; the API keys are set, so a stray SDK call would connect rather than fail early.
METARL_HOME, the model cache and the working folder must stay untouched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, metarl_cli

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples"
EXIT_CONFIG_ERROR = 2


class ConnectionRecorder:
    """A TCP listener on 127.0.0.1 that accepts and counts every connection."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            connection.close()

    def count(self) -> int:
        """Connections so far, once any still in the listen backlog have been accepted."""
        time.sleep(0.3)
        return self.connections

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()


@pytest.fixture
def recorder() -> Iterator[ConnectionRecorder]:
    listener = ConnectionRecorder()
    yield listener
    listener.close()


@pytest.fixture
def sandbox(tmp_path: Path, recorder: ConnectionRecorder) -> tuple[dict[str, str], Path]:
    """Environment with every endpoint on the recorder, and an empty working folder."""
    url = f"http://127.0.0.1:{recorder.port}"
    env = {key: value for key, value in os.environ.items() if key not in ("METARL_DATABASE_URL", "METARL_BROKER_URL")}
    env.update(
        METARL_HOME=str(tmp_path / "home"),
        METARL_CACHE_DIR=str(tmp_path / "cache"),
        RUNPOD_API_BASE_URL=f"{url}/graphql",
        RUNPOD_API_KEY="dry-run-test-key",
        TINKER_BASE_URL=url,
        TINKER_API_KEY="dry-run-test-key",
        HF_ENDPOINT=url,
        HTTP_PROXY=url,
        HTTPS_PROXY=url,
        http_proxy=url,
        https_proxy=url,
        NO_PROXY="",
        no_proxy="",
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return env, cwd


def dry_run(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder, *args: str) -> str:
    """Run the CLI, check it touched nothing, and return its stdout."""
    env, cwd = sandbox
    result = metarl_cli(["run", *args, "--dry-run"], env, timeout=180, cwd=cwd)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr
    assert recorder.count() == 0, "the dry run opened a network connection"
    assert not Path(env["METARL_HOME"]).exists(), "the dry run wrote under METARL_HOME"
    assert not Path(env["METARL_CACHE_DIR"]).exists(), "the dry run created the model cache"
    assert list(cwd.iterdir()) == [], "the dry run wrote into the working folder"
    return result.stdout


def test_the_recorder_sees_traffic_through_the_environment(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    """Control: an HTTP request made under the sandbox environment lands on the recorder."""
    env, cwd = sandbox
    code = "import urllib.request\ntry:\n    urllib.request.urlopen('http://api.runpod.example/graphql', timeout=5)\nexcept OSError:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, timeout=30, check=True)
    assert recorder.count() >= 1


def test_runpod_example(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    out = dry_run(sandbox, recorder, str(EXAMPLES / "runpod.toml"), "--usd-per-gpu-hour", "NVIDIA A40=0.44")
    for expected in (
        "nothing launched, no API called, nothing written",
        "backends: agent=local  train=runpod  eval=pod_vllm  outer=local",
        "not started",
        "image      ghcr.io/your-org/metarl-inner:prime-rl-v0.8.0 (prime-rl v0.8.0, base ghcr.io/primeintellect-ai/prime-rl:v0.8.0)",
        "2x NVIDIA A40, then NVIDIA RTX A6000, NVIDIA L40S on capacity errors; SECURE cloud",
        "names      metarl-<run id[:8]>-<episode id>, then -r<k> after restart k (e.g. metarl-1a2b3c4d-17)",
        "tasks addition, reversal, caesar, max_of_list, sorting, date_format: validates against prime-rl's derived schema and cross-field rules",
        "total      404",
        "train  runpod  $147.09 (worst case $404.15)",
        "image pull    528 s  $0.1291",
        "eval wait     60 s  $0.0147",
        "per job     1675 s  $0.4094 (hidden eval included); beside the reference run: $0.13-0.30 per job on 2x A40 pods",
        "worst       7320 s  $1.0000",
        "(2 x idle_timeout_s 300 s, billed to no job)",
        "eval   pod_vllm $18.52",
        "budget max_run_usd $300.00",
    ):
        assert expected in out, expected
    rl_toml = out.split("  rl.toml:\n", 1)[1].split("\n\n", 1)[0]  # up to the first blank line: the top-level keys
    assert {"output_dir", "max_steps", "seq_len"} <= set(tomllib.loads("\n".join(line[4:] for line in rl_toml.splitlines())))
    for table in (
        "[model]",
        "[deployment]",
        "[trainer.optim]",
        "[orchestrator]",
        "[orchestrator.renderer]",
        "[orchestrator.train.sampling]",
        "[inference.model]",
    ):
        assert f"    {table}" in out, table
    assert "base model" not in out  # the pods score the hub models: nothing to build here


def test_runpod_example_as_json_with_the_configs_price_estimate(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    plan = json.loads(dry_run(sandbox, recorder, str(EXAMPLES / "runpod.toml"), "--json"))
    assert plan["pods"]["image"] == "ghcr.io/your-org/metarl-inner:prime-rl-v0.8.0"
    assert plan["pods"]["gpu_types"][0] == "NVIDIA A40" and plan["pods"]["max_at_once"] == 16
    [compiled] = plan["compiled"]
    assert compiled["problems"] == [] and compiled["rl_config"]["orchestrator"]["renderer"] == {"name": "qwen3", "enable_thinking": False}
    assert tomllib.loads(compiled["rl_toml"]) == compiled["rl_config"]
    train = next(line for line in plan["estimate"]["lines"] if line["stage"] == "train")
    assert plan["pods"]["usd_per_gpu_hour"]["NVIDIA A40"] == 0.44 and plan["pods"]["usd_per_gpu_hour"]["NVIDIA L40S"] is None
    assert train["usd"] is not None and train["usd"] > 0 and not train.get("unavailable")
    # the worst case: every job at budget.max_job_usd, which counts its eval's pod seconds too, plus the idle warm pool at the end
    assert plan["estimate"]["upper_usd"] == pytest.approx(404.0 + 2 * 300 * 0.88 / 3600)
    assert {job["worst_usd"] for job in plan["job_costs"]} == {1.0} and all(
        job["fresh_pod_share"] == pytest.approx(16 / 404 + (1 - 16 / 404) * (1 - 2 / 16)) for job in plan["job_costs"]
    )
    assert "AWS_SECRET_ACCESS_KEY" in plan["pods"]["storage_env"]


def test_tinker_example(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    out = dry_run(sandbox, recorder, str(EXAMPLES / "tinker.toml"))
    assert "backends: agent=tinker  train=local  eval=local  outer=tinker" in out
    assert "agent  tinker  $138.02  [upper bound]" in out
    assert "outer  tinker  $11.80  [upper bound]" in out
    assert "the cap would bind" in out and "max_run_usd $50.00" in out
    assert "Pods" not in out and "rl.toml" not in out.split("Notes")[0]


def test_sim_example(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    out = dry_run(sandbox, recorder, str(EXAMPLES / "sim.toml"))
    assert "[SIMULATOR] a simulated GPU cloud" in out and "no pods" in out
    assert "train  sim     $0.006356 (worst case $0.06)  [simulated]" in out
    assert "the cap does not bind" in out
    assert "base model" not in out  # the simulator builds no model


def test_quickstart_example(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    env, _ = sandbox
    out = dry_run(sandbox, recorder, str(EXAMPLES / "quickstart.toml"))
    assert "inner jobs as local GRPO processes" in out and "no pods" in out
    cache = env["METARL_CACHE_DIR"]
    assert f"base model local-s (for Qwen/Qwen3-0.6B, scale 1) to build on first use: {cache}/local-s-" in out
    assert f"base model local-l (for Qwen/Qwen3-1.7B, scale 1) to build on first use: {cache}/local-l-" in out
    assert "total  $0.00; worst case $0.00" in out


def test_services_mode_contacts_no_database_or_broker(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    env, cwd = sandbox
    env = dict(
        env,
        METARL_DATABASE_URL=f"postgresql+psycopg://metarl:secret@127.0.0.1:{recorder.port}/metarl",
        METARL_BROKER_URL=f"redis://127.0.0.1:{recorder.port}/0",
    )
    out = dry_run((env, cwd), recorder, str(EXAMPLES / "sim.toml"))
    assert "services mode" in out and "not contacted" in out
    assert "secret" not in out


def test_bad_config_fails_as_run_does(tmp_path: Path, sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    env, cwd = sandbox
    config = tmp_path / "run.toml"
    config.write_text((EXAMPLES / "runpod.toml").read_text().replace("gpu_count = 2", "gpu_count = 0").replace('"../tasks_specs"', f'"{REPO / "tasks_specs"}"'))
    dry = metarl_cli(["run", str(config), "--dry-run"], env, timeout=60, cwd=cwd)
    real = metarl_cli(["run", str(config), "--no-workers", "--quiet"], env, timeout=60, cwd=cwd)
    assert dry.returncode == real.returncode == EXIT_CONFIG_ERROR
    assert dry.stderr == real.stderr and "backends.train.gpu_count" in dry.stderr and "Fix:" in dry.stderr
    assert dry.stdout == "" and "Traceback" not in dry.stderr
    assert recorder.count() == 0 and not Path(env["METARL_HOME"]).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--usd-per-gpu-hour", "NVIDIA H100=2.0"], "is not one of backends.train.gpu_types"),
        (["--usd-per-gpu-hour", "NVIDIA A40"], "is not TYPE=USD"),
    ],
)
def test_bad_price_flag(args: list[str], message: str, sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    env, cwd = sandbox
    result = metarl_cli(["run", str(EXAMPLES / "runpod.toml"), "--dry-run", *args], env, timeout=60, cwd=cwd)
    assert result.returncode == EXIT_CONFIG_ERROR and result.stderr.startswith("error: ")
    assert "--usd-per-gpu-hour" in result.stderr and message in result.stderr and "Fix:" in result.stderr
    assert recorder.count() == 0


def test_dry_run_flags_need_dry_run(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    env, cwd = sandbox
    result = metarl_cli(["run", str(EXAMPLES / "sim.toml"), "--json"], env, timeout=60, cwd=cwd)
    assert result.returncode == EXIT_CONFIG_ERROR and "need --dry-run" in result.stderr
    assert not Path(env["METARL_HOME"]).exists() and recorder.count() == 0


def test_local_example_without_a_secret_writes_none_and_says_its_model_paths_are_provisional(
    sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder
) -> None:
    env, cwd = sandbox
    env = {key: value for key, value in env.items() if key not in ("METARL_EVAL_SECRET", "METARL_EVAL_SECRET_FILE")}
    out = dry_run((env, cwd), recorder, str(EXAMPLES / "local.toml"))
    assert "no hidden-eval secret yet" in out and "provisional" in out
    assert list(cwd.iterdir()) == [], "the dry run created a secret file"


def test_local_example_keys_its_model_paths_by_the_existing_secret_file(sandbox: tuple[dict[str, str], Path], recorder: ConnectionRecorder) -> None:
    env, cwd = sandbox
    env = {key: value for key, value in env.items() if key not in ("METARL_EVAL_SECRET", "METARL_EVAL_SECRET_FILE")}
    config = cwd.parent / "local.toml"
    config.write_text((EXAMPLES / "local.toml").read_text().replace('"../tasks_specs"', f'"{REPO / "tasks_specs"}"') + '\n[artifacts]\nroot = "arts"\n')
    key = cwd.parent / "arts" / "secrets" / "eval_partition.key"
    key.parent.mkdir(parents=True)
    key.write_text("a" * 64 + "\n")
    first = metarl_cli(["run", str(config), "--dry-run"], env, timeout=180, cwd=cwd.parent)
    key.write_text("b" * 64 + "\n")
    second = metarl_cli(["run", str(config), "--dry-run"], env, timeout=180, cwd=cwd.parent)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "no hidden-eval secret yet" not in first.stdout
    paths = [[line for line in result.stdout.splitlines() if "base model local-s" in line] for result in (first, second)]
    assert paths[0] and paths[0] != paths[1], "the model path does not follow the deployment's secret"
