"""The job bundle's layout and manifest (pydantic and stdlib only: the pod runner imports it).

A bundle is a folder in artifact storage (any fsspec URL)::

    manifest.json                     BundleManifest: what the bundle is and each file's sha256
    rl.toml                           the compiled prime-rl config (``rl @ rl.toml``)
    env/pyproject.toml                the agent's environment as an installable package
    env/<module>/__init__.py          load_environment(): a verifiers SingleTurnEnv + rubric
    env/<module>/metarl_graders.py    metarl's task-family graders (metarl/graders.py), for the agent's module
    env/<module>/metarl_grader_*.py   the plugin graders the task's grader uses (their registered files)
    env/<module>/metarl_reward_rule.py the reward rule (metarl/reward_rule.py): what a reward counts as, as in the probe
    env/<module>/agent_environment.py the agent's environment/reward module, unchanged
    env/<module>/dataset.jsonl        the agent's dataset, unchanged
    env/<module>/job_reward.json      reward component weights from job.toml

The pod runner writes its results under a second URL (the result folder): ``status.json``
(heartbeats), ``exit.json`` (the exit report), ``metrics/``, ``logs/`` and ``weights/step_N/``.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MANIFEST_FILE = "manifest.json"
RL_TOML_FILE = "rl.toml"
PACKAGE_DIR = "env"
AGENT_MODULE = "agent_environment"
DATASET_FILE = "dataset.jsonl"
REWARD_CONFIG_FILE = "job_reward.json"

STATUS_FILE = "status.json"
EXIT_FILE = "exit.json"
METRICS_DIR = "metrics"
LOGS_DIR = "logs"
WEIGHTS_DIR = "weights"
LORA_ADAPTERS_DIR = "lora_adapters"
"""Where prime-rl v0.8.0 writes a LoRA job's adapter inside ``weights/step_N/`` when
``[trainer.ckpt.weights] save_adapter_separately = true`` (src/prime_rl/trainer/ckpt.py
``WeightCheckpointManager.save_to_path``); the ``step_N`` weights beside it are the base model's."""

ENV_ID_PATTERN = r"^metarl-env-[0-9a-f]{12}$"
ENV_MODULE_PATTERN = r"^metarl_env_[0-9a-f]{12}$"
OUTPUT_DIR_PATTERN = r"^[A-Za-z0-9_\-]{1,64}$"
_PATH_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-/")


def safe_relative_path(path: str) -> bool:
    """True for a plain relative path inside a folder: no leading slash, no empty or ``..`` parts, few characters."""
    parts = path.split("/")
    return 0 < len(path) <= 200 and set(path) <= _PATH_CHARS and all(part not in ("", ".", "..") for part in parts)


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of some bytes."""
    return hashlib.sha256(data).hexdigest()


class BundleManifest(BaseModel):
    """What a job bundle holds; written by the compiler, checked by the pod runner before it runs anything."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1] = Field(default=1, description="Bundle layout version")
    prime_rl_tag: str = Field(min_length=2, max_length=40, description="prime-rl release the rl.toml was compiled for")
    env_id: str = Field(pattern=ENV_ID_PATTERN, description="verifiers env id (legacy.id in rl.toml)")
    env_module: str = Field(pattern=ENV_MODULE_PATTERN, description="Importable module name of the environment package")
    output_dir: str = Field(default="outputs", pattern=OUTPUT_DIR_PATTERN, description="rl.toml output_dir, relative to the run folder")
    max_steps: int = Field(ge=1, le=100_000, description="Trainer steps the job runs")
    max_train_seconds: float | None = Field(
        default=None, gt=0, le=7 * 24 * 3600, description="The task's training-time cap, enforced by the pod runner from the first metrics row (None: no cap)"
    )
    files: dict[str, str] = Field(min_length=1, max_length=64, description="Relative path -> sha256 of every bundle file except the manifest")
    model_name: str | None = Field(default=None, min_length=1, max_length=200, description="Base model (rl.toml [model] name); a LoRA adapter applies to it")
    lora_rank: int = Field(
        default=0, ge=0, le=256, description="LoRA rank ([trainer.model.lora] rank); 0: full fine-tuning, weights/step_N holds the trained model"
    )
    lora_alpha: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        description="LoRA alpha ([trainer.model.lora] alpha) when lora_rank > 0; the adapter is under weights/step_N/lora_adapters/",
    )
    ckpt_interval: int | None = Field(
        default=None, ge=1, le=100_000, description="rl.toml [ckpt] interval: weights/step_N is written at every multiple of it and after the last step"
    )

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        bad = sorted(path for path in files if not safe_relative_path(path))
        if bad:
            raise ValueError(f"file paths must be plain relative paths: {bad[:3]}")
        short = sorted(path for path, digest in files.items() if len(digest) != 64)
        if short:
            raise ValueError(f"digests must be 64 hex characters: {short[:3]}")
        return files

    def file_problems(self, actual: dict[str, bytes]) -> list[str]:
        """Files missing, unexpected or not matching their digest (empty when the bundle is intact)."""
        problems = [f"{path}: missing" for path in sorted(set(self.files) - set(actual))]
        problems += [f"{path}: not in the manifest" for path in sorted(set(actual) - set(self.files))]
        problems += [f"{path}: sha256 mismatch" for path in sorted(set(self.files) & set(actual)) if sha256_hex(actual[path]) != self.files[path]]
        return problems
