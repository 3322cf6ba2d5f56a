"""A model that cannot fit the pods' trainer GPUs is refused at config load (no mode fits) and at the probe (the job's mode does not
fit), with the arithmetic in the message (metarl/backends/runpod/memory.py; issue 42, item 5)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from metarl import composition
from metarl.backends.runpod.memory import FULL_BYTES_PER_PARAMETER, RESERVE_GB, USABLE_FRACTION, memory_need, smallest_gpu
from metarl.runconfig import load_run
from schemas.base import ConfigError, validate_model
from schemas.job import JobModel, JobSpec
from schemas.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]


def test_full_fine_tuning_of_4b_needs_more_than_an_a40_and_lora_does_not() -> None:
    full = memory_need("Qwen/Qwen3-4B", False, 2, "NVIDIA A40", 48)
    lora = memory_need("Qwen/Qwen3-4B", True, 2, "NVIDIA A40", 48)
    assert full is not None and lora is not None
    assert full.per_gpu_gb == pytest.approx(4.0 * FULL_BYTES_PER_PARAMETER + RESERVE_GB) and not full.fits
    assert lora.fits and full.available_gb == pytest.approx(48 * USABLE_FRACTION)
    assert "4B parameters x 16 bytes / 1 trainer GPU(s) + 8 GB reserve = 72.0 GB per trainer GPU, against 45.6 GB usable" in full.arithmetic()
    small = memory_need("Qwen/Qwen3-1.7B", False, 2, "NVIDIA A40", 48)
    assert small is not None and small.fits  # the models the shipped tasks allow train in full on a 2x A40 pod
    sharded = memory_need("Qwen/Qwen3-4B", False, 8, "NVIDIA A40", 48)
    assert sharded is not None and sharded.fits  # four trainer GPUs share the state


def test_the_smallest_listed_gpu_decides() -> None:
    assert smallest_gpu(["NVIDIA A40", "NVIDIA RTX A5000"], {}) == ("NVIDIA RTX A5000", 24.0)
    assert smallest_gpu(["NVIDIA A40", "Some New GPU"], {}) is None
    assert smallest_gpu(["NVIDIA A40", "Some New GPU"], {"Some New GPU": 96}) == ("NVIDIA A40", 48.0)


def runpod_run(tmp_path: Path, allowed: list[str], gpu_types: list[str]) -> Path:
    data = tomllib.loads((REPO / "examples" / "runpod.toml").read_text())
    data["run"]["tasks"] = ["addition"]
    data["run"]["task_specs_dir"] = "specs"
    data["backends"]["train"]["gpu_types"] = gpu_types
    data["backends"]["train"]["estimated_usd_per_gpu_hour"] = {}
    spec = tomllib.loads((REPO / "tasks_specs" / "addition.toml").read_text())
    spec["budget"]["allowed_models"] = allowed
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "addition.toml").write_text(tomli_w.dumps(spec))
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def test_a_task_whose_model_fits_no_mode_on_the_listed_gpus_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_run(runpod_run(tmp_path, ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"], ["NVIDIA A40", "NVIDIA RTX A5000"]))
    [problem] = error.value.problems
    assert problem.field == "task addition: budget.allowed_models"
    assert "Qwen/Qwen3-8B cannot train on backends.train.gpu_types even with LoRA" in problem.message and "on a NVIDIA RTX A5000" in problem.message
    assert "drop Qwen/Qwen3-8B" in problem.fix


def test_a_gpu_type_of_unknown_memory_is_refused_with_the_field_to_set(tmp_path: Path) -> None:
    data = tomllib.loads((REPO / "examples" / "runpod.toml").read_text())
    data["backends"]["train"]["gpu_types"] = ["NVIDIA A40", "Some New GPU"]
    data["backends"]["train"]["estimated_usd_per_gpu_hour"] = {}
    with pytest.raises(ConfigError) as error:
        validate_model(RunConfig, data, "run.toml")
    [problem] = error.value.problems
    assert problem.field == "backends.train" and "'Some New GPU'" in problem.message and "gpu_memory_gb" in problem.fix
    data["backends"]["train"]["gpu_memory_gb"] = {"Some New GPU": 96}
    validate_model(RunConfig, data, "run.toml")


def test_the_probe_refuses_a_full_fine_tuning_job_that_does_not_fit_and_names_lora(tmp_path: Path) -> None:
    config, specs = load_run(runpod_run(tmp_path, ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B"], ["NVIDIA A40"]))
    checks = composition.probe_checks(config)
    task = specs["addition"]

    def problems(job: JobSpec) -> list[str]:
        return [f"{problem.field}: {problem.message} | {problem.fix}" for check in checks for problem in check(job, task) if "fit" in problem.message]

    [full] = problems(JobSpec(model=JobModel(name="Qwen/Qwen3-4B")))
    assert full.startswith("(runpod) model.name: Qwen/Qwen3-4B does not fit the pod's trainer GPU: full fine-tuning of Qwen/Qwen3-4B")
    assert "set model.lora_rank = 8" in full
    assert problems(JobSpec(model=JobModel(name="Qwen/Qwen3-4B", lora_rank=8))) == []
    assert problems(JobSpec(model=JobModel(name="Qwen/Qwen3-1.7B"))) == []
