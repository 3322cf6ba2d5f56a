"""Runpod pods and their billing: the names, the files pods and jobs share in artifact storage, and what a pod costs.

The layout of `<artifacts root>/runpod/` and the billing rule are in :mod:`metarl.backends.runpod.train`'s docstring;
this module holds the value types (:class:`JobState`, :class:`AttemptPointer`), the pure naming and billing functions,
and :class:`Store`, the JSON files under that folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import threading
from collections.abc import Mapping
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metarl.backends.runpod.pod.protocol import ENV_PREFIX as RUNNER_ENV_PREFIX
from metarl.backends.runpod.pod.supervisor import assignment_path
from metarl.interfaces import CostItem

log = logging.getLogger("metarl.runpod")


class JobUrls(TypedDict):
    """Where a pod reads its job bundle and writes its results."""

    job_url: str
    result_url: str


NAME_PREFIX = "metarl-"
POOL_LOCK_KEY = int.from_bytes(hashlib.sha256(b"metarl-runpod-pool").digest()[:7], "big")
REAP_LOCK_KEY = POOL_LOCK_KEY ^ 0x2A2A
RUNNER_JOB_URL_ENV, RUNNER_RESULT_URL_ENV = f"{RUNNER_ENV_PREFIX}JOB_URL", f"{RUNNER_ENV_PREFIX}RESULT_URL"


class Frozen(BaseModel):
    """Immutable value type."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- the pod/runner protocol (files in artifact storage) -------------------------------------


class AttemptPointer(Frozen):
    """jobs/<job>/a<k>/pod.json: which pod runs attempt k of a job."""

    pod_name: str = Field(min_length=1, max_length=191, description="Pod name")
    pod_id: str | None = Field(default=None, max_length=128, description="Pod id, once known")


class JobState(BaseModel):
    """What the backend keeps in inner_jobs.backend_state between polls (no secrets)."""

    model_config = ConfigDict(extra="forbid")

    job_name: str = Field(min_length=1, max_length=191)
    attempt: int = Field(default=0, ge=0, le=100)
    pod_id: str | None = Field(default=None, max_length=128)
    pod_name: str | None = Field(default=None, max_length=191)
    gpu_type: str | None = Field(default=None, max_length=128)
    gpu_count: int = Field(default=0, ge=0, le=64)
    cost_per_hr: float = Field(default=0.0, ge=0.0)
    assigned_at: float = Field(default=0.0)
    uptime_at_assign: int = Field(default=0, ge=0)
    last_uptime: int = Field(default=0, ge=0)
    billed_chunks: int = Field(default=0, ge=0)
    last_step: int = Field(default=-2, ge=-2)
    last_progress_at: float = Field(default=0.0)
    prior_usd: float = Field(default=0.0, ge=0.0)
    restarts: list[str] = Field(default_factory=list, max_length=100)
    waiting_since: float | None = Field(default=None)
    api_errors: int = Field(default=0, ge=0)
    eval_requested_at: float | None = Field(default=None, description="When the on-pod eval request was published")
    eval_uptime_start: int | None = Field(default=None, ge=0, description="Pod uptime at that moment: later billing intervals are the eval's")
    eval_targets: list[str] = Field(default_factory=list, max_length=2, description="Models the pod was asked to score")
    eval_result_uri: str | None = Field(default=None, max_length=4096, description="The pod's eval result, for the eval stage")
    trained_is_base: bool = Field(default=False, description="The job saved no weights and had no learning signal: the trained model is the base")


# --- pure logic --------------------------------------------------------------------------------


