"""Runpod pods behind one uniform interface: launch, query, stop, terminate, list owned.

This is the only module that imports the `runpod` SDK (lazily, on the first call). Everything the
SDK returns is mapped here, at the boundary, to our own values (`PodState`, `PodInfo`) and every
SDK error to one of our error classes (`CapacityError`, `TransientBackendError`,
`PermanentBackendError`), so nothing above this module sees a vendor status or parses a message.

Facts of the SDK (runpod 1.12) this module relies on:
- the API key is the module global `runpod.api_key` (the SDK does not read RUNPOD_API_KEY); we set
  it from the environment before every call and never read it from anywhere else;
- the endpoint is read on every call from RUNPOD_API_BASE_URL (tests point it at a fake server);
- each request has a fixed 30 s timeout; reads and idempotent writes here run in a helper thread
  with our own, shorter deadline, but a create runs in the calling thread so that an abandoned
  create can never deploy a pod behind our back;
- the GraphQL is built with f-strings and no escaping, so env values are encoded (`encode_env`)
  and names and image names are checked before they reach the SDK;
- `create_pod(allowed_cuda_versions=[...])` sends `allowedCudaVersions: ["12.8", ...]` in the deploy
  mutation (GPU pods only): the pod is placed only on a host whose CUDA version is listed.
"""

from __future__ import annotations

import base64
import concurrent.futures
import enum
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from metarl.backends.runpod.config import RUNPOD_API_KEY_ENV
from metarl.backends.runpod.pod.pin import PRIME_RL_IMAGE_CUDA
from metarl.backends.runpod.pod.protocol import ENCODED_PREFIX
from metarl.domain.retry import Backoff, backoff_delay
from metarl.errors import CapacityError, PermanentBackendError, TransientBackendError

log = logging.getLogger("metarl.runpod")


T = TypeVar("T")

SAFE_TEXT = re.compile(r"^[A-Za-z0-9 ._:/@+=,\-]*$")
SAFE_ENV_VALUE = re.compile(r"[A-Za-z0-9._:/@+=,\-]*")
ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
POD_ID = re.compile(r"^[A-Za-z0-9]{1,64}$")

RUNPOD_CUDA_VERSIONS = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0")
"""Host CUDA versions Runpod accepts in `allowedCudaVersions`, oldest first (the enum of
`PodCreateInput.allowedCudaVersions` in Runpod's REST API reference, "Create a Pod")."""


def cuda_version_key(version: str) -> tuple[int, int]:
    """A "major.minor" CUDA version as a sortable pair."""
    major, minor = version.split(".")
    return int(major), int(minor)


def cuda_versions_from(minimum: str, offered: tuple[str, ...] = RUNPOD_CUDA_VERSIONS) -> tuple[str, ...]:
    """The offered host CUDA versions at or above `minimum` (a container built on CUDA X runs on a driver of X or newer)."""
    return tuple(version for version in offered if cuda_version_key(version) >= cuda_version_key(minimum))


IMAGE_CUDA_VERSIONS = cuda_versions_from(PRIME_RL_IMAGE_CUDA)
"""Hosts a pod of the pinned image may run on (`PRIME_RL_IMAGE_CUDA` and newer)."""


class PodState(str, enum.Enum):
    """Our own pod lifecycle; vendor statuses are mapped to it in `map_status`."""

    provisioning = "provisioning"
    running = "running"
    stopped = "stopped"
    terminated = "terminated"
    unknown = "unknown"


class ErrorKind(str, enum.Enum):
    """What an SDK failure means for the caller."""

    capacity = "capacity"
    transient = "transient"
    permanent = "permanent"
    not_found = "not_found"


