"""Whether a model's training state fits the trainer GPUs of a Runpod pod, from its parameter count (pure).

prime-rl's `rl` puts the trainer on half the pod's GPUs (rounded down) and shards its state over
them (FSDP). Full fine-tuning keeps fp32 weights, fp32 gradients and AdamW's two fp32 moments:
16 bytes a parameter. A LoRA job keeps the frozen base in bf16 (2 bytes a parameter); its adapter
and optimizer state are a rounding error at the ranks a job may ask for. On top: activations and the
CUDA context, a fixed reserve (assumed). Run config load refuses a task whose allowed model fits in
neither mode; the probe refuses a job whose mode does not fit, with the arithmetic in both messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.base import FieldProblem
from schemas.job import JobSpec
from schemas.task_spec import TaskSpec

MODEL_PARAMETERS: dict[str, float] = {
    "Qwen/Qwen3-0.6B": 0.6e9,
    "Qwen/Qwen3-1.7B": 1.7e9,
    "Qwen/Qwen3-4B": 4.0e9,
    "Qwen/Qwen3-8B": 8.2e9,
}
"""Parameters of the base models an inner job may train on prime-rl (the Qwen3 model cards' "Number of Parameters")."""

GPU_MEMORY_GB: dict[str, float] = {
    "NVIDIA A40": 48,
    "NVIDIA RTX A6000": 48,
    "NVIDIA L40S": 48,
    "NVIDIA L40": 48,
    "NVIDIA RTX 6000 Ada Generation": 48,
    "NVIDIA A100 80GB PCIe": 80,
    "NVIDIA A100-SXM4-80GB": 80,
    "NVIDIA H100 PCIe": 80,
    "NVIDIA H100 80GB HBM3": 80,
    "NVIDIA H100 NVL": 94,
    "NVIDIA H200": 141,
    "NVIDIA RTX A5000": 24,
    "NVIDIA GeForce RTX 4090": 24,
    "NVIDIA L4": 24,
}
"""Memory of Runpod GPU types by their id (Runpod's `gpuTypes` `memoryInGb`); others are given in `backends.train.gpu_memory_gb`."""

FULL_BYTES_PER_PARAMETER = 16.0
"""Full fine-tuning: fp32 weights (4) + fp32 gradients (4) + AdamW's two fp32 moments (8)."""
LORA_BYTES_PER_PARAMETER = 2.0
"""LoRA: the frozen base in bf16; the adapter and its optimizer state are left out (well under 1% at rank 256 for these models)."""
RESERVE_GB = 8.0
"""Activations at the jobs' sequence lengths, the CUDA context and allocator slack on each trainer GPU (assumed)."""
USABLE_FRACTION = 0.95
"""Share of a GPU's memory a process can allocate."""


@dataclass(frozen=True)
class MemoryNeed:
    """One training mode's memory on each trainer GPU against what the smallest GPU type offers."""

    model: str
    mode: str
    per_gpu_gb: float
    available_gb: float
    gpu_type: str
    trainer_gpus: int

    @property
    def fits(self) -> bool:
        return self.per_gpu_gb <= self.available_gb

    def arithmetic(self) -> str:
        """How the figure is made, in words."""
        per_param = FULL_BYTES_PER_PARAMETER if self.mode == "full fine-tuning" else LORA_BYTES_PER_PARAMETER
        parameters = MODEL_PARAMETERS[self.model]
        return (
            f"{self.mode} of {self.model}: {parameters / 1e9:g}B parameters x {per_param:g} bytes / {self.trainer_gpus} trainer GPU(s) "
            f"+ {RESERVE_GB:g} GB reserve = {self.per_gpu_gb:.1f} GB per trainer GPU, against {self.available_gb:.1f} GB usable "
            f"on a {self.gpu_type} ({USABLE_FRACTION:.0%} of {self.available_gb / USABLE_FRACTION:g} GB)"
        )


def trainer_gpus(gpu_count: int) -> int:
    """GPUs that train on a pod of ``gpu_count`` (half, rounded down; the rest serve vLLM)."""
    return max(1, gpu_count // 2)


def smallest_gpu(gpu_types: list[str], memory_gb: dict[str, float]) -> tuple[str, float] | None:
    """The listed GPU type with the least memory and its GB (a job may land on any of them); None when one has no known memory."""
    sizes = [(memory_gb.get(gpu, GPU_MEMORY_GB.get(gpu)), gpu) for gpu in gpu_types]
    if any(size is None for size, _ in sizes):
        return None
    size, gpu = min((float(size), gpu) for size, gpu in sizes if size is not None)
    return gpu, size


def memory_need(model: str, lora: bool, gpu_count: int, gpu_type: str, gpu_gb: float) -> MemoryNeed | None:
    """The memory one training mode of ``model`` needs on each trainer GPU (None for a model whose size is not known here)."""
    parameters = MODEL_PARAMETERS.get(model)
    if parameters is None:
        return None
    gpus = trainer_gpus(gpu_count)
    per_param = LORA_BYTES_PER_PARAMETER if lora else FULL_BYTES_PER_PARAMETER
    return MemoryNeed(
        model=model,
        mode="LoRA" if lora else "full fine-tuning",
        per_gpu_gb=parameters * per_param / gpus / 1e9 + RESERVE_GB,
        available_gb=gpu_gb * USABLE_FRACTION,
        gpu_type=gpu_type,
        trainer_gpus=gpus,
    )


def job_memory_problems(gpu_types: list[str], gpu_memory_gb: dict[str, float], gpu_count: int, job: JobSpec, task: TaskSpec) -> list[FieldProblem]:
    """The probe's check that a job's model fits the trainer GPUs in the mode it asks for (full fine-tuning or LoRA)."""
    smallest = smallest_gpu(gpu_types, gpu_memory_gb)
    if smallest is None:
        return []
    need = memory_need(job.model.name, job.model.lora_rank > 0, gpu_count, *smallest)
    if need is None or need.fits:
        return []
    lora = memory_need(job.model.name, True, gpu_count, *smallest)
    if need.mode == "full fine-tuning" and lora is not None and lora.fits:
        fix = f"train a LoRA instead: set model.lora_rank = 8 (LoRA needs {lora.per_gpu_gb:.1f} GB), or choose a smaller model.name"
    else:
        fix = "choose a smaller model.name from the task's allowed_models"
    return [FieldProblem(field="(runpod) model.name", message=f"{job.model.name} does not fit the pod's trainer GPU: {need.arithmetic()}", fix=fix)]
