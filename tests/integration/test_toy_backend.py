"""Adding a backend touches one folder and one registry line.

A copy of the project gets a `toy` train backend: a folder `metarl/backends/toy/` (its config model,
its class, its dry-run plan) and one line in `schemas/backend_registry.py`, nothing else. On that
copy a run config with `[backends.train] type = "toy"` loads, dry-runs with the toy's own cost
line, and runs one outer step end to end on the embedded default, the toy's charges in the ledger.
The unchanged project refuses the same config and names the types it has.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("metarl", "schemas", "workers", "orchestrator", "metarl_cli", "migrations", "tasks_specs")
REGISTRY = Path("schemas/backend_registry.py")

TOY_CONFIG = '''"""Config model of the `toy` train backend (a test's backend: every job finishes at once)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from schemas.backend_config import TrainBackendConfig


class ToyTrainBackend(TrainBackendConfig):
    """A train backend whose jobs succeed at their first poll, each charged one toy second."""

    type: Literal["toy"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.toy.train:ToyTrain"
    planner: ClassVar[str] = "metarl.backends.toy.plan:train_plan"
    weights: ClassVar[str] = "simulated"
    usd_per_job: float = Field(default=0.25, ge=0.0, le=10.0, description="Charge of one job")


CONFIGS = (ToyTrainBackend,)
'''

TOY_TRAIN = '''"""The `toy` train backend: launch records the job, the first poll finishes it."""

from __future__ import annotations

from typing import Any

from metarl.backends.toy.config import ToyTrainBackend
from metarl.interfaces import BackendServices, CostItem, EpisodeContext, LaunchResult, PollResult
from schemas.backend_config import expect_config
from schemas.job import JobSpec
from schemas.run_config import RunConfig


class ToyTrain:
    """Every job succeeds at once."""

    name = "toy"
    simulated = True

    def __init__(self, config: ToyTrainBackend):
        self.config = config

    @classmethod
    def from_run_config(cls, config: RunConfig, services: BackendServices) -> ToyTrain:
        return cls(expect_config(config.backends.train, ToyTrainBackend))

    def capacity(self) -> int:
        return 4

    def poll_interval_s(self) -> float:
        return 0.1

    def launch(self, ctx: EpisodeContext, job: JobSpec, job_name: str) -> LaunchResult:
        return LaunchResult(external_id=f"toy-{job_name}", state={})

    def poll(self, ctx: EpisodeContext, job: JobSpec, external_id: str, state: dict[str, Any]) -> PollResult:
        cost = CostItem(source="toy", description="toy job", quantity=1.0, unit="job", unit_price_usd=self.config.usd_per_job, key=f"toy:{external_id}")
        return PollResult(status="succeeded", state=state, train_seconds=1.0, checkpoint_uri=f"sim://{external_id}/final", costs=[cost])
'''

TOY_PLAN = '''"""The dry-run plan of the `toy` train backend."""

from __future__ import annotations

from metarl.backends.toy.config import ToyTrainBackend
from metarl.planning import CostLine, PlanInputs, StagePlan


def train_plan(backend: ToyTrainBackend, inputs: PlanInputs) -> StagePlan:
    usd = inputs.counts.total * backend.usd_per_job
    return StagePlan(cost=CostLine(stage="train", backend="toy", usd=usd, upper_usd=usd, kind="simulated", basis=f"toy: ${backend.usd_per_job:g} per job"))
'''

RUN_CONFIG = """
[run]
name = "toy-run"
tasks = ["addition", "date_format"]
task_specs_dir = "{specs}"
max_outer_steps = 1

[backends.agent]
type = "sim"
invalid_rate = 0.0
duration = {{ median_s = 0.05, sigma = 0.0, max_s = 1.0 }}

[backends.train]
type = "toy"
usd_per_job = 0.25

[backends.eval]
type = "sim"

[backends.outer]
type = "sim"

[window]
in_flight = 4
tick_s = 0.2

[outer]
group_size = 2
groups_per_batch = 1
"""


def project_copy(root: Path) -> Path:
    """The project's packages, copied as they are."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def add_toy_backend(root: Path) -> None:
    """The whole change: one new folder and one registry line."""
    folder = root / "metarl" / "backends" / "toy"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""The `toy` backend."""\n')
    (folder / "config.py").write_text(TOY_CONFIG)
    (folder / "train.py").write_text(TOY_TRAIN)
    (folder / "plan.py").write_text(TOY_PLAN)
    registry = root / REGISTRY
    text = registry.read_text()
    anchor = '    "tinker": "metarl.backends.tinker.config",\n'
    assert anchor in text, "the registry's last line moved: update this test's anchor"
    registry.write_text(text.replace(anchor, anchor + '    "toy": "metarl.backends.toy.config",\n'))


def changed_files(original: Path, copy: Path) -> list[str]:
    """Files of the copy that differ from the project's or are new (relative paths)."""
    changed = []
    for path in sorted(copy.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(copy)
        source = original / relative
        if not source.exists() or not filecmp.cmp(source, path, shallow=False):
            changed.append(str(relative))
    return changed


def metarl(root: Path, home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root), "METARL_HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
    for variable in ("METARL_DATABASE_URL", "METARL_BROKER_URL"):
        env.pop(variable, None)
    command = [sys.executable, "-c", "import sys; from metarl_cli.main import main; sys.exit(main(sys.argv[1:]))", *args]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def write_config(path: Path, specs: Path) -> Path:
    path.write_text(RUN_CONFIG.format(specs=specs))
    return path


def test_the_project_refuses_a_train_type_no_vendor_registers(tmp_path: Path) -> None:
    config = write_config(tmp_path / "toy.toml", REPO / "tasks_specs")
    result = metarl(REPO, tmp_path / "home", "run", str(config), "--dry-run", timeout=60)
    assert result.returncode != 0
    assert "backends.train" in result.stderr + result.stdout and "'runpod'" in result.stderr + result.stdout


@pytest.mark.slow
def test_a_toy_backend_is_one_folder_and_one_registry_line(tmp_path: Path) -> None:
    root = project_copy(tmp_path / "project")
    add_toy_backend(root)
    assert changed_files(REPO, root) == [
        "metarl/backends/toy/__init__.py",
        "metarl/backends/toy/config.py",
        "metarl/backends/toy/plan.py",
        "metarl/backends/toy/train.py",
        str(REGISTRY),
    ]
    config = write_config(tmp_path / "toy.toml", root / "tasks_specs")
    home = tmp_path / "home"

    plan = metarl(root, home, "run", str(config), "--dry-run", "--json", timeout=60)
    assert plan.returncode == 0, plan.stderr
    document = json.loads(plan.stdout)
    assert document["backends"]["train"] == "toy"
    [train_line] = [line for line in document["estimate"]["lines"] if line["stage"] == "train"]
    episodes = document["estimate"]["episodes"]["total"]
    assert train_line["basis"] == "toy: $0.25 per job" and train_line["usd"] == pytest.approx(0.25 * episodes)

    run = metarl(root, home, "run", str(config), timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    run_id = run.stdout.split("run ", 1)[1].split(" ", 1)[0]
    status = metarl(root, home, "status", run_id, "--json", timeout=60)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["run"]["status"] == "finished"
    [toy] = [cost for cost in document["costs"] if cost["source"] == "toy"]
    assert toy["entries"] >= 2 and toy["usd"] == pytest.approx(0.25 * toy["entries"])
