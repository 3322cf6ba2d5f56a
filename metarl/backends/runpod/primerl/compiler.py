"""Job compiler: a submitted job becomes the pinned prime-rl's ``rl.toml`` plus its environment package.

``compile_rl_config`` maps a :class:`schemas.job.JobSpec`, resolved with the prime-rl job defaults
(:data:`schemas.job.PRIME_RL_TRAIN_DEFAULTS`), to the ``RLConfig`` mapping of prime-rl
:data:`~metarl.backends.runpod.pod.pin.PRIME_RL_TAG`:

============================  ==============================================================
job.toml                      rl.toml
============================  ==============================================================
model.name                    [model] name (shared: trainer, orchestrator, inference) and the
                              model's renderer in [orchestrator.renderer] (thinking off)
model.lora_rank > 0           [trainer.model.lora] rank, alpha = :data:`LORA_ALPHA` (32), and
                              [trainer.ckpt.weights] save_adapter_separately = true
training.max_steps            max_steps (shared)
training.learning_rate        [trainer.optim] lr (AdamW; default 3e-6 full, 1e-4 LoRA)
training.batch_size           [orchestrator] batch_size (rollouts per step)
training.group_size           [orchestrator] group_size
training.kl_coef              [trainer.loss] kl_tau, always written (default 1e-3): v0.8.0 has
                              no reference-model KL; its loss adds kl_tau * (trainer logprob -
                              inference logprob)^2 per token (trainer/rl/loss.py)
training.seed                 [inference] seed (vLLM sampling seed)
rollout.temperature           [orchestrator.train.sampling] temperature
rollout.max_tokens            [orchestrator.train.sampling] max_completion_tokens; seq_len
                              and [inference.model] max_model_len are sized from it
environment + dataset         [[orchestrator.train.source]] legacy = { id = <env package> }
============================  ==============================================================

plus what the pod fixes (:class:`CompileOptions`):

- ``[deployment]``: GPUs per node, trainer and inference GPUs;
- ``[ckpt] interval, keep_last`` and ``[trainer.ckpt] weights_only = true``: Hugging Face weights
  under ``outputs/weights/step_N`` every ``interval`` steps and after the last one, so a job stopped
  at its time cap keeps recent weights (:func:`ckpt_interval`);
- ``[[orchestrator.post_batch_filters]]``: prime-rl's three default filters with
  ``zero_advantage`` in monitor mode, so batches with no learning signal train on zero advantages
  instead of making the orchestrator raise after 10 empty batches;
- ``[orchestrator] max_off_policy_steps``, ``[inference] gpu_memory_utilization`` and ``[file_monitor]``
  (``metrics.jsonl``).

``compile_bundle`` adds the environment package (see :mod:`metarl.backends.runpod.primerl.env_template`; it ships
metarl/graders.py, the plugin grader files the task's grader uses and metarl/reward_rule.py, the reward rule the
probe and the local trainer apply) and a manifest; ``write_bundle`` stores the bundle under any fsspec URL. Everything but the workspace
read and the write is pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ConfigDict, Field

from metarl import graders, reward_rule
from metarl.backends.runpod.pod.manifest import (
    AGENT_MODULE,
    DATASET_FILE,
    MANIFEST_FILE,
    PACKAGE_DIR,
    REWARD_CONFIG_FILE,
    RL_TOML_FILE,
    BundleManifest,
    sha256_hex,
)
from metarl.backends.runpod.pod.pin import PRIME_RL_TAG
from metarl.domain.sequence import MIN_SEQ_LEN, PROMPT_TOKEN_BUDGET, SEQ_LEN_MULTIPLE, compiled_seq_len
from schemas.job import PRIME_RL_TRAIN_DEFAULTS, JobSpec

QWEN3_RENDERER: dict[str, Any] = {"name": "qwen3", "enable_thinking": False}
MODEL_RENDERERS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-0.6B": QWEN3_RENDERER,
    "Qwen/Qwen3-1.7B": QWEN3_RENDERER,
    "Qwen/Qwen3-4B": QWEN3_RENDERER,
    "Qwen/Qwen3-8B": QWEN3_RENDERER,
}
"""Base models an inner job may train on prime-rl, with the renderer (chat format) to use.

