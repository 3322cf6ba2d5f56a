"""The compiled jobs that the checks against prime-rl cover: each task's default job plus LoRA, KL and 4-GPU variants.

``tests/unit/test_primerl_compile.py`` validates each against the derived JSON schema (CI, offline);
``scripts/check_bundles_with_primerl.py`` runs prime-rl's own launcher on each in dry-run mode and
compares the sub-configs it resolves with :func:`expected_resolved`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from metarl.backends.runpod.primerl.compiler import CompileOptions, build_bundle, pod_compile_options
from metarl.backends.runpod.primerl.schema import get_path
from schemas.job import JobModel, JobSpec, JobTraining
from schemas.task_spec import TaskSpec

CHECK_ENVIRONMENT = b"def reward(prompt, completion, answer):\n    return float(completion.strip() == answer)\n"
CHECK_DATASET = b'{"prompt": "add 1+1=", "answer": "2"}\n'
"""The environment module and dataset of the checked bundles (the launcher's dry run does not import them)."""


class CheckedJob(BaseModel):
    """One compiled job the checks cover."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]{0,63}$", description="Variant name (folder name of its rl.toml)")
    task_id: str = Field(min_length=1, max_length=64, description="Task whose budget it is compiled with")
    job: JobSpec = Field(description="The job")
    options: CompileOptions = Field(description="Pod options it is compiled with (as the Runpod train backend compiles)")


def checked_jobs(tasks: Iterable[TaskSpec], gpu_count: int = 2) -> list[CheckedJob]:
    """Each task's default job on its first allowed model, then LoRA, KL and 4-GPU variants of the first task's."""
    tasks = list(tasks)
    out = []
    for task in tasks:
        options = pod_compile_options(gpu_count, task.budget.train_seconds_for(on_gpu=True))
        out.append(CheckedJob(name=f"{task.id}-default", task_id=task.id, job=JobSpec(model=JobModel(name=task.budget.allowed_models[0])), options=options))
    first = tasks[0]
    model = first.budget.allowed_models[0]
    cap = first.budget.train_seconds_for(on_gpu=True)
    out += [
        CheckedJob(name="lora", task_id=first.id, job=JobSpec(model=JobModel(name=model, lora_rank=16)), options=pod_compile_options(gpu_count, cap)),
        CheckedJob(
            name="kl",
            task_id=first.id,
            job=JobSpec(model=JobModel(name=model), training=JobTraining(kl_coef=0.05)),
            options=pod_compile_options(gpu_count, cap),
        ),
        CheckedJob(name="gpu4", task_id=first.id, job=JobSpec(model=JobModel(name=model)), options=pod_compile_options(4, cap)),
        CheckedJob(
            name="lora-gpu4-long",
            task_id=first.id,
            job=JobSpec(model=JobModel(name=first.budget.allowed_models[-1], lora_rank=8), training=JobTraining(max_steps=400)),
            options=pod_compile_options(4, cap),
        ),
    ]
    return out


def compiled(checked: CheckedJob) -> dict[str, Any]:
    """The job's rl.toml mapping, compiled as a bundle (a real environment package digest as env id)."""
    return build_bundle(checked.job, CHECK_ENVIRONMENT, CHECK_DATASET, checked.options).rl_config


def expected_resolved(rl_config: dict[str, Any]) -> dict[str, Any]:
    """``<sub-config>:<dotted key>`` -> value the launcher must resolve from a compiled rl.toml.

    Keys are read in the files the launcher's dry run writes to ``<output_dir>/configs/``
    (trainer.toml, orchestrator.toml, inference.toml); values come from the compiled mapping, so
    the check is that prime-rl resolves what the compiler wrote into the places the pod relies on.
    """
    lora = get_path(rl_config, "trainer.model.lora")
    deployment = rl_config["deployment"]
    expected: dict[str, Any] = {
        "trainer:max_steps": rl_config["max_steps"],
        "trainer:model.name": rl_config["model"]["name"],
        "trainer:ckpt.interval": rl_config["ckpt"]["interval"],
        "trainer:ckpt.keep_last": rl_config["ckpt"]["keep_last"],
        "trainer:ckpt.weights_only": True,
        "trainer:optim.lr": rl_config["trainer"]["optim"]["lr"],
        "trainer:loss.kl_tau": rl_config["trainer"]["loss"]["kl_tau"],
        "trainer:weight_broadcast.type": "filesystem" if lora else "nccl",
        "orchestrator:ckpt.interval": rl_config["ckpt"]["interval"],
        "orchestrator:batch_size": rl_config["orchestrator"]["batch_size"],
        "orchestrator:post_batch_filters.zero_advantage.enforce": False,
        "inference:parallel.dp": deployment["num_infer_gpus"],
    }
    if lora:
        expected |= {
            "trainer:model.lora.rank": lora["rank"],
            "trainer:model.lora.alpha": lora["alpha"],
            "trainer:ckpt.weights.save_adapter_separately": True,
            "inference:enable_lora": True,
            "inference:max_lora_rank": lora["rank"],
        }
    if deployment["num_train_gpus"] > 1:
        expected["orchestrator:num_train_workers"] = deployment["num_train_gpus"]
    return expected


def resolved_value(subconfigs: dict[str, dict[str, Any]], key: str) -> Any:
    """The value of an :func:`expected_resolved` key in the launcher's resolved sub-configs (None when absent)."""
    name, _, dotted = key.partition(":")
    config = subconfigs.get(name, {})
    if dotted.startswith("post_batch_filters."):
        _, filter_type, field = dotted.split(".")
        matches = [item for item in config.get("post_batch_filters", []) if item.get("type") == filter_type]
        return matches[0].get(field) if len(matches) == 1 else None
    return get_path(config, dotted)
