"""Job bundles for pod-side tests: the compiler's bundle with rl.toml keys set or removed by the test.

The pod runner reads rl.toml itself, so a test states the prime-rl keys it depends on (``[ckpt]
interval``, ``[trainer.ckpt.weights] save_adapter_separately``, ``[trainer.model.lora]``,
``[orchestrator] post_batch_filters``) instead of relying on what the compiler emits today. The
manifest is rewritten to match (same fields, new digests).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from metarl.backends.runpod.pod.manifest import MANIFEST_FILE, RL_TOML_FILE, sha256_hex
from metarl.backends.runpod.primerl.compiler import CompiledBundle, CompileOptions, build_bundle, render_rl_toml, write_bundle
from schemas.job import JobSpec

ENVIRONMENT = """
def correctness(prompt, completion, answer):
    return 1.0 if completion.strip() == answer else 0.0


def is_number(prompt, completion, answer):
    return float(completion.strip().isdigit())


COMPONENTS = {"correctness": correctness, "format": is_number}


def reward(prompt, completion, answer):
    return correctness(prompt, completion, answer) + 0.1 * is_number(prompt, completion, answer)
"""

DELETE = object()
"""An override value that removes the key from rl.toml."""


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` deep-merged in (a ``DELETE`` value removes the key)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def job_spec(max_steps: int, *, lora_rank: int = 0, model: str = "Qwen/Qwen3-0.6B", components: dict[str, float] | None = None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name": model, "lora_rank": lora_rank},
            "training": {"max_steps": max_steps, "batch_size": 16, "group_size": 8},
            "reward": {"components": components or {"correctness": 1.0, "format": 0.1}},
            "dataset": {"size": 3},
        }
    )


def make_bundle(job: JobSpec, rl: dict[str, Any] | None = None, *, max_train_seconds: float | None = None, environment: str = ENVIRONMENT) -> CompiledBundle:
    """The compiled bundle of ``job`` with the rl.toml overrides applied and the manifest rewritten."""
    dataset = b"".join(json.dumps({"prompt": f"add {i}+1=", "answer": str(i + 1)}).encode() + b"\n" for i in range(3))
    bundle = build_bundle(job, environment.encode(), dataset, CompileOptions(max_train_seconds=max_train_seconds))
    config = merged(bundle.rl_config, rl or {})
    files = {path: data for path, data in bundle.files.items() if path != MANIFEST_FILE}
    files[RL_TOML_FILE] = render_rl_toml(config).encode()
    manifest = bundle.manifest.model_copy(update={"files": {path: sha256_hex(data) for path, data in files.items()}})
    files[MANIFEST_FILE] = (manifest.model_dump_json(indent=2) + "\n").encode()
    return CompiledBundle(manifest=manifest, rl_config=config, files=files)


def store_bundle(url_dir: Path, bundle: CompiledBundle) -> str:
    """Write the bundle under ``url_dir`` and return its file URL."""
    url = url_dir.as_uri()
    write_bundle(bundle, url)
    return url
