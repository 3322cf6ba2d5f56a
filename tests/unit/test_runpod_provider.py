"""The Runpod provider: status mapping, error classification, GPU fallback order, env encoding (pure),
and the real SDK against the fake GraphQL server: fallbacks, lost replies, 5xx, auth, the key."""

from __future__ import annotations

import concurrent.futures
import logging
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st

from metarl.backends.runpod.pod.pin import PRIME_RL_IMAGE_CUDA
from metarl.backends.runpod.pod.protocol import decode_env_value
from metarl.backends.runpod.provider import (
    IMAGE_CUDA_VERSIONS,
    RUNPOD_CUDA_VERSIONS,
    ErrorKind,
    LaunchRequest,
    PodState,
    RetryPolicy,
    RunpodProvider,
    classify_exception,
    classify_message,
    cuda_versions_from,
    encode_env,
    encode_env_value,
    launch_order,
    map_status,
    pod_info_from,
)
from metarl.domain.retry import backoff_delay
from metarl.errors import CapacityError, PermanentBackendError, TransientBackendError
from tests.conftest import REPO
from tests.fakes import runpod_server
from tests.fakes.runpod_server import CAPACITY_MESSAGE, FakeRunpod, GpuOffer

A40, A6000, L40S = "NVIDIA A40", "NVIDIA RTX A6000", "NVIDIA L40S"


# --- pure ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "runtime", "state"),
    [
        ("CREATED", False, PodState.provisioning),
        ("RUNNING", False, PodState.provisioning),
        ("RUNNING", True, PodState.running),
        ("RESTARTING", True, PodState.provisioning),
        ("EXITED", False, PodState.stopped),
        ("PAUSED", False, PodState.stopped),
        ("TERMINATED", False, PodState.terminated),
        ("DEAD", False, PodState.terminated),
        (None, False, PodState.unknown),
        ("SOMETHING_NEW", True, PodState.unknown),
    ],
)
def test_vendor_statuses_map_to_our_states(status, runtime, state):
    assert map_status(status, runtime) == state


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (CAPACITY_MESSAGE, ErrorKind.capacity),
        ("There are no longer any instances available with the request specifications. Please try again later.", ErrorKind.capacity),
        ("This machine does not have the resources to deploy your pod.", ErrorKind.capacity),
        ("There are not enough free GPUs on the host machine to start this pod.", ErrorKind.capacity),
        ("Pod not found: abc", ErrorKind.not_found),
        ("Service Unavailable", ErrorKind.transient),
        ("Too many requests", ErrorKind.transient),
        ("Internal server error", ErrorKind.transient),
        ("Invalid GPU type", ErrorKind.permanent),
        ("Your account balance is too low", ErrorKind.permanent),
    ],
)
def test_graphql_messages_are_classified_at_the_edge(message, kind):
    assert classify_message(message) == kind


def test_sdk_exceptions_are_classified():
    from runpod import error as sdk_error

    assert classify_exception(sdk_error.QueryError(CAPACITY_MESSAGE, "query")) == ErrorKind.capacity
    assert classify_exception(sdk_error.AuthenticationError("Unauthorized")) == ErrorKind.permanent
    assert classify_exception(requests.ConnectionError("reset")) == ErrorKind.transient
    assert classify_exception(requests.ReadTimeout("slow")) == ErrorKind.transient
    assert classify_exception(requests.exceptions.JSONDecodeError("Expecting value", "<html>", 0)) == ErrorKind.transient
    assert classify_exception(KeyError("data")) == ErrorKind.transient
    assert classify_exception(concurrent.futures.TimeoutError()) == ErrorKind.transient
    assert classify_exception(ValueError("No GPU found with the specified ID, run runpod.get_gpus()")) == ErrorKind.not_found
    assert classify_exception(ValueError("cloud_type must be one of ALL, COMMUNITY or SECURE")) == ErrorKind.permanent


def test_fallback_order_prefers_types_without_a_recent_capacity_error():
    types = (A40, A6000, L40S)
    assert launch_order(types, {}, now=100.0, cooldown_s=60) == [A40, A6000, L40S]
    assert launch_order(types, {A40: 90.0}, now=100.0, cooldown_s=60) == [A6000, L40S, A40]
    assert launch_order(types, {A40: 30.0}, now=100.0, cooldown_s=60) == [A40, A6000, L40S]
    assert launch_order(types, {A40: 95.0, A6000: 90.0, L40S: 99.0}, now=100.0, cooldown_s=60) == [A6000, A40, L40S]
    assert launch_order((A40, A40, A6000), {}, now=0.0, cooldown_s=0) == [A40, A6000]