class Frozen(BaseModel):
    """Immutable value type."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PodInfo(Frozen):
    """One pod as we see it (vendor fields mapped)."""

    pod_id: str = Field(min_length=1, max_length=128, description="Vendor pod id")
    name: str = Field(max_length=191, description="Pod name (ours: metarl-<run>-<job>)")
    state: PodState = Field(description="Mapped lifecycle state")
    vendor_status: str | None = Field(default=None, max_length=64, description="The vendor's desiredStatus, for logs only")
    cost_per_hr: float = Field(default=0.0, ge=0.0, le=10_000.0, description="USD per hour of the whole pod")
    uptime_s: int = Field(default=0, ge=0, description="Seconds the vendor reports the pod has been up")
    gpu_count: int = Field(default=0, ge=0, le=64, description="GPUs attached")
    gpu_type: str | None = Field(default=None, max_length=128, description="GPU type launched with, or the vendor's display name")
    image: str | None = Field(default=None, max_length=512, description="Container image")


class LaunchRequest(Frozen):
    """What to launch; the name makes the launch idempotent."""

    name: str = Field(min_length=1, max_length=191, pattern=r"^[a-z0-9][a-z0-9\-]*$", description="Pod name, unique per job attempt")
    image: str = Field(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@\-]*$", description="Container image")
    gpu_types: tuple[str, ...] = Field(min_length=1, max_length=16, description="GPU types in order of preference (fallbacks on capacity errors)")
    gpu_count: int = Field(default=2, ge=1, le=8, description="GPUs per pod")
    cloud_type: Literal["ALL", "SECURE", "COMMUNITY"] = Field(default="ALL", description="Runpod cloud")
    container_disk_gb: int = Field(default=50, ge=1, le=4000, description="Container disk")
    volume_gb: int = Field(default=0, ge=0, le=10_000, description="Pod volume")
    env: dict[str, str] = Field(default_factory=dict, repr=False, description="Environment of the pod (never a secret it does not need; kept out of repr)")
    cuda_versions: tuple[str, ...] = Field(
        default=IMAGE_CUDA_VERSIONS,
        min_length=1,
        max_length=len(RUNPOD_CUDA_VERSIONS),
        description="Host CUDA versions the pod may be placed on (Runpod's allowedCudaVersions), each one of RUNPOD_CUDA_VERSIONS",
    )

    @field_validator("cuda_versions")
    @classmethod
    def _known_cuda_versions(cls, versions: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [version for version in versions if version not in RUNPOD_CUDA_VERSIONS]
        if unknown:
            raise ValueError(f"{unknown} are not CUDA versions Runpod offers ({', '.join(RUNPOD_CUDA_VERSIONS)})")
        return versions


class RetryPolicy(Frozen):
    """Retries of one API call at the edge (transient errors only)."""

    attempts: int = Field(default=4, ge=1, le=50, description="Tries of one call")
    backoff_s: float = Field(default=1.0, ge=0.0, le=120.0, description="First backoff; doubles per try")
    max_backoff_s: float = Field(default=15.0, ge=0.0, le=600.0, description="Largest backoff")
    call_timeout_s: float = Field(default=20.0, gt=0.0, le=300.0, description="Deadline of one read or idempotent write")

    @property
    def backoff(self) -> Backoff:
        """The wait between tries: `backoff_s`, doubling per try, at most `max_backoff_s`."""
        return Backoff(first_s=self.backoff_s, factor=2.0, max_s=self.max_backoff_s)


# --- pure mapping and classification -------------------------------------------------------


def map_status(desired_status: str | None, has_runtime: bool) -> PodState:
    """Vendor desiredStatus (+ whether the container runtime is up) -> our PodState."""
    status = (desired_status or "").upper()
    if status in ("CREATED", "RESTARTING"):
        return PodState.provisioning
    if status == "RUNNING":
        return PodState.running if has_runtime else PodState.provisioning
    if status in ("EXITED", "PAUSED", "STOPPED"):
        return PodState.stopped
    if status in ("TERMINATED", "DEAD"):
        return PodState.terminated
    return PodState.unknown


CAPACITY_PHRASES = (
    "no longer any instances available",
    "does not have the resources to deploy",
    "not enough free gpus",
    "no instances available",
)
NOT_FOUND_PHRASES = ("not found", "does not exist", "no pod with")
TRANSIENT_PHRASES = (
    "internal server error",
    "timed out",
    "timeout",
    "temporarily",
    "try again later",
    "rate limit",
    "too many requests",
    "service unavailable",
    "bad gateway",
)


def classify_message(message: str) -> ErrorKind:
    """A GraphQL error message -> what it means (at the edge, the only place messages are read)."""
    text = message.lower()
    if any(phrase in text for phrase in CAPACITY_PHRASES):
        return ErrorKind.capacity
    if any(phrase in text for phrase in NOT_FOUND_PHRASES):
        return ErrorKind.not_found
    if any(phrase in text for phrase in TRANSIENT_PHRASES):
        return ErrorKind.transient
    return ErrorKind.permanent


def sdk_errors() -> tuple[type[BaseException], ...]:
    """The exceptions an SDK call can raise (its own, `requests`, odd bodies, our deadline)."""
    import requests
    from runpod import error as sdk_error

    return (sdk_error.RunPodError, requests.RequestException, KeyError, TypeError, ValueError, concurrent.futures.TimeoutError)


def classify_exception(err: BaseException) -> ErrorKind:
    """An exception raised by an SDK call -> what it means."""
    import requests
    from runpod import error as sdk_error

    if isinstance(err, sdk_error.AuthenticationError):
        return ErrorKind.permanent
    if isinstance(err, sdk_error.QueryError):
        return classify_message(str(err))
    if isinstance(err, requests.RequestException):  # includes JSONDecodeError of an HTML 5xx body
        return ErrorKind.transient
    if isinstance(err, (KeyError, TypeError, concurrent.futures.TimeoutError)):
        return ErrorKind.transient  # an odd 5xx body ({"data": null}, no "data"), or our own deadline
    if isinstance(err, ValueError):
        return ErrorKind.not_found if "no gpu found" in str(err).lower() else ErrorKind.permanent
    return ErrorKind.permanent


def launch_order(gpu_types: tuple[str, ...] | list[str], failed_at: dict[str, float], now: float, cooldown_s: float) -> list[str]:
    """GPU types to try, best first: those without a capacity error in the last `cooldown_s` seconds in
    order of preference, then the recently failed ones, longest ago first (each type once)."""
    unique = list(dict.fromkeys(gpu_types))
    fresh = [gpu for gpu in unique if now - failed_at.get(gpu, float("-inf")) >= cooldown_s]
    cooling = sorted((gpu for gpu in unique if gpu not in fresh), key=lambda gpu: failed_at[gpu])
    return fresh + cooling


def encode_env_value(value: str) -> str:
    """A value the SDK can put in its GraphQL unescaped: plain safe text as is, anything else base64 with a `b64:` prefix."""
    if SAFE_ENV_VALUE.fullmatch(value) and not value.startswith(ENCODED_PREFIX):
        return value
    return ENCODED_PREFIX + base64.urlsafe_b64encode(value.encode("utf-8")).decode("ascii")


def encode_env(env: dict[str, str]) -> dict[str, str]:
    """Check keys and encode values; refuses anything that names the Runpod key."""
    encoded = {}
    for key, value in env.items():
        if not ENV_KEY.match(key):
            raise PermanentBackendError(f"pod env key {key!r} is not an upper-case identifier")
        if key == RUNPOD_API_KEY_ENV:
            raise PermanentBackendError(f"{RUNPOD_API_KEY_ENV} is never passed to a pod")
        encoded[key] = encode_env_value(value)
    return encoded


def checked_pod_id(pod_id: str) -> str:
    """A pod id as the vendor makes them; anything else never reaches the SDK's unescaped GraphQL."""
    if not POD_ID.match(pod_id):
        raise PermanentBackendError(f"{pod_id!r} is not a Runpod pod id")
    return pod_id