Thinking is off: answers are a few tokens, and the hidden eval must use the same chat format."""

SOURCE_NAME = "metarl-job"
PROBE_ENV_ID = "metarl-env-000000000000"
"""Placeholder env id for compile checks that have no workspace (the probe's backend check)."""

RL_TO_JOB_FIELD: dict[str, str] = {
    "model.name": "model.name",
    "orchestrator.renderer.name": "model.name",
    "trainer.model.lora.rank": "model.lora_rank",
    "trainer.model.lora.alpha": "model.lora_rank",
    "trainer.ckpt.weights.save_adapter_separately": "model.lora_rank",
    "max_steps": "training.max_steps",
    "trainer.optim.lr": "training.learning_rate",
    "orchestrator.batch_size": "training.batch_size",
    "orchestrator.group_size": "training.group_size",
    "trainer.loss.kl_tau": "training.kl_coef",
    "inference.seed": "training.seed",
    "orchestrator.train.sampling.temperature": "rollout.temperature",
    "orchestrator.train.sampling.max_completion_tokens": "rollout.max_tokens",
    "seq_len": "rollout.max_tokens",
    "inference.model.max_model_len": "rollout.max_tokens",
}
"""Which job.toml field an rl.toml key comes from (for probe feedback)."""


class CompileOptions(BaseModel):
    """Pod-level settings of a compiled inner job (chosen by the operator, not by the agent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_train_gpus: int = Field(default=1, ge=1, le=8, description="GPUs for the trainer")
    num_infer_gpus: int = Field(default=1, ge=1, le=8, description="GPUs for vLLM inference")
    gpus_per_node: int = Field(default=2, ge=1, le=8, description="GPUs of the pod (2x A40 by default)")
    max_off_policy_steps: int = Field(default=1, ge=0, le=64, description="Policy versions a rollout may lag behind (prime-rl default 8)")
    gpu_memory_utilization: float = Field(default=0.85, ge=0.1, le=0.98, description="vLLM GPU memory share")
    prompt_token_budget: int = Field(default=PROMPT_TOKEN_BUDGET, ge=16, le=32_768, description="Tokens reserved for chat template + prompt")
    min_seq_len: int = Field(default=MIN_SEQ_LEN, ge=64, le=131_072, description="Smallest sequence length")
    seq_len_multiple: int = Field(default=SEQ_LEN_MULTIPLE, ge=1, le=8192, description="seq_len is rounded up to a multiple of this")
    output_dir: str = Field(default="outputs", pattern=r"^[A-Za-z0-9_\-]{1,64}$", description="rl.toml output_dir (relative)")
    max_train_seconds: float | None = Field(
        default=None, gt=0, le=7 * 24 * 3600, description="The task's training-time cap on the pod, written to the manifest for the pod runner (None: no cap)"
    )
    checkpoints_per_job: int = Field(
        default=4,
        ge=1,
        le=100,
        description="Weight saves aimed for over a job's horizon (max_steps, or the steps expected within the time cap), besides the final one",
    )
    expected_step_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Seconds per trainer step assumed when sizing the save interval to the time cap; steps up to checkpoints_per_job times slower still save once",
    )
    ckpt_keep_last: int = Field(
        default=2,
        ge=1,
        le=100,
        description="[ckpt] keep_last: weight steps kept on the pod's disk (prime-rl deletes older ones only after a newer save is complete)",
    )


def pod_compile_options(gpu_count: int, max_train_seconds: float | None = None) -> CompileOptions:
    """Options for a pod of ``gpu_count`` GPUs: half of them (at least one) train, the rest serve vLLM.

    Raises ValueError below two GPUs: prime-rl needs a trainer GPU and an inference GPU on the node
    (``metarl.backends.runpod.config.RunpodTrainBackend`` rejects such a config at load).
    """
    if gpu_count < 2:
        raise ValueError(f"a {gpu_count}-GPU pod cannot run prime-rl: it needs one trainer and one inference GPU at least")
    train_gpus = gpu_count // 2
    return CompileOptions(gpus_per_node=gpu_count, num_train_gpus=train_gpus, num_infer_gpus=gpu_count - train_gpus, max_train_seconds=max_train_seconds)


def seq_len_for(max_tokens: int, options: CompileOptions) -> int:
    """Sequence length for prompts plus ``max_tokens`` completion tokens: :func:`metarl.domain.sequence.compiled_seq_len`
    with the options' sizes (the probe holds the dataset's prompts to the same rule)."""
    return compiled_seq_len(max_tokens, options.min_seq_len, options.prompt_token_budget, options.seq_len_multiple)


def ckpt_interval(max_steps: int, options: CompileOptions) -> int:
    """Steps between weight saves: ``checkpoints_per_job`` saves (up to twice that by rounding) over the job's horizon.

    The horizon is ``max_steps``, or fewer when the time cap allows fewer steps at
    ``expected_step_seconds`` each; the interval is the horizon // checkpoints_per_job, so a job whose
    steps are up to ``checkpoints_per_job`` times slower than assumed still reaches one save within
    its cap. prime-rl v0.8.0 writes ``weights/step_N`` at every multiple of the interval and after
    the last step (src/prime_rl/trainer/rl/train.py), so a job stopped at its cap keeps the weights of
    its last multiple of the interval.
    """
    horizon = max_steps
    if options.max_train_seconds is not None:
        horizon = min(horizon, max(1, int(options.max_train_seconds // options.expected_step_seconds)))
    return max(1, horizon // options.checkpoints_per_job)


POST_BATCH_FILTERS: list[dict[str, Any]] = [{"type": "gibberish"}, {"type": "repetition"}, {"type": "zero_advantage", "enforce": False}]
"""prime-rl's default post-batch filters (configs/orchestrator.py OrchestratorConfig) with
``zero_advantage`` monitoring instead of enforcing: an enforced one empties batches whose groups
all got equal rewards, and 10 empty batches in a row make the orchestrator raise
(orchestrator/orchestrator.py MAX_CONSECUTIVE_EMPTY_BATCHES), so ``rl`` exits 1. Monitored, such
batches reach the trainer with zero advantages (no policy-gradient step, only the kl_tau term) and
the job ends with weights; an empty batch then means every rollout errored, which the pod runner
reports as ``rollouts_errored`` (metarl/backends/runpod/pod/rl_outputs.py)."""


def env_names(digest: str) -> tuple[str, str]:
    """(env id, module name) of an environment package from its content digest."""
    short = digest[:12]
    return f"metarl-env-{short}", f"metarl_env_{short}"


LORA_ALPHA = 32.0
"""[trainer.model.lora] alpha at every rank: prime-rl v0.8.0's own default (``LoRAConfig.alpha``,
packages/prime-rl-configs/src/prime_rl/configs/trainer.py), which the configs the 1e-4 LoRA learning
rate comes from leave in place at rank 8 (configs/debug/algo/opd_lora.toml, sft_distill_lora.toml:
scale alpha / rank = 4). Written explicitly so the manifest and the LoRA merge see it."""


def compile_rl_config(job: JobSpec, env_id: str, options: CompileOptions | None = None) -> dict[str, Any]:
    """The rl.toml mapping of a job (pure; see the module docstring for the field mapping).

    A model without a pinned renderer gets ``name = "auto"``; the probe check rejects such a job.
    """
    options = options or CompileOptions()
    resolved = job.resolved(PRIME_RL_TRAIN_DEFAULTS)
    seq_len = seq_len_for(resolved.max_tokens, options)
    trainer_ckpt: dict[str, Any] = {"weights_only": True}
    trainer: dict[str, Any] = {
        "optim": {"type": "adamw", "lr": resolved.learning_rate},
        "loss": {"type": "default", "kl_tau": resolved.kl_coef},
        "ckpt": trainer_ckpt,
    }
    if job.model.lora_rank > 0:
        trainer["model"] = {"lora": {"rank": job.model.lora_rank, "alpha": LORA_ALPHA}}
        trainer_ckpt["weights"] = {"save_adapter_separately": True}
    return {
        "output_dir": options.output_dir,
        "max_steps": resolved.max_steps,
        "seq_len": seq_len,
        "model": {"name": job.model.name},
        "deployment": {
            "type": "single_node",
            "gpus_per_node": options.gpus_per_node,
            "num_train_gpus": options.num_train_gpus,
            "num_infer_gpus": options.num_infer_gpus,
        },
        "ckpt": {"interval": ckpt_interval(resolved.max_steps, options), "keep_last": options.ckpt_keep_last},
        "file_monitor": {},
        "trainer": trainer,
        "orchestrator": {
            "batch_size": resolved.batch_size,
            "group_size": resolved.group_size,
            "max_off_policy_steps": options.max_off_policy_steps,
            "renderer": dict(MODEL_RENDERERS.get(job.model.name, {"name": "auto"})),
            "post_batch_filters": [dict(item) for item in POST_BATCH_FILTERS],
            "train": {
                "sampling": {"temperature": resolved.temperature, "max_completion_tokens": resolved.max_tokens},
                "source": [{"name": SOURCE_NAME, "legacy": {"id": env_id}}],
            },
        },
        "inference": {
            "gpu_memory_utilization": options.gpu_memory_utilization,
            "seed": job.training.seed,
            "model": {"max_model_len": seq_len},
        },
    }


def render_rl_toml(config: dict[str, Any]) -> str:
    """rl.toml text of a compiled mapping, with a header naming the pinned release."""
    header = f"# Compiled by metarl for prime-rl {PRIME_RL_TAG}. Run: rl @ rl.toml\n"
    return header + tomli_w.dumps(config)


def reward_weights(job: JobSpec) -> dict[str, float]:
    """The job's reward component weights, as the environment package reads them."""
    return {name: float(weight) for name, weight in job.reward.components.items()}


