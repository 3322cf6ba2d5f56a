"""A fake Runpod GraphQL API on 127.0.0.1, driven through the real `runpod` SDK (RUNPOD_API_BASE_URL).

It answers the GraphQL the SDK 1.12 sends for pods and GPU types (podFindAndDeployOnDemand,
pod, myself.pods, podStop, podTerminate, gpuTypes) and keeps pods with a lifecycle
(CREATED -> RUNNING -> EXITED, then gone when terminated). A RUNNING pod really runs: the fake
starts a configured local command (tests/fakes/runner.py) with exactly the environment the API
call gave the pod, plus what Runpod itself injects (RUNPOD_POD_ID), so its progress is real.

Billing, as the fake defines it: a pod is billed per whole second from its creation until it is
stopped, preempted or terminated, at the costPerHr fixed at creation (GPU price x count).
`uptimeSeconds` reports those billed seconds and freezes when billing stops; terminated pods
disappear from the API but stay in `billing()`.

Host CUDA: each GPU type is offered on hosts of given CUDA versions (`GpuOffer.host_cuda`). A deploy
that sends `allowedCudaVersions` is placed on the first host whose version is listed, and refused as
out of capacity when none is; one that does not is placed on the first host. With `image_cuda` set, a
pod on an older host never starts its container (as the NVIDIA runtime refuses an image whose
NVIDIA_REQUIRE_CUDA the driver cannot meet): it stays RUNNING without a runtime and shows no uptime,
while billing runs from its creation as for any pod.

Faults (all injectable while it runs, thread-safe): capacity errors per GPU type, 5xx answers
(an HTML 502, a JSON 500 without data, a 503 with a GraphQL error), lost replies (the operation is
applied, the connection is dropped), slow replies, preemption and hangs (the pod's process is
SIGSTOPped: the pod stays RUNNING and billed, its progress stops). Traffic is bounded: past
`max_requests` every request gets a 429 and `overflowed` is set.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.fakes.http import QuietHandler, loopback_url

RUNPOD_CUDA_VERSIONS = ("11.8", "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.7", "12.8", "12.9", "13.0")
"""Values Runpod accepts in allowedCudaVersions (kept apart from metarl's own list: the fake checks it)."""

CAPACITY_MESSAGE = "There are no longer any instances available with the requested specifications. Please refresh and try again."


@dataclass(frozen=True)
class GpuOffer:
    """One GPU type of the fake's catalog."""

    id: str
    display_name: str
    memory_gb: int
    secure_price: float
    community_price: float
    max_gpu_count: int = 8
    host_cuda: tuple[str, ...] = ("12.8",)
    """CUDA versions of the hosts that offer this GPU type, in the order deploys take them."""


DEFAULT_GPUS = (
    GpuOffer("NVIDIA A40", "A40", 48, 0.44, 0.39),
    GpuOffer("NVIDIA RTX A6000", "RTX A6000", 48, 0.49, 0.44),
    GpuOffer("NVIDIA L40S", "L40S", 48, 0.86, 0.79),
)


@dataclass
class Faults:
    """What goes wrong, and when. Counters are consumed as faults fire."""

    capacity_errors: dict[str, int] = field(default_factory=dict)
    """GPU type -> how many deploys of it fail with a capacity error (-1: all of them)."""
    every_nth_5xx: int = 0
    """Every n-th request (counting all) is answered with a 5xx, before it is applied (0: never)."""
    lost_replies: dict[str, int] = field(default_factory=dict)
    """Operation -> how many times it is applied and then the connection dropped without a reply."""
    slow_replies: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Operation -> (times, seconds): applied, then answered only after the delay."""
    preempt_job: dict[int, float] = field(default_factory=dict)
    """Job number (1 = the first job any pod's process started) -> seconds after that start when its pod is preempted."""
    hang_job: dict[int, float] = field(default_factory=dict)
    """Job number -> seconds after its start when its pod's process freezes (SIGSTOP)."""
    dead_containers: int = 0
    """How many of the next pods never start their container (RUNNING, no runtime, no uptime, billed)."""


@dataclass
class FakePod:
    """One pod of the fake cloud."""

    id: str
    number: int
    name: str
    image: str
    gpu: GpuOffer
    gpu_count: int
    cloud_type: str
    env: dict[str, str]
    cost_per_hr: float
    created_at: float
    host_cuda: str = "12.8"
    container_dead: bool = False
    status: str = "CREATED"
    running_since: float | None = None
    jobs_seen: int = 0
    log_path: Path | None = None
    billing_stopped_at: float | None = None
    terminated: bool = False
    preempted: bool = False
    hung: bool = False
    process: subprocess.Popen[bytes] | None = None

    def billed_seconds(self, now: float) -> int:
        end = self.billing_stopped_at if self.billing_stopped_at is not None else now
        return max(0, math.floor(end - self.created_at))


class FakeRunpod:
    """The fake API server and its pods. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        api_key: str,
        pod_command: list[str],
        work_dir: Path,
        *,
        pod_cwd: Path | None = None,
        image_env: dict[str, str] | None = None,
        gpus: tuple[GpuOffer, ...] = DEFAULT_GPUS,
        image_cuda: str | None = None,
        boot_s: float = 0.3,
        max_requests: int = 5000,
        faults: Faults | None = None,
    ):
        self.api_key = api_key
        self.pod_command = pod_command
        self.work_dir = work_dir
        self.pod_cwd = pod_cwd
        self.image_env = dict(image_env or {})
        self.gpus = {gpu.id: gpu for gpu in gpus}
        self.image_cuda = image_cuda
        self.boot_s = boot_s
        self.max_requests = max_requests
        self.faults = faults or Faults()
        self.lock = threading.RLock()
        self.pods: dict[str, FakePod] = {}
        self.requests = 0
        self.overflowed = False
        self.ops: Counter[str] = Counter()
        self.deploys_by_name: Counter[str] = Counter()
        self.capacity_refusals: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.auth_failures = 0
        self.job_starts: list[tuple[str, float]] = []
        """(pod id, time) of every job start the pod processes announced, in order."""
        self.seen_authorization: set[str] = set()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    # lifecycle of the fake itself

    def __enter__(self) -> FakeRunpod:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeRunpod:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        fake = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                fake._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="fake-runpod-http")
        ticker = threading.Thread(target=self._tick_forever, daemon=True, name="fake-runpod-ticker")
        self._threads = [serve, ticker]
        for thread in self._threads:
            thread.start()
        return self

    @property
    def url(self) -> str:
        return loopback_url(self._server)

    def stop(self) -> None:
        """Stop serving and kill every pod process (the cloud goes away with the test)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        with self.lock:
            for pod in self.pods.values():
                self._kill(pod)

    # what tests read

    def billing(self) -> list[dict[str, Any]]:
        """Per pod: billed seconds, price, dollars (terminated pods included)."""
        now = time.monotonic()
        with self.lock:
            return [
                {
                    "pod_id": pod.id,
                    "name": pod.name,
                    "gpu": pod.gpu.id,
                    "seconds": pod.billed_seconds(now),
                    "cost_per_hr": pod.cost_per_hr,
                    "usd": pod.billed_seconds(now) * pod.cost_per_hr / 3600.0,
                    "status": "TERMINATED" if pod.terminated else pod.status,
                    "preempted": pod.preempted,
                    "hung": pod.hung,
                }
                for pod in self.pods.values()
            ]

    def live_pods(self) -> list[FakePod]:
        """Pods not terminated (EXITED ones included: they still exist and cost disk)."""
        with self.lock:
            return [pod for pod in self.pods.values() if not pod.terminated]

    def pod_processes_alive(self) -> list[int]:
        with self.lock:
            return [pod.process.pid for pod in self.pods.values() if pod.process is not None and pod.process.poll() is None]

    def pod_environments(self) -> list[dict[str, str]]:
        with self.lock:
            return [dict(pod.env) for pod in self.pods.values()]

    def preempt(self, pod_id: str) -> None:
        """Take the pod away now, as the cloud does to a preempted pod: EXITED, billing stops, process killed."""
        with self.lock:
            pod = self.pods[pod_id]
            if not pod.terminated:
                self._stop_billing(pod, preempted=True)

    def hang(self, pod_id: str) -> None:
        """Freeze the pod's process now (SIGSTOP): the pod stays RUNNING and billed, its progress stops."""
        with self.lock:
            pod = self.pods[pod_id]
            if pod.process is not None and pod.process.poll() is None:
                pod.hung = True
                try:
                    os.killpg(pod.process.pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pod.hung = False

    def thaw(self, pod_id: str) -> None:
        """Let a pod frozen by ``hang`` run on (SIGCONT)."""
        with self.lock:
            pod = self.pods[pod_id]
            if pod.hung and pod.process is not None and pod.process.poll() is None:
                pod.hung = False
                try:
                    os.killpg(pod.process.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    # HTTP

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self.lock:
            self.requests += 1
            number = self.requests
            authorization = handler.headers.get("Authorization") or ""
            self.seen_authorization.add(authorization)
            if number > self.max_requests:
                self.overflowed = True
                self._reply(handler, 429, {"errors": [{"message": "Too many requests (fake request cap)"}]})
                return
        if authorization != f"Bearer {self.api_key}":
            with self.lock:
                self.auth_failures += 1
            self._reply(handler, 401, {"errors": [{"message": "Unauthorized"}]})
            return
        try:
            query = json.loads(body or b"{}").get("query", "")
        except json.JSONDecodeError:
            self._reply(handler, 400, {"errors": [{"message": "body is not JSON"}]})
            return
        op = operation_of(query)
        with self.lock:
            self.ops[op] += 1
            every = self.faults.every_nth_5xx
            if every and number % every == 0:
                kind = ("html502", "json500", "graphql503")[(number // every) % 3]
                self.injected[kind] += 1
                self._reply_5xx(handler, kind)
                return
            try:
                answer = self._apply(op, query)
            except FakeError as err:
                answer = {"errors": [{"message": str(err)}]}
            applied = "errors" not in answer
            lost = self.faults.lost_replies.get(op, 0) if applied else 0
            if lost:
                self.faults.lost_replies[op] = lost - 1
                self.injected[f"lost:{op}"] += 1
            slow_times, slow_s = self.faults.slow_replies.get(op, (0, 0.0)) if applied else (0, 0.0)
            if slow_times and not lost:
                self.faults.slow_replies[op] = (slow_times - 1, slow_s)
                self.injected[f"slow:{op}"] += 1
        if lost:
            handler.close_connection = True
            return
        if slow_times:
            self._stopping.wait(slow_s)
        self._reply(handler, 200, answer)

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _reply_5xx(self, handler: BaseHTTPRequestHandler, kind: str) -> None:
        if kind == "html502":
            data, status, ctype = b"<html><body><h1>502 Bad Gateway</h1></body></html>", 502, "text/html"
        elif kind == "json500":
            data, status, ctype = json.dumps({"message": "internal"}).encode(), 500, "application/json"
        else:
            data, status, ctype = json.dumps({"errors": [{"message": "Service Unavailable"}]}).encode(), 503, "application/json"
        handler.send_response(status)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    # GraphQL operations (called with the lock held)

    def _apply(self, op: str, query: str) -> dict[str, Any]:
        if op == "deploy":
            return {"data": {"podFindAndDeployOnDemand": self._deploy(parse_input(query))}}
        if op == "pod":
            pod = self._find(string_arg(query, "podId"))
            return {"data": {"pod": self._pod_json(pod) if pod else None}}
        if op == "pods":
            return {"data": {"myself": {"pods": [self._pod_json(pod) for pod in self.pods.values() if not pod.terminated]}}}
        if op == "stop":
            pod = self._require(string_arg(query, "podId"))
            self._stop_billing(pod, preempted=False)
            return {"data": {"podStop": {"id": pod.id, "desiredStatus": pod.status}}}
        if op == "terminate":
            pod = self._require(string_arg(query, "podId"))
            self._stop_billing(pod, preempted=False)
            pod.terminated = True
            return {"data": {"podTerminate": None}}
        if op == "gpu":
            gpu = self.gpus.get(string_arg(query, "id") or "")
            return {"data": {"gpuTypes": [self._gpu_json(gpu)] if gpu else []}}
        if op == "gpus":
            return {"data": {"gpuTypes": [{"id": g.id, "displayName": g.display_name, "memoryInGb": g.memory_gb} for g in self.gpus.values()]}}
        raise FakeError(f"the fake Runpod API does not implement this operation ({op})")

    def _deploy(self, fields: dict[str, Any]) -> dict[str, Any]:
        gpu = self.gpus.get(str(fields.get("gpuTypeId")))
        if gpu is None:
            raise FakeError("Invalid GPU type")
        left = self.faults.capacity_errors.get(gpu.id, 0)
        if left:
            if left > 0:
                self.faults.capacity_errors[gpu.id] = left - 1
            self.capacity_refusals[gpu.id] += 1
            raise FakeError(CAPACITY_MESSAGE)
        count = int(fields.get("gpuCount") or 1)
        if count > gpu.max_gpu_count:
            raise FakeError(CAPACITY_MESSAGE)
        allowed = fields.get("allowedCudaVersions")
        unknown = [version for version in allowed or () if version not in RUNPOD_CUDA_VERSIONS]
        if unknown:
            raise FakeError(f"Invalid CUDA versions in allowedCudaVersions: {unknown}")
        hosts = [version for version in gpu.host_cuda if allowed is None or version in allowed]
        if not hosts:
            self.capacity_refusals[gpu.id] += 1
            raise FakeError(CAPACITY_MESSAGE)
        dead = self.faults.dead_containers > 0 or (self.image_cuda is not None and cuda_key(hosts[0]) < cuda_key(self.image_cuda))
        if self.faults.dead_containers > 0:
            self.faults.dead_containers -= 1
        cloud = str(fields.get("cloudType") or "ALL")
        price = gpu.secure_price if cloud == "SECURE" else gpu.community_price
        pod = FakePod(
            id=uuid.uuid4().hex[:14],
            number=len(self.pods) + 1,
            name=str(fields.get("name") or ""),
            image=str(fields.get("imageName") or ""),
            gpu=gpu,
            gpu_count=count,
            cloud_type=cloud,
            env=dict(fields.get("env") or {}),
            cost_per_hr=round(price * count, 4),
            created_at=time.monotonic(),
            host_cuda=hosts[0],
            container_dead=dead,
        )
        self.pods[pod.id] = pod
        self.deploys_by_name[pod.name] += 1
        return {
            "id": pod.id,
            "imageName": pod.image,
            "env": [f"{k}={v}" for k, v in pod.env.items()],
            "machineId": f"m-{pod.number}",
            "machine": {"podHostId": f"{pod.id}-host"},
        }

    def _find(self, pod_id: str | None) -> FakePod | None:
        pod = self.pods.get(pod_id or "")
        return None if pod is None or pod.terminated else pod

    def _require(self, pod_id: str | None) -> FakePod:
        pod = self._find(pod_id)
        if pod is None:
            raise FakeError(f"Pod not found: {pod_id}")
        return pod

    def _pod_json(self, pod: FakePod) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "id": pod.id,
            "containerDiskInGb": 80,
            "costPerHr": pod.cost_per_hr,
            "desiredStatus": pod.status,
            "dockerArgs": "",
            "dockerId": None,
            "env": [f"{k}={v}" for k, v in pod.env.items()],
            "gpuCount": pod.gpu_count,
            "imageName": pod.image,
            "lastStatusChange": f"{pod.status.title()} by fake",
            "machineId": f"m-{pod.number}",
            "memoryInGb": 100,
            "name": pod.name,
            "podType": "RESERVED",
            "port": None,
            "ports": "",
            "uptimeSeconds": 0 if pod.container_dead else pod.billed_seconds(now),
            "vcpuCount": 16,
            "volumeInGb": 0,
            "volumeMountPath": "/workspace",
            "runtime": {"ports": []} if pod.status == "RUNNING" and not pod.container_dead else None,
            "machine": {"gpuDisplayName": pod.gpu.display_name},
        }

    def _gpu_json(self, gpu: GpuOffer) -> dict[str, Any]:
        return {
            "maxGpuCount": gpu.max_gpu_count,
            "id": gpu.id,
            "displayName": gpu.display_name,
            "manufacturer": "Nvidia",
            "memoryInGb": gpu.memory_gb,
            "cudaCores": 0,
            "secureCloud": True,
            "communityCloud": True,
            "securePrice": gpu.secure_price,
            "communityPrice": gpu.community_price,
            "oneMonthPrice": None,
            "threeMonthPrice": None,
            "oneWeekPrice": None,
            "communitySpotPrice": None,
            "secureSpotPrice": None,
            "lowestPrice": {"minimumBidPrice": None, "uninterruptablePrice": gpu.community_price},
        }

    # pods

    def _stop_billing(self, pod: FakePod, preempted: bool) -> None:
        if pod.billing_stopped_at is None:
            pod.billing_stopped_at = time.monotonic()
        pod.status = "EXITED"
        pod.preempted = pod.preempted or preempted
        self._kill(pod)

    def _kill(self, pod: FakePod) -> None:
        process = pod.process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)

    def _boot(self, pod: FakePod) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(self.work_dir)}
        if self.pod_cwd is not None:
            env["PYTHONPATH"] = str(self.pod_cwd)
        env.update(self.image_env)
        env.update(pod.env)
        env.update({"RUNPOD_POD_ID": pod.id, "RUNPOD_GPU_COUNT": str(pod.gpu_count)})
        log_path = self.work_dir / f"pod-{pod.number}-{pod.id}.log"
        pod.log_path = log_path
        with open(log_path, "ab") as log_file:
            pod.process = subprocess.Popen(
                self.pod_command, cwd=self.pod_cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        pod.status = "RUNNING"
        pod.running_since = time.monotonic()

    def _tick_forever(self) -> None:
        while not self._stopping.wait(0.05):
            now = time.monotonic()
            with self.lock:
                for pod in list(self.pods.values()):
                    if pod.terminated:
                        continue
                    if pod.status == "CREATED" and now - pod.created_at >= self.boot_s:
                        if pod.container_dead:
                            pod.status = "RUNNING"
                        else:
                            self._boot(pod)
                    if pod.status == "RUNNING" and (self.faults.preempt_job or self.faults.hang_job):
                        for _ in range(jobs_announced(pod) - pod.jobs_seen):
                            pod.jobs_seen += 1
                            self.job_starts.append((pod.id, now))
                for number, (pod_id, started) in enumerate(self.job_starts, start=1):
                    pod = self.pods[pod_id]
                    preempt = self.faults.preempt_job.get(number)
                    if preempt is not None and now - started >= preempt:
                        del self.faults.preempt_job[number]
                        if pod.status == "RUNNING" and not pod.terminated:
                            self._stop_billing(pod, preempted=True)
                    hang = self.faults.hang_job.get(number)
                    if hang is not None and now - started >= hang:
                        del self.faults.hang_job[number]
                        if pod.status == "RUNNING" and not pod.terminated:
                            self.hang(pod.id)


def jobs_announced(pod: FakePod) -> int:
    """How many jobs the pod's process has started (the fake runner prints `job <name> ...` for each)."""
    if pod.log_path is None or not pod.log_path.exists():
        return 0
    return sum(1 for line in pod.log_path.read_text(errors="replace").splitlines() if line.startswith("job "))


class FakeError(Exception):
    """An error the fake answers as a GraphQL error."""


def operation_of(query: str) -> str:
    """Which SDK operation a GraphQL text is (the SDK builds a fixed set of shapes)."""
    if "podFindAndDeployOnDemand" in query:
        return "deploy"
    if "podTerminate" in query:
        return "terminate"
    if "podStop" in query:
        return "stop"
    if "podResume" in query:
        return "resume"
    if re.search(r"gpuTypes\s*\(\s*input", query):
        return "gpu"
    if "gpuTypes" in query:
        return "gpus"
    if re.search(r"myself\s*\{\s*pods", query):
        return "pods"
    if re.search(r"\bpod\s*\(\s*input", query):
        return "pod"
    return "unknown"


def cuda_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def string_arg(query: str, name: str) -> str | None:
    match = re.search(rf'\b{name}\s*:\s*"([^"]*)"', query)
    return match.group(1) if match else None


def parse_input(query: str) -> dict[str, Any]:
    """The `input: { ... }` fields of a deploy mutation (strings, numbers, booleans, enums, the env list and
    the list of strings `allowedCudaVersions`)."""
    fields: dict[str, Any] = {}
    cuda_match = re.search(r"allowedCudaVersions:\s*\[(.*?)\]", query, re.S)
    if cuda_match:
        fields["allowedCudaVersions"] = re.findall(r'"([^"]*)"', cuda_match.group(1))
        query = query[: cuda_match.start()] + query[cuda_match.end() :]
    env_match = re.search(r"env:\s*\[(.*?)\]", query, re.S)
    if env_match:
        fields["env"] = dict(re.findall(r'\{\s*key:\s*"([^"]*)",\s*value:\s*"([^"]*)"\s*\}', env_match.group(1)))
        query = query[: env_match.start()] + query[env_match.end() :]
    for key, string in re.findall(r'(\w+):\s*"([^"]*)"', query):
        fields.setdefault(key, string)
    for key, number in re.findall(r"(\w+):\s*(-?\d+)\b", query):
        fields.setdefault(key, int(number))
    for key, word in re.findall(r"(\w+):\s*([A-Z]+)\b", query):
        fields.setdefault(key, word)
    return fields