def test_backoff_doubles_and_is_capped():
    policy = RetryPolicy(backoff_s=0.5, max_backoff_s=3.0)
    assert [backoff_delay(policy.backoff, attempt) for attempt in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@given(st.text(max_size=200))
@example("\n")
@example("plain-value\n")  # `$` in a pattern also matches before a final newline
def test_env_values_survive_the_sdks_unescaped_graphql(value):
    encoded = encode_env_value(value)
    assert '"' not in encoded and "\\" not in encoded and "\n" not in encoded and "{" not in encoded
    assert decode_env_value(encoded) == value


def test_env_keys_are_checked_and_the_runpod_key_is_never_passed():
    assert encode_env({"METARL_POD_NAME": "metarl-abc-1"}) == {"METARL_POD_NAME": "metarl-abc-1"}
    with pytest.raises(PermanentBackendError):
        encode_env({"RUNPOD_API_KEY": "x"})
    with pytest.raises(PermanentBackendError):
        encode_env({'A" }, injected: { key: "B': "x"})


def test_pod_ids_are_checked_before_they_reach_the_sdk():
    with pytest.raises(PermanentBackendError):
        RunpodProvider().query('abc"}) { id } mutation { podTerminate(input: {podId: "x')


def test_pod_answers_become_pod_info():
    raw = {
        "id": "p1",
        "name": "metarl-x",
        "desiredStatus": "RUNNING",
        "runtime": {"ports": []},
        "costPerHr": 0.88,
        "uptimeSeconds": 12,
        "gpuCount": 2,
        "machine": {"gpuDisplayName": "A40"},
    }
    info = pod_info_from(raw)
    assert (info.state, info.cost_per_hr, info.uptime_s, info.gpu_count, info.gpu_type) == (PodState.running, 0.88, 12, 2, "A40")
    assert pod_info_from({**raw, "runtime": None, "uptimeSeconds": None}).state == PodState.provisioning


def test_the_image_needs_its_cuda_or_a_newer_one_from_runpods_list():
    # prime-rl v0.8.0 Dockerfile.cuda: FROM nvidia/cuda:12.8.1-base-ubuntu24.04
    assert PRIME_RL_IMAGE_CUDA == "12.8" and IMAGE_CUDA_VERSIONS == ("12.8", "12.9", "13.0")
    assert RUNPOD_CUDA_VERSIONS == runpod_server.RUNPOD_CUDA_VERSIONS
    assert cuda_versions_from("12.10", ("12.9", "12.10", "13.0")) == ("12.10", "13.0"), "compared as numbers, not text"
    assert LaunchRequest(name="metarl-a", image="img:1", gpu_types=(A40,)).cuda_versions == IMAGE_CUDA_VERSIONS
    with pytest.raises(ValueError, match="CUDA versions Runpod offers"):
        LaunchRequest(name="metarl-a", image="img:1", gpu_types=(A40,), cuda_versions=('12.8"]',))


# --- the real SDK against the fake server --------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch) -> Iterator[FakeRunpod]:
    key = f"rpa_TEST_{uuid.uuid4().hex}"
    server = FakeRunpod(key, [sys.executable, "-c", "import time; time.sleep(20)"], tmp_path / "cloud", pod_cwd=REPO, boot_s=0.05, max_requests=300)
    server.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
    monkeypatch.setenv("RUNPOD_API_KEY", key)
    yield server
    server.stop()
    assert not server.overflowed


def provider() -> RunpodProvider:
    return RunpodProvider(RetryPolicy(attempts=6, backoff_s=0.01, call_timeout_s=0.5), capacity_cooldown_s=0.0)


def request(name: str, types: tuple[str, ...] = (A40, A6000, L40S)) -> LaunchRequest:
    return LaunchRequest(name=name, image="ghcr.io/metarl/inner:0.8.0", gpu_types=types, env={"METARL_POD_NAME": name})


def test_capacity_errors_fall_back_to_the_next_gpu_type_and_launch_is_idempotent_by_name(fake):
    fake.faults.capacity_errors = {A40: -1}
    pods = provider()
    first = pods.launch(request("metarl-aaaaaaaa-1"))
    again = pods.launch(request("metarl-aaaaaaaa-1"))
    assert first.pod_id == again.pod_id and first.gpu_type == A6000 and first.gpu_count == 2
    assert fake.deploys_by_name == {"metarl-aaaaaaaa-1": 1}
    assert fake.capacity_refusals[A40] == 1
    assert [pod.name for pod in pods.list_owned("metarl-aaaaaaaa-")] == ["metarl-aaaaaaaa-1"]
    assert pods.list_owned("metarl-bbbbbbbb-") == []
    pods.terminate(first.pod_id)
    pods.terminate(first.pod_id)
    assert pods.query(first.pod_id) is None


def test_no_capacity_anywhere_is_a_capacity_error(fake):
    fake.faults.capacity_errors = {A40: -1, A6000: -1}
    with pytest.raises(CapacityError):
        provider().launch(request("metarl-aaaaaaaa-2", (A40, A6000)))
    assert fake.deploys_by_name == {}


def test_a_lost_create_reply_and_5xx_answers_never_make_a_second_pod(fake):
    fake.faults.lost_replies = {"deploy": 1}
    fake.faults.every_nth_5xx = 5
    pods = provider()
    pod = pods.launch(request("metarl-aaaaaaaa-3"))
    assert fake.deploys_by_name == {"metarl-aaaaaaaa-3": 1}
    assert fake.injected["lost:deploy"] == 1 and sum(fake.injected[k] for k in ("html502", "json500", "graphql503")) >= 1
    assert pods.query(pod.pod_id) is not None


def test_slow_answers_hit_our_deadline_and_are_retried(fake):
    pods = provider()
    pod = pods.launch(request("metarl-aaaaaaaa-4"))
    fake.faults.slow_replies = {"pod": (1, 1.5)}
    assert pods.query(pod.pod_id).pod_id == pod.pod_id
    assert fake.injected["slow:pod"] == 1


def test_an_api_that_stays_down_is_a_transient_error(fake):
    fake.faults.every_nth_5xx = 1
    with pytest.raises(TransientBackendError):
        provider().list_owned("metarl-")


def test_a_wrong_or_missing_key_is_permanent_and_never_logged(fake, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_WRONG_KEY_VALUE")
    with pytest.raises(PermanentBackendError):
        provider().list_owned("metarl-")
    monkeypatch.delenv("RUNPOD_API_KEY")
    with pytest.raises(PermanentBackendError, match="RUNPOD_API_KEY is not set"):
        provider().list_owned("metarl-")
    assert fake.auth_failures == 1
    assert "rpa_WRONG_KEY_VALUE" not in caplog.text and fake.api_key not in caplog.text


def test_stop_freezes_the_billed_uptime(fake):
    pods = provider()
    pod = pods.launch(request("metarl-aaaaaaaa-5"))
    pods.stop(pod.pod_id)
    stopped = pods.query(pod.pod_id)
    assert stopped.state == PodState.stopped
    billed = {row["pod_id"]: row["seconds"] for row in fake.billing()}
    assert stopped.uptime_s == billed[pod.pod_id]


def test_pods_are_placed_only_on_hosts_with_the_images_cuda_or_newer(fake):
    fake.image_cuda = PRIME_RL_IMAGE_CUDA
    fake.gpus = {
        A40: GpuOffer(A40, "A40", 48, 0.44, 0.39, host_cuda=("12.4", "12.9")),
        A6000: GpuOffer(A6000, "RTX A6000", 48, 0.49, 0.44, host_cuda=("12.2", "12.6")),
    }
    pods = provider()
    pod = pods.launch(request("metarl-aaaaaaaa-6", (A40,)))
    placed = fake.pods[pod.pod_id]
    assert placed.host_cuda == "12.9" and not placed.container_dead, "the pod went to a host whose driver cannot start the image"
    with pytest.raises(CapacityError):
        pods.launch(request("metarl-aaaaaaaa-7", (A6000,)))
    assert fake.deploys_by_name == {"metarl-aaaaaaaa-6": 1} and fake.capacity_refusals[A6000] == 1


def test_a_container_that_never_starts_shows_no_runtime_and_no_uptime_but_is_billed(fake):
    fake.faults.dead_containers = 1
    pods = provider()
    pod = pods.launch(request("metarl-aaaaaaaa-8"))
    time.sleep(1.2)
    seen = pods.query(pod.pod_id)
    assert seen is not None and seen.state == PodState.provisioning and seen.uptime_s == 0
    assert {row["pod_id"]: row["seconds"] for row in fake.billing()}[pod.pod_id] >= 1