def storage_environment(names: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The artifact-storage variables a pod gets: each listed name that is set (and not empty) here."""
    return {name: environ[name] for name in names if environ.get(name)}


def pod_name_for(job_name: str, attempt: int) -> str:
    """The pod created for attempt k of a job: the job's name, then `-r<k>` for restarts."""
    return job_name if attempt == 0 else f"{job_name}-r{attempt}"


def run_prefix(run_id: str) -> str:
    """Name prefix of every pod of a run (job names are `metarl-<first 8 of run id>-<episode>`)."""
    return f"{NAME_PREFIX}{run_id[:8]}-"


def run_key_of(pod_name: str) -> str | None:
    """The 8-character run key in a pod name of ours, or None."""
    if not pod_name.startswith(NAME_PREFIX):
        return None
    key = pod_name[len(NAME_PREFIX) :].split("-", 1)[0]
    return key if len(key) == 8 else None


def billable_chunks(uptime_s: int, chunk_s: int, billed_chunks: int, final: bool) -> list[tuple[int, int]]:
    """(interval index, seconds) still to charge: complete intervals, and the partial last one once final."""
    complete = uptime_s // chunk_s
    chunks = [(index, chunk_s) for index in range(billed_chunks, complete)]
    if final and uptime_s % chunk_s and complete >= billed_chunks:
        chunks.append((complete, uptime_s % chunk_s))
    return chunks


def chunks_after(uptime_s: int, chunk_s: int, billed_chunks: int, final: bool) -> int:
    """Intervals charged once `billable_chunks` are recorded."""
    done = max(billed_chunks, uptime_s // chunk_s)
    return done + 1 if final and uptime_s % chunk_s and uptime_s // chunk_s >= billed_chunks else done


def pod_charges(
    pod_id: str,
    gpu_label: str,
    cost_per_hr: float,
    chunks: list[tuple[int, int]],
    chunk_s: int,
    eval_from_s: int | None = None,
    job_name: str | None = None,
    note: str | None = None,
) -> list[CostItem]:
    """Ledger items for pod intervals; the key names the pod and the interval, never the poller. Intervals that start at or
    after ``eval_from_s`` (the pod's uptime when the job's eval request was published) are the hidden eval's (``runpod_eval``);
    ``note`` ends each description (why the pod was settled, say)."""
    items = []
    for index, seconds in chunks:
        evaluating = eval_from_s is not None and index * chunk_s >= eval_from_s
        items.append(
            CostItem(
                source="runpod_eval" if evaluating else "runpod",
                description=f"runpod pod {pod_id} ({gpu_label}) seconds {index * chunk_s}-{index * chunk_s + seconds}"
                + (f", hidden eval of {job_name}" if evaluating and job_name else "")
                + (f", {note}" if note else ""),
                quantity=float(seconds),
                unit="pod_second",
                unit_price_usd=cost_per_hr / 3600.0,
                key=f"runpod:{pod_id}:{index}",
            )
        )
    return items


def final_uptime(frozen_uptime: int | None, last_uptime: int) -> int:
    """Seconds to bill a settled pod: its uptime after the stop, never less than what we saw before."""
    return max(frozen_uptime or 0, last_uptime)


def startup_uptime(uptime_s: int, uptime_at_assign: int, assigned_at: float, now: float) -> int:
    """Seconds to bill a pod whose job timed out in its start-up: its uptime, and never less than the pod's
    uptime when the job took it plus the wall seconds since (a container that never started shows no
    uptime while the pod is billed)."""
    return max(uptime_s, uptime_at_assign + max(0, int(now - assigned_at)))


def settle_price(job_price: float | None, queried_price: float | None, listed_price: float | None) -> float:
    """The price of a settled pod: the one recorded when the job took it, else what the vendor shows."""
    for price in (job_price, queried_price, listed_price):
        if price:
            return price
    return 0.0


def job_cost_usd(prior_usd: float, uptime_s: int, uptime_at_assign: int, cost_per_hr: float) -> float:
    """What a job has cost: earlier attempts plus its share of the current pod's seconds."""
    return prior_usd + max(0, uptime_s - uptime_at_assign) * cost_per_hr / 3600.0


# --- artifact storage -------------------------------------------------------------------------


class Store:
    """JSON files under `<artifacts root>/runpod` through fsspec (a local folder or object storage)."""

    def __init__(self, artifacts_root: str):
        import fsspec

        self.fs, base = fsspec.core.url_to_fs(artifacts_root)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        if self.local:
            base = os.path.abspath(base)
        self.root = posixpath.join(base, "runpod")
        self.root_uri = self.root if self.local else self.fs.unstrip_protocol(self.root)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def uri(self, path: str) -> str:
        return path if self.local else self.fs.unstrip_protocol(path)

    def read(self, path: str) -> bytes | None:
        try:
            with self.fs.open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def read_model(self, path: str, model: type[BaseModel]) -> Any:
        data = self.read(path)
        if data is None:
            return None
        try:
            return model.model_validate_json(data)
        except ValidationError:
            log.warning("unreadable %s (partial write?); treated as absent", path)
            return None

    def write_bytes(self, path: str, data: bytes) -> None:
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if self.local:
            temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        else:
            self.fs.pipe_file(path, data)

    def write_model(self, path: str, value: BaseModel) -> None:
        self.write_bytes(path, value.model_dump_json().encode("utf-8"))

    def assignment_path(self, pod_name: str) -> str:
        return self.path(*assignment_path(pod_name).split("/"))

    def attempt_path(self, job_name: str, attempt: int) -> str:
        return self.path("jobs", job_name, f"a{attempt}")