def pod_info_from(raw: dict[str, Any], gpu_type: str | None = None) -> PodInfo:
    """One `pod` / `pods` entry of the GraphQL answer -> PodInfo."""
    machine = raw.get("machine") or {}
    return PodInfo(
        pod_id=str(raw["id"]),
        name=str(raw.get("name") or ""),
        state=map_status(raw.get("desiredStatus"), raw.get("runtime") is not None),
        vendor_status=str(raw.get("desiredStatus"))[:64] if raw.get("desiredStatus") is not None else None,
        cost_per_hr=float(raw.get("costPerHr") or 0.0),
        uptime_s=max(0, int(raw.get("uptimeSeconds") or 0)),
        gpu_count=int(raw.get("gpuCount") or 0),
        gpu_type=gpu_type or machine.get("gpuDisplayName"),
        image=raw.get("imageName"),
    )


# --- the provider -------------------------------------------------------------------------

_EXECUTOR: concurrent.futures.ThreadPoolExecutor | None = None
_CAPACITY_FAILED_AT: dict[str, float] = {}
"""When each GPU type last answered with a capacity error in this process (monotonic seconds)."""
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="runpod-call")
        return _EXECUTOR


def _sdk() -> Any:
    """The SDK module with the key set from the environment (and only from there)."""
    key = os.environ.get(RUNPOD_API_KEY_ENV, "")
    if not key:
        raise PermanentBackendError(f"{RUNPOD_API_KEY_ENV} is not set: export it in the environment of the train workers and the orchestrator")
    import runpod

    runpod.api_key = key
    return runpod


