"""Merge the LoRA adapter prime-rl v0.8.0 saved beside a weights folder into the weights: the trained model.

prime-rl's weight save drops LoRA parameters (its ``weights/step_N`` holds the untrained base) and,
with ``[trainer.ckpt.weights] save_adapter_separately = true``, writes the adapter to
``weights/step_N/lora_adapters/``: ``adapter_model.safetensors`` with keys
``base_model.model.<module>.lora_A.weight`` (rank x in) and ``...lora_B.weight`` (out x rank),
and ``adapter_config.json`` (PEFT style: ``r``, ``lora_alpha``). The trained layer computes
``W x + (alpha / r) B A x``, so the merged weight is ``W + (alpha / r) B @ A`` (computed in float32,
stored in the base tensor's dtype).

The pod runner (``metarl.backends.runpod.pod.runner``) runs this with the pod image's Python (torch and
safetensors; nothing of metarl) after ``rl`` has stopped, and uploads the merged folder as the
job's weights, so every evaluator scores the trained model::

    python lora_merge.py STEP_DIR OUT_DIR

OUT_DIR gets every file of STEP_DIR (shards keep their names, the index is copied), the adapter
folder, and ``metarl_lora_merge.json`` saying what was merged.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ADAPTER_DIR = "lora_adapters"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_PREFIX = "base_model.model."
MERGE_RECORD = "metarl_lora_merge.json"


class MergeError(Exception):
    """The adapter does not fit the weights it was saved with."""


def adapter_scaling(adapter_config: dict[str, Any]) -> float:
    """``lora_alpha / r`` of an adapter_config.json."""
    rank, alpha = adapter_config.get("r"), adapter_config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise MergeError(f"{ADAPTER_CONFIG} needs an integer r >= 1 and a number lora_alpha, got r={rank!r}, lora_alpha={alpha!r}")
    return float(alpha) / rank


def adapter_pairs(adapter_keys: list[str]) -> dict[str, tuple[str, str]]:
    """Base weight key -> (lora_A key, lora_B key) for every adapted module."""
    modules: dict[str, dict[str, str]] = {}
    for key in adapter_keys:
        body = key.removeprefix(ADAPTER_PREFIX)
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if body.endswith(suffix):
                modules.setdefault(body[: -len(suffix)], {})[part] = key
                break
        else:
            raise MergeError(f"unexpected adapter key {key!r} (expected {ADAPTER_PREFIX}<module>.lora_A.weight / .lora_B.weight)")
    pairs = {}
    for module, parts in modules.items():
        if set(parts) != {"lora_A", "lora_B"}:
            raise MergeError(f"adapter module {module} has {sorted(parts)} but needs both lora_A and lora_B")
        pairs[f"{module}.weight"] = (parts["lora_A"], parts["lora_B"])
    return pairs


def merged_tensor(weight: Any, lora_a: Any, lora_b: Any, scaling: float) -> Any:
    """``W + scaling * B @ A`` in float32, returned in W's dtype."""
    if lora_a.dim() != 2 or lora_b.dim() != 2 or lora_b.shape[1] != lora_a.shape[0] or tuple(weight.shape) != (lora_b.shape[0], lora_a.shape[1]):
        raise MergeError(f"shapes do not fit: weight {tuple(weight.shape)}, lora_A {tuple(lora_a.shape)}, lora_B {tuple(lora_b.shape)}")
    return (weight.float() + scaling * (lora_b.float() @ lora_a.float())).to(weight.dtype)


def merge_folder(step_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Write the merged weights folder; returns the merge record."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    adapter_dir = step_dir / ADAPTER_DIR
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    scaling = adapter_scaling(config)
    adapter = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    pairs = adapter_pairs(sorted(adapter))
    shards = sorted(step_dir.glob("*.safetensors"))
    if not shards:
        raise MergeError(f"{step_dir} has no safetensors weights")
    out_dir.mkdir(parents=True, exist_ok=True)
    merged = set()
    for shard in shards:
        with safe_open(str(shard), framework="pt") as handle:
            metadata = handle.metadata() or {"format": "pt"}
        tensors = load_file(str(shard))
        for key in list(tensors):
            if key in pairs:
                lora_a, lora_b = pairs[key]
                tensors[key] = merged_tensor(tensors[key], adapter[lora_a], adapter[lora_b], scaling).contiguous()
                merged.add(key)
        save_file(tensors, str(out_dir / shard.name), metadata=metadata)
    missing = sorted(set(pairs) - merged)
    if missing:
        raise MergeError(f"adapter modules without a base weight in {step_dir.name}: {missing[:3]}")
    for path in step_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copyfile(path, out_dir / path.name)
    shutil.copytree(adapter_dir, out_dir / ADAPTER_DIR, dirs_exist_ok=True)
    record = {"merged_modules": len(merged), "scaling": scaling, "rank": config["r"], "alpha": config["lora_alpha"], "source": step_dir.name}
    (out_dir / MERGE_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    """``lora_merge.py STEP_DIR OUT_DIR``: exit 0 and print the record, or exit 1 with the reason."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: lora_merge.py STEP_DIR OUT_DIR", file=sys.stderr)
        return 2
    try:
        record = merge_folder(Path(args[0]), Path(args[1]))
    except (MergeError, OSError, KeyError, ValueError) as err:
        print(f"merge failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