def template_source() -> bytes:
    """The environment package's ``__init__.py`` (metarl/backends/runpod/primerl/env_template.py)."""
    return (Path(__file__).with_name("env_template.py")).read_bytes()


def graders_source() -> bytes:
    """The task families' graders the package ships as its ``metarl_graders`` submodule: the file metarl/graders.py itself."""
    return Path(graders.__file__).read_bytes()


REWARD_RULE_MODULE = "metarl_reward_rule"
"""The package's submodule holding the reward rule (env_template.REWARD_RULE_MODULE)."""


def reward_rule_source() -> bytes:
    """The reward rule the package scores with, as its ``metarl_reward_rule`` submodule: the file
    metarl/reward_rule.py itself, the one the probe and the local trainer import."""
    return Path(reward_rule.__file__).read_bytes()


def pyproject_text(env_id: str, module: str) -> str:
    """pyproject.toml of the environment package (setuptools; verifiers and datasets come from the image)."""
    return (
        "# metarl job environment for prime-rl " + PRIME_RL_TAG + ". It runs inside the prime-rl image,\n"
        "# whose verifiers and datasets it imports: install it with --no-deps.\n"
        "[build-system]\n"
        'requires = ["setuptools>=64"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        f'name = "{env_id}"\n'
        'version = "0.1.0"\n'
        'description = "A trainer agent\'s environment and reward, compiled by metarl"\n'
        'requires-python = ">=3.11"\n'
        "dependencies = []\n\n"
        "[tool.setuptools]\n"
        f'packages = ["{module}"]\n\n'
        "[tool.setuptools.package-data]\n"
        f'{module} = ["{DATASET_FILE}", "{REWARD_CONFIG_FILE}"]\n'
    )


