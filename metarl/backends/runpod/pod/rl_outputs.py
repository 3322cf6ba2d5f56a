"""Reading what prime-rl writes while ``rl`` runs (pydantic and stdlib only: the pod runner imports it).

Facts of prime-rl v0.8.0 (paths relative to its ``src/prime_rl/``): the trainer's and orchestrator's
``metrics.jsonl`` rows (one JSON object a line, ``step`` in the trainer's); a weights folder
``<output_dir>/weights/step_N`` is complete only once its ``STABLE`` file exists (``trainer/ckpt.py``
``WeightCheckpointManager.mark_stable``); a LoRA adapter lies in its ``lora_adapters/``; the orchestrator
logs to ``<output_dir>/logs/orchestrator.log``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from metarl.backends.runpod.pod.protocol import LATEST_METRICS_MAX, LOG_TAIL_CHARS

TRAINING_FINISHED = "Training finished!"
STABLE_MARKER = "STABLE"
"""Written last into a complete weights folder (prime-rl v0.8.0 src/prime_rl/trainer/ckpt.py mark_stable)."""
NO_SIGNAL_MARKER = "consecutive empty train batches"
"""Words of the orchestrator's abort after 10 batches without a learning signal (prime-rl v0.8.0
src/prime_rl/orchestrator/orchestrator.py finalize_train_batch), logged to logs/orchestrator.log."""
ORCHESTRATOR_LOG = "logs/orchestrator.log"
ADAPTER_DIR = "lora_adapters"


def parse_metric_rows(text: str) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON-object rows of a metrics.jsonl chunk and how many bytes they used (a torn last line waits)."""
    rows: list[dict[str, Any]] = []
    consumed = 0
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        consumed += len(line.encode("utf-8"))
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, consumed


def row_step(row: Mapping[str, Any]) -> int | None:
    """The integer ``step`` of a metrics row, if it has one."""
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != step or step < 0:
        return None
    return int(step)


def numeric_metrics(row: Mapping[str, Any], limit: int = LATEST_METRICS_MAX) -> dict[str, float]:
    """Up to ``limit`` finite numbers of a row (rewards, losses, progress), for heartbeats."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if len(out) >= limit:
            break
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf"):
            out[str(key)[:120]] = float(value)
    return out


def latest_weights_step(weights_dir: Path) -> int | None:
    """Highest N of the *complete* ``step_N`` folders prime-rl writes under ``<output_dir>/weights``
    (those with the ``STABLE`` file it writes last; a folder still being written has none)."""
    steps = []
    if weights_dir.is_dir():
        for child in weights_dir.iterdir():
            match = re.fullmatch(r"step_(\d+)", child.name)
            if match and child.is_dir() and (child / STABLE_MARKER).is_file():
                steps.append(int(match.group(1)))
    return max(steps) if steps else None


def is_lora_job(rl_config: Mapping[str, Any]) -> bool:
    """True when rl.toml trains a LoRA adapter (``[trainer.model.lora]``)."""
    trainer = rl_config.get("trainer")
    model = trainer.get("model") if isinstance(trainer, dict) else None
    return isinstance(model, dict) and isinstance(model.get("lora"), dict)


def no_signal_logged(log_text: str) -> bool:
    """True when the orchestrator's log holds its abort for batches without a learning signal."""
    return NO_SIGNAL_MARKER in log_text


def tail_text(path: Path, limit: int = LOG_TAIL_CHARS) -> str:
    """The last ``limit`` characters of a text file ('' when it is missing)."""
    if not path.is_file():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 4 * limit))
        text = handle.read().decode("utf-8", errors="replace")
    return text[-limit:]


class MetricsFollower:
    """Reads the new complete rows of the run's metrics.jsonl files since the last call."""

    def __init__(self, output_dir: Path, files: list[str]):
        self.paths = [output_dir / name for name in files]
        self.offsets = [0 for _ in self.paths]
        self.rows = 0
        self.step: int | None = None
        self.latest: dict[str, float] = {}

    def poll(self) -> int:
        """Read what was appended; returns how many new rows there were."""
        new = 0
        for index, path in enumerate(self.paths):
            if not path.is_file():
                continue
            with path.open("rb") as handle:
                handle.seek(self.offsets[index])
                chunk = handle.read()
            rows, consumed = parse_metric_rows(chunk.decode("utf-8", errors="replace"))
            self.offsets[index] += consumed
            new += len(rows)
            for row in rows:
                if index == 0:
                    step = row_step(row)
                    if step is not None:
                        self.step = step if self.step is None else max(self.step, step)
                self.latest.update(numeric_metrics(row))
        while len(self.latest) > LATEST_METRICS_MAX:
            self.latest.pop(next(iter(self.latest)))
        self.rows += new
        return new
