"""Config models of the `runpod` train backend (prime-rl on Runpod pods) and the `pod_vllm` eval on the job's own pod."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from metarl.backends.runpod.memory import GPU_MEMORY_GB, memory_need, smallest_gpu
from schemas.backend_config import EvalBackendConfig, TrainBackendConfig
from schemas.base import FieldProblem
from schemas.config_guards import refuse_secrets
from schemas.task_spec import TaskSpec

RUNPOD_API_KEY_ENV = "RUNPOD_API_KEY"
"""The only place the Runpod API key is read from (never the config, records, logs or pod environment)."""

_GPU_TYPE = r"^[A-Za-z0-9][A-Za-z0-9 ._\-]{0,63}$"


DEFAULT_STORAGE_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)
"""What an ``s3://`` artifact root needs on the pod (s3fs reads these)."""
STORAGE_ENV_REFUSED_PREFIXES = ("RUNPOD_", "TINKER_", "METARL_")


class RunpodTrainBackend(TrainBackendConfig):
    """Inner jobs as prime-rl runs on Runpod pods (2x A40 by default), submitted then polled.

    A warm pool of up to `max_pods` pods is reused across jobs; a watchdog terminates pods whose
    progress stops; pods nobody owns are reaped; every pod second is billed from the pod's costPerHr.
    The API key comes only from the RUNPOD_API_KEY environment variable of the train workers and
    the orchestrator (a key in this table is refused).
    """

    type: Literal["runpod"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.runpod.train:RunpodTrain"
    planner: ClassVar[str] = "metarl.backends.runpod.plan:train_plan"
    api_key_env: ClassVar[str | None] = RUNPOD_API_KEY_ENV
    trains_on_gpu: ClassVar[bool] = True
    weights: ClassVar[str] = "runpod"
    image: str = Field(
        min_length=1,
        max_length=512,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@\-]*$",
        description="Pod image: prime-rl at the pinned tag plus our runner (docker/inner.Dockerfile)",
    )
    gpu_types: list[Annotated[str, Field(pattern=_GPU_TYPE)]] = Field(
        default_factory=lambda: ["NVIDIA A40", "NVIDIA RTX A6000", "NVIDIA L40S"],
        min_length=1,
        max_length=16,
        description="Runpod GPU type ids, best first; the next one is tried on a capacity error",
    )
    gpu_count: int = Field(
        default=2,
        ge=1,
        le=8,
        description="GPUs per pod, at least 2: half (rounded down) train, the rest serve vLLM rollouts (prime-rl needs one of each on the node)",
    )
    cloud_type: Literal["ALL", "SECURE", "COMMUNITY"] = Field(default="SECURE", description="Runpod cloud to rent from")
    container_disk_gb: int = Field(default=80, ge=10, le=4000, description="Container disk of a pod (image, model, checkpoints)")
    volume_gb: int = Field(default=0, ge=0, le=10_000, description="Pod volume (0 = none)")
    max_pods: int = Field(default=16, ge=1, le=1000, description="Most pods at once, busy and idle (the pool size P)")
    warm_pool_size: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="Idle pods kept for the next job instead of being terminated (the image's metarl.backends.runpod.pod.supervisor follows its pod's assignment file); 0 = a new pod per job",
    )
    idle_timeout_s: float = Field(default=300.0, ge=0.0, le=86_400.0, description="An idle pod unused this long is terminated")
    poll_interval_s: float = Field(default=30.0, ge=0.05, le=3600.0, description="Seconds between polls of a running job")
    startup_timeout_s: float = Field(default=1800.0, ge=1.0, le=86_400.0, description="Longest wait for a job's first progress (image pull, model download)")
    hang_timeout_s: float = Field(
        default=900.0, ge=1.0, le=86_400.0, description="A job whose progress (metrics.jsonl step) stops this long is killed by the watchdog"
    )
    max_restarts: int = Field(default=1, ge=0, le=10, description="Times a job moves to a new pod after a preemption or a hang before it fails")
    billing_interval_s: int = Field(
        default=60, ge=1, le=3600, description="Ledger granularity: one charge per pod per interval of pod seconds (the last one partial)"
    )
    api_timeout_s: float = Field(default=20.0, gt=0.0, le=300.0, description="Deadline of one Runpod API read or idempotent write")
    api_retries: int = Field(default=4, ge=1, le=50, description="Tries of one API call on transient errors (timeouts, 5xx) before the stage sees an error")
    api_backoff_s: float = Field(default=1.0, ge=0.0, le=120.0, description="First backoff between tries; doubles per try, at most 15 s")
    max_poll_api_errors: int = Field(
        default=10, ge=1, le=10_000, description="Polls in a row that cannot reach the API before the stage counts a transient failure"
    )
    capacity_cooldown_s: float = Field(default=60.0, ge=0.0, le=86_400.0, description="A GPU type that had no capacity is tried after the others for this long")
    reap_interval_s: float = Field(default=60.0, ge=0.0, le=86_400.0, description="Seconds between orphan-reaper passes of one worker process")
    orphan_grace_s: float = Field(default=600.0, ge=0.0, le=86_400.0, description="A pod of ours with no assignment record is reaped once it is this old")
    storage_env: list[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")]] = Field(
        default_factory=lambda: list(DEFAULT_STORAGE_ENV),
        max_length=32,
        description="Variables of the train worker's environment copied into each pod's so its runner can reach artifact storage (those unset are skipped; rl never sees credential-like ones)",
    )
    gpu_memory_gb: dict[Annotated[str, Field(pattern=_GPU_TYPE)], Annotated[float, Field(gt=0.0, le=4096.0)]] = Field(
        default_factory=dict,
        max_length=16,
        description="Memory in GB of GPU types the built-in table (metarl/backends/runpod/memory.py) does not know; checks that a job's model fits",
    )
    estimated_usd_per_gpu_hour: dict[Annotated[str, Field(pattern=_GPU_TYPE)], Annotated[float, Field(ge=0.0, le=1000.0)]] = Field(
        default_factory=dict,
        max_length=16,
        description="Price per GPU-hour by GPU type, for the dry run's estimate only (billing uses the pod's costPerHr); --usd-per-gpu-hour overrides it",
    )

    @field_validator("gpu_count")
    @classmethod
    def _trainer_and_inference_gpu(cls, count: int) -> int:
        if count < 2:
            raise ValueError(
                f"gpu_count = {count} cannot run prime-rl v0.8.0: `rl` puts the trainer and vLLM inference on separate GPUs of the "
                "node (num_train_gpus + num_infer_gpus <= gpus_per_node, at least one of each); set backends.train.gpu_count = 2 or more"
            )
        return count

    @field_validator("storage_env")
    @classmethod
    def _storage_env_is_not_ours(cls, names: list[str]) -> list[str]:
        refused = [name for name in names if name.startswith(STORAGE_ENV_REFUSED_PREFIXES)]
        if refused:
            raise ValueError(
                f"{refused[0]} is not a storage setting: the Runpod and Tinker keys and METARL_ settings never go to a pod; "
                f"list only the storage variables (e.g. {', '.join(DEFAULT_STORAGE_ENV[:2])})"
            )
        return names

    @field_validator("estimated_usd_per_gpu_hour")
    @classmethod
    def _priced_types_are_used(cls, prices: dict[str, float], info: Any) -> dict[str, float]:
        unknown = sorted(set(prices) - set(info.data.get("gpu_types") or []))
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of gpu_types; price only the GPU types listed there, spelled as there")
        return prices

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: object) -> object:
        return refuse_secrets(data, RUNPOD_API_KEY_ENV, "the Runpod API key", frozenset({"runpod_api_key"}))

    @model_validator(mode="after")
    def _gpu_memory_known(self) -> RunpodTrainBackend:
        unknown = [gpu for gpu in self.gpu_types if gpu not in self.gpu_memory_gb and gpu not in GPU_MEMORY_GB]
        if unknown:
            raise PydanticCustomError(
                "gpu_memory_unknown",
                "the memory of GPU type {gpu} is not known here, so no job can be checked to fit it",
                {"gpu": repr(unknown[0]), "fix": f'add its memory to backends.train.gpu_memory_gb, e.g. gpu_memory_gb = {{ "{unknown[0]}" = 48 }}'},
            )
        return self

    def task_problems(self, task: TaskSpec) -> list[FieldProblem]:
        """A task's allowed model that fits the smallest listed GPU type in neither full fine-tuning nor LoRA (metarl/backends/runpod/memory.py)."""
        smallest = smallest_gpu(list(self.gpu_types), dict(self.gpu_memory_gb))
        if smallest is None:
            return []
        gpu, size = smallest
        problems = []
        for model in task.budget.allowed_models:
            lora = memory_need(model, True, self.gpu_count, gpu, size)
            if lora is not None and not lora.fits:
                problems.append(
                    FieldProblem(
                        field=f"task {task.id}: budget.allowed_models",
                        message=f"{model} cannot train on backends.train.gpu_types even with LoRA: {lora.arithmetic()}",
                        fix=f"drop {model} from the task's allowed_models, or list only GPU types with more memory in backends.train.gpu_types (or raise gpu_count)",
                    )
                )
        return problems

    @model_validator(mode="after")
    def _pool_fits(self) -> RunpodTrainBackend:
        if self.warm_pool_size > self.max_pods:
            if "warm_pool_size" in self.model_fields_set:
                raise ValueError("warm_pool_size must be at most max_pods (idle pods count towards the pool)")
            self.warm_pool_size = self.max_pods
        if self.startup_timeout_s < self.poll_interval_s or self.hang_timeout_s < self.poll_interval_s:
            raise ValueError("startup_timeout_s and hang_timeout_s must be at least poll_interval_s, or the watchdog fires between two polls")
        return self


