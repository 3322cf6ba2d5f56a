"""Reading what prime-rl writes while ``rl`` runs (pydantic and stdlib only: the pod runner imports it).

Facts of prime-rl v0.8.0 (paths relative to its ``src/prime_rl/``): the trainer's and orchestrator's
``metrics.jsonl`` rows (one JSON object a line, ``step`` in the trainer's); a weights folder
``<output_dir>/weights/step_N`` is complete only once its ``STABLE`` file exists (``trainer/ckpt.py``
``WeightCheckpointManager.mark_stable``); a LoRA adapter lies in its ``lora_adapters/``; the orchestrator
logs to ``<output_dir>/logs/orchestrator.log``.

Empty train batches (``orchestrator/orchestrator.py`` ``finalize_train_batch``): a batch none of whose
rollouts is shipped is logged ("Step N: empty train batch (0 of M generated rollouts shipped — all
errored or filtered out)") and after ``MAX_CONSECUTIVE_EMPTY_BATCHES`` (10) in a row the orchestrator
raises, so ``rl`` exits 1. Errored rollouts never reach a batch (``orchestrator/train_sink.py``
``process_group``); post-batch filters drop rollouts only where they enforce. With no filter enforcing
(what the compiler writes), 10 empty batches therefore mean that every rollout errored; each errored
rollout is a warning of ``orchestrator/dispatcher.py`` naming its error.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from metarl.backends.runpod.pod.protocol import LATEST_METRICS_MAX, LOG_TAIL_CHARS

TRAINING_FINISHED = "Training finished!"
STABLE_MARKER = "STABLE"
"""Written last into a complete weights folder (prime-rl v0.8.0 src/prime_rl/trainer/ckpt.py mark_stable)."""
EMPTY_BATCHES_ABORT = "consecutive empty train batches"
"""Words of the orchestrator's abort after 10 empty train batches in a row (prime-rl v0.8.0
src/prime_rl/orchestrator/orchestrator.py finalize_train_batch: ``RuntimeError("10 consecutive empty train
batches — check filter config ...")``), logged to logs/orchestrator.log."""
ROLLOUT_FAILURE = re.compile(r"Rollout (?:task )?failed in group \S+ \((?P<env>[^)\n]*)\)(?: — |: )(?P<cause>[^\n]*)")
"""The orchestrator's warning for an errored rollout (prime-rl v0.8.0 src/prime_rl/orchestrator/dispatcher.py):
"Rollout failed in group <id> (<env>) — <error type>: <message>", or, when the environment call itself
raised, "Rollout task failed in group <id> (<env>): <exception repr>"."""
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
"""Terminal colour codes: rl starts the orchestrator with LOGURU_FORCE_COLORS=1 (src/prime_rl/entrypoints/rl.py)."""
FILTERS_ENFORCING_BY_DEFAULT = {"gibberish": False, "repetition": False, "zero_advantage": True}
"""``enforce`` default of each post-batch filter type (packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py
GibberishFilterConfig, RepetitionFilterConfig, ZeroAdvantageFilterConfig); without a ``post_batch_filters``
list all three apply with these defaults."""
CAUSE_CHARS = 400
ORCHESTRATOR_LOG = "logs/orchestrator.log"
ADAPTER_DIR = "lora_adapters"


class RolloutFailures(BaseModel):
    """The errored rollouts the orchestrator's log names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(default=0, ge=0, description="Errored-rollout warnings in the log text read")
    last: str | None = Field(default=None, max_length=CAUSE_CHARS, description="The last one's cause: error type and message")


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


def empty_batches_logged(log_text: str) -> bool:
    """True when the orchestrator's log holds its abort after 10 empty train batches in a row."""
    return EMPTY_BATCHES_ABORT in log_text


def post_batch_filters_enforce(rl_config: Mapping[str, Any]) -> bool:
    """True when a post-batch filter of rl.toml drops rollouts from train batches (prime-rl's default list does:
    its zero_advantage filter enforces), so that an empty batch may have been filtered rather than errored."""
    orchestrator = rl_config.get("orchestrator")
    filters = orchestrator.get("post_batch_filters") if isinstance(orchestrator, dict) else None
    if filters is None:
        return any(FILTERS_ENFORCING_BY_DEFAULT.values())
    return any(isinstance(item, dict) and bool(item.get("enforce", FILTERS_ENFORCING_BY_DEFAULT.get(str(item.get("type")), True))) for item in filters)


def rollout_failures(log_text: str) -> RolloutFailures:
    """The errored-rollout warnings of an orchestrator log (colour codes ignored): how many, and the last one's cause."""
    causes = [match.group("cause").strip() for match in ROLLOUT_FAILURE.finditer(ANSI_ESCAPE.sub("", log_text))]
    return RolloutFailures(count=len(causes), last=causes[-1][:CAUSE_CHARS] if causes else None)


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