def package_digest(environment_source: bytes, dataset: bytes, weights: dict[str, float], plugin_graders: Mapping[str, bytes] | None = None) -> str:
    """Content digest that names the environment package (same workspace, same graders, same package)."""
    parts = [template_source(), graders_source(), reward_rule_source(), environment_source, dataset, json.dumps(weights, sort_keys=True).encode()]
    parts += [name.encode() + b"\0" + source for name, source in sorted((plugin_graders or {}).items())]
    return sha256_hex(b"\0".join(sha256_hex(part).encode() for part in parts))


def package_files(
    module: str, env_id: str, environment_source: bytes, dataset: bytes, weights: dict[str, float], plugin_graders: Mapping[str, bytes] | None = None
) -> dict[str, bytes]:
    """Files of the environment package, relative to the bundle root; ``plugin_graders`` (name -> source) are
    the plugin grader files the task's grader uses, shipped as ``metarl_grader_NAME.py``."""
    root = f"{PACKAGE_DIR}/{module}"
    return {
        f"{PACKAGE_DIR}/pyproject.toml": pyproject_text(env_id, module).encode(),
        f"{root}/__init__.py": template_source(),
        f"{root}/{graders.GRADERS_MODULE}.py": graders_source(),
        f"{root}/{REWARD_RULE_MODULE}.py": reward_rule_source(),
        **{f"{root}/{graders.plugin_module_name(name)}.py": source for name, source in sorted((plugin_graders or {}).items())},
        f"{root}/{AGENT_MODULE}.py": environment_source,
        f"{root}/{DATASET_FILE}": dataset,
        f"{root}/{REWARD_CONFIG_FILE}": (json.dumps({"weights": weights}, indent=2, sort_keys=True) + "\n").encode(),
    }