class PodVllmEvalBackend(EvalBackendConfig):
    """Hidden-eval scoring with vLLM on the inner job's own Runpod pod, right after training there (needs `backends.train.type = "runpod"`).

    The weights never leave the pod to be scored, and the pod's eval seconds are billed like its
    training seconds (ledger source `runpod_eval`, to the billing interval). The hidden prompts reach
    the pod only after the agent's code stopped there, and are deleted after scoring; the answers never
    reach it (workers grade the completions). The base model is scored on a job's pod the first time a
    (task, model) needs it, then cached. The separate GPU eval pool (`type = "vllm"`) remains the other
    choice.
    """

    type: Literal["pod_vllm"] = Field(description="Backend kind")
    backend_class: ClassVar[str] = "metarl.backends.runpod.eval:PodVllmEval"
    planner: ClassVar[str] = "metarl.backends.runpod.plan:eval_plan"
    scores: ClassVar[frozenset[str]] = frozenset({"runpod"})
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(default="bfloat16", description="Weight and activation dtype in vLLM")
    gpu_memory_utilization: float = Field(
        default=0.85, gt=0.0, le=0.99, description="Fraction of one pod GPU vLLM may claim (training has ended: the GPUs are free)"
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=1_048_576, description="Context length of the engine (default: the longest eval prompt plus the eval's completion budget)"
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the engine and of pass@k sampling")
    chat: bool = Field(
        default=True,
        description="Chat-format the hidden prompts with the model's chat template, thinking off, as prime-rl trained on them (plain text when the model has none)",
    )
    eval_timeout_s: float = Field(
        default=1800.0,
        ge=10.0,
        le=86_400.0,
        description="Longest wait from publishing the eval request to the pod's result (engine starts included) before the job fails",
    )
    engine_start_s: float = Field(default=120.0, ge=0.0, le=3600.0, description="Seconds to start vLLM on one model, for the dry run's estimate only")
    tokens_per_s: float = Field(
        default=2000.0, gt=0.0, le=1e7, description="Prompt plus generated tokens one engine handles per second, for the dry run's estimate only"
    )


CONFIGS = (RunpodTrainBackend, PodVllmEvalBackend)