class RunpodProvider:
    """Launch (idempotent by name, GPU fallbacks), query, stop, terminate and list our pods."""

    def __init__(self, retry: RetryPolicy | None = None, capacity_cooldown_s: float = 60.0, sleep: Callable[[float], None] = time.sleep):
        self.retry = retry or RetryPolicy()
        self.capacity_cooldown_s = capacity_cooldown_s
        self._sleep = sleep

    # edge retries

    def _once(self, call: Callable[[Any], T], deadline: bool) -> T:
        sdk = _sdk()  # imported and keyed in this thread: the import alone can take seconds
        if not deadline:
            return call(sdk)
        future = _executor().submit(call, sdk)
        return future.result(timeout=self.retry.call_timeout_s)

    def _call(self, what: str, call: Callable[[Any], T], *, deadline: bool = True, not_found: T | None = None) -> T:
        """Run one idempotent SDK call with edge retries; map the final failure to our errors."""
        last: BaseException | None = None
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return self._once(call, deadline)
            except sdk_errors() as err:
                kind = classify_exception(err)
                if kind == ErrorKind.not_found and not_found is not None:
                    return not_found
                if kind == ErrorKind.capacity:
                    raise CapacityError(f"runpod {what}: {describe(err)}") from None
                if kind in (ErrorKind.permanent, ErrorKind.not_found):
                    raise PermanentBackendError(f"runpod {what}: {describe(err)}") from None
                last = err
                log.warning("runpod %s: transient error (try %s/%s): %s", what, attempt, self.retry.attempts, describe(err))
                if attempt < self.retry.attempts:
                    self._sleep(backoff_delay(self.retry.backoff, attempt))
        raise TransientBackendError(f"runpod {what}: {describe(last)} (after {self.retry.attempts} tries)")

    # uniform interface

    def list_owned(self, prefix: str) -> list[PodInfo]:
        """Every pod of the account whose name starts with `prefix` (terminated pods are gone)."""
        pods = self._call("list pods", lambda sdk: sdk.get_pods())
        return [pod_info_from(raw) for raw in (pods or []) if str(raw.get("name") or "").startswith(prefix)]

    def query(self, pod_id: str) -> PodInfo | None:
        """The pod now, or None when it no longer exists."""
        pod_id = checked_pod_id(pod_id)
        raw: dict[str, Any] = self._call(f"query pod {pod_id}", lambda sdk: sdk.get_pod(pod_id), not_found={})
        if not raw:
            return None
        return pod_info_from(raw)

    def stop(self, pod_id: str) -> None:
        """Stop the pod (GPU billing ends; it can still be queried). A missing pod is fine."""
        pod_id = checked_pod_id(pod_id)
        self._call(f"stop pod {pod_id}", lambda sdk: sdk.stop_pod(pod_id), not_found={})

    def terminate(self, pod_id: str) -> None:
        """Terminate the pod for good. Idempotent: a pod that is already gone is fine."""
        pod_id = checked_pod_id(pod_id)
        self._call(f"terminate pod {pod_id}", lambda sdk: sdk.terminate_pod(pod_id) or {}, not_found={})

    def find_by_name(self, name: str) -> PodInfo | None:
        """The live pod with exactly this name (the lowest id, should a create processed late have left two)."""
        matches = [pod for pod in self.list_owned(name) if pod.name == name and pod.state != PodState.terminated]
        return sorted(matches, key=lambda pod: pod.pod_id)[0] if matches else None

    def launch(self, request: LaunchRequest) -> PodInfo:
        """Idempotent by name: an existing pod of that name is returned; else try each GPU type in turn.

        Raises CapacityError when no GPU type has capacity, TransientBackendError when the API
        stayed unreachable, PermanentBackendError for a request the API refuses.
        """
        env = encode_env(request.env)
        for text in (*request.gpu_types,):
            if not SAFE_TEXT.match(text):
                raise PermanentBackendError(f"GPU type {text!r} has characters the Runpod SDK cannot send")
        existing = self.find_by_name(request.name)
        if existing is not None:
            log.info("runpod pod %s exists (%s): re-attached, not launched again", request.name, existing.pod_id)
            return existing
        reasons: list[str] = []
        for gpu in launch_order(request.gpu_types, _CAPACITY_FAILED_AT, time.monotonic(), self.capacity_cooldown_s):
            created = self._create(request, gpu, env, reasons)
            if created is None:
                _CAPACITY_FAILED_AT[gpu] = time.monotonic()
                continue
            _CAPACITY_FAILED_AT.pop(gpu, None)
            info = self.query(created)
            if info is None:
                return PodInfo(pod_id=created, name=request.name, state=PodState.provisioning, gpu_count=request.gpu_count, gpu_type=gpu, image=request.image)
            return info.model_copy(update={"gpu_type": gpu})
        raise CapacityError(f"no capacity for {request.gpu_count}x any of {list(request.gpu_types)}: " + "; ".join(reasons))

    def _create(self, request: LaunchRequest, gpu: str, env: dict[str, str], reasons: list[str]) -> str | None:
        """Create one pod of one GPU type; None on a capacity error. A lost reply is found again by name."""

        def create(sdk: Any) -> Any:
            return sdk.create_pod(
                name=request.name,
                image_name=request.image,
                gpu_type_id=gpu,
                gpu_count=request.gpu_count,
                cloud_type=request.cloud_type,
                container_disk_in_gb=request.container_disk_gb,
                volume_in_gb=request.volume_gb,
                support_public_ip=False,
                start_ssh=False,
                env=env,
                allowed_cuda_versions=list(request.cuda_versions),
            )

        last: BaseException | None = None
        for attempt in range(1, self.retry.attempts + 1):
            try:
                created = self._once(create, deadline=False)
                log.info("runpod pod %s created on %sx %s", request.name, request.gpu_count, gpu)
                return str(created["id"])
            except sdk_errors() as err:
                kind = classify_exception(err)
                if kind in (ErrorKind.capacity, ErrorKind.not_found):
                    reasons.append(f"{gpu}: {describe(err)}")
                    log.info("runpod: no %s for %s: %s", gpu, request.name, describe(err))
                    return None
                if kind == ErrorKind.permanent:
                    raise PermanentBackendError(f"runpod create {request.name} on {gpu}: {describe(err)}") from None
                last = err
                log.warning("runpod create %s: transient error (try %s/%s): %s", request.name, attempt, self.retry.attempts, describe(err))
                # The reply may be lost while the pod exists: look for it by name before trying again.
                found = self.find_by_name(request.name)
                if found is not None:
                    log.info("runpod pod %s was created although the reply was lost: re-attached", request.name)
                    return found.pod_id
                if attempt < self.retry.attempts:
                    self._sleep(backoff_delay(self.retry.backoff, attempt))
        raise TransientBackendError(f"runpod create {request.name}: {describe(last)} (after {self.retry.attempts} tries)")


def describe(err: BaseException | None) -> str:
    """A short, key-free description of an SDK failure (never the query, which holds the pod env)."""
    if err is None:
        return "no error"
    if isinstance(err, concurrent.futures.TimeoutError):
        return "no answer within the call deadline"
    message = getattr(err, "message", None) or str(err) or type(err).__name__
    return f"{type(err).__name__}: {str(message)[:300]}"