class CompiledBundle(BaseModel):
    """A compiled inner job: the rl.toml mapping and text, and every bundle file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest: BundleManifest = Field(description="What the bundle holds")
    rl_config: dict[str, Any] = Field(description="The rl.toml mapping")
    files: dict[str, bytes] = Field(min_length=2, max_length=64, description="Relative path -> content (manifest included)")


def build_bundle(
    job: JobSpec, environment_source: bytes, dataset: bytes, options: CompileOptions | None = None, plugin_graders: Mapping[str, bytes] | None = None
) -> CompiledBundle:
    """The bundle of a job from its environment module and dataset bytes and the plugin graders its task's grader uses (name -> source; pure)."""
    options = options or CompileOptions()
    weights = reward_weights(job)
    env_id, module = env_names(package_digest(environment_source, dataset, weights, plugin_graders))
    config = compile_rl_config(job, env_id, options)
    files = {RL_TOML_FILE: render_rl_toml(config).encode(), **package_files(module, env_id, environment_source, dataset, weights, plugin_graders)}
    lora = config["trainer"].get("model", {}).get("lora")
    manifest = BundleManifest(
        prime_rl_tag=PRIME_RL_TAG,
        env_id=env_id,
        env_module=module,
        output_dir=options.output_dir,
        max_steps=config["max_steps"],
        max_train_seconds=options.max_train_seconds,
        files={path: sha256_hex(data) for path, data in files.items()},
        model_name=job.model.name,
        lora_rank=lora["rank"] if lora else 0,
        lora_alpha=lora["alpha"] if lora else None,
        ckpt_interval=config["ckpt"]["interval"],
    )
    files[MANIFEST_FILE] = (manifest.model_dump_json(indent=2) + "\n").encode()
    return CompiledBundle(manifest=manifest, rl_config=config, files=files)


def compile_bundle(
    job: JobSpec, files_dir: str | Path, options: CompileOptions | None = None, plugin_graders: Mapping[str, bytes] | None = None
) -> CompiledBundle:
    """The bundle of a probed workspace: reads its environment module and dataset with the tools' confinement
    (``plugin_graders``: the task's, :func:`metarl.learning.grader_plugins.grader_sources`).

    Raises :class:`metarl.workspace.WorkspaceError` when a file cannot be read.
    """
    from metarl.workspace import read_workspace_bytes

    environment_source = read_workspace_bytes(files_dir, job.environment.module)
    dataset = read_workspace_bytes(files_dir, job.dataset.path)
    return build_bundle(job, environment_source, dataset, options, plugin_graders)


def write_bundle(bundle: CompiledBundle, url: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Store every bundle file under ``url`` (a folder; local path or any fsspec URL); returns the paths written."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    written = []
    for relative, data in sorted(bundle.files.items()):
        target = f"{root.rstrip('/')}/{relative}"
        parent = target.rsplit("/", 1)[0]
        fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(target, data)
        written.append(relative)
    return written
