"""Flower against the real worker pools: the five queues and the five pool workers show up in its
REST API, behind basic auth; a pool started with docker-compose.yml's own command line can be
autoscaled from Flower (except outer, kept at one process). Everything talks to 127.0.0.1 only;
every process started is killed."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from metarl.pools import stop_process_group
from metarl.settings import BROKER_ENV, DATABASE_ENV
from tests.conftest import REPO
from tests.unit.test_compose import COMPOSE, TEST_ENV, command_lines, render
from workers.app import QUEUES

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0
# No proxies: all traffic stays on 127.0.0.1 whatever HTTP(S)_PROXY says.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, auth: tuple[str, str] | None, timeout: float = 10.0, method: str = "GET") -> tuple[int, Any]:
    assert url.startswith("http://127.0.0.1:"), url
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with OPENER.open(request, timeout=timeout) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we created, then SIGKILL whatever is left."""
    stop_process_group(process)


@pytest.fixture
def flower(pools: Any, redis_url: str, pg_url: str, tmp_path: Path) -> Iterator[tuple[str, tuple[str, str], Path]]:
    """Flower on a free loopback port with a random per-test login, over the five pools; yields (base url, auth, log)."""
    with running_flower(redis_url, pg_url, tmp_path) as started:
        yield started


@contextmanager
def running_flower(redis_url: str, pg_url: str, tmp_path: Path) -> Iterator[tuple[str, tuple[str, str], Path]]:
    """Flower on a free loopback port with a random per-test login; yields (base url, auth, log)."""
    port = free_port()
    auth = ("ops", secrets.token_urlsafe(16))
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLOWER_")}
    env[BROKER_ENV] = redis_url
    env[DATABASE_ENV] = pg_url
    log_path = tmp_path / "flower.log"
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.app",
        "flower",
        "--address=127.0.0.1",
        f"--port={port}",
        f"--basic-auth={auth[0]}:{auth[1]}",
        "--persistent=False",
        "--inspect_timeout=3000",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", auth, log_path
    finally:
        stop_process(process)


def poll(check: Any, what: str, log_path: Path, deadline: float) -> Any:
    """Call check() until it returns a truthy value or the deadline passes (bounded retries)."""
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as err:
            result, last = None, err
        if result:
            return result
        time.sleep(1.0)
    log = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
    pytest.fail(f"Flower never showed {what} within {DEADLINE_S:.0f}s; last: {last!r}\nflower log:\n{log}")


def test_flower_lists_pools_and_queues(flower: tuple[str, tuple[str, str], Path]) -> None:
    base, auth, log_path = flower
    deadline = time.monotonic() + DEADLINE_S

    def workers() -> dict[str, Any] | None:
        status, body = get(f"{base}/api/workers?refresh=1", auth)
        if status != 200 or not isinstance(body, dict):
            return None
        found = {pool: [name for name in body if name.startswith(f"{pool}@")] for pool in QUEUES}
        return body if all(found.values()) else None

    listed = poll(workers, "one worker per pool", log_path, deadline)
    for pool in QUEUES:
        (name,) = [name for name in listed if name.startswith(f"{pool}@")]
        queues = [queue["name"] for queue in listed[name].get("active_queues", [])]
        assert queues == [pool], f"{name} consumes {queues}, expected only {pool!r}"

    def queue_lengths() -> dict[str, int] | None:
        status, body = get(f"{base}/api/queues/length", auth)
        if status != 200 or not body:
            return None
        lengths = {queue["name"]: queue["messages"] for queue in body.get("active_queues", [])}
        return lengths if set(QUEUES) <= set(lengths) else None

    lengths = poll(queue_lengths, "the five queues", log_path, deadline)
    assert all(isinstance(lengths[queue], int) and lengths[queue] >= 0 for queue in QUEUES), lengths


def test_flower_requires_basic_auth(flower: tuple[str, tuple[str, str], Path]) -> None:
    base, auth, log_path = flower
    deadline = time.monotonic() + DEADLINE_S
    poll(lambda: get(f"{base}/api/workers", auth)[0] == 200, "a successful authenticated request", log_path, deadline)
    assert get(f"{base}/api/workers", None)[0] == 401
    assert get(f"{base}/api/workers", (auth[0], auth[1] + "x"))[0] == 401
    assert get(f"{base}/api/queues/length", None)[0] == 401


def compose_worker_argv(pool: str) -> list[str]:
    """The pool's command line exactly as docker-compose.yml gives it (defaults interpolated), run with this interpreter."""
    import yaml

    (argv,) = command_lines(render(yaml.safe_load(COMPOSE.read_text()), TEST_ENV)["services"][pool])
    assert argv[:2] == ["metarl", "worker"], argv
    return [sys.executable, "-m", "metarl_cli.main", *argv[1:]]


@pytest.fixture
def compose_workers(redis_url: str, pg_url: str, tmp_path: Path) -> Iterator[dict[str, list[str]]]:
    """The probe and outer pools started with compose's command lines; yields each pool's argv."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLOWER_")}
    env[BROKER_ENV], env[DATABASE_ENV] = redis_url, pg_url
    started: list[subprocess.Popen[bytes]] = []
    commands = {pool: compose_worker_argv(pool) for pool in ("probe", "outer")}
    try:
        for pool, argv in commands.items():
            with open(tmp_path / f"worker-{pool}.log", "wb") as log:
                started.append(
                    subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
                )
        yield commands
    finally:
        for process in started:
            stop_process(process)


def test_flower_autoscales_a_pool_started_as_compose_starts_it(compose_workers: dict[str, list[str]], redis_url: str, pg_url: str, tmp_path: Path) -> None:
    with running_flower(redis_url, pg_url, tmp_path) as (base, auth, log_path):
        deadline = time.monotonic() + DEADLINE_S

        def workers() -> dict[str, Any] | None:
            status, body = get(f"{base}/api/workers?refresh=1", auth)
            if status != 200 or not isinstance(body, dict):
                return None
            named = {pool: [name for name in body if name.startswith(f"{pool}@") and body[name].get("stats")] for pool in ("probe", "outer")}
            return body if all(len(names) == 1 for names in named.values()) else None

        listed = poll(workers, "the probe and outer workers with their stats", log_path, deadline)
        (probe,) = [name for name in listed if name.startswith("probe@")]
        (outer,) = [name for name in listed if name.startswith("outer@")]
        status, body = get(f"{base}/api/worker/pool/autoscale/{probe}?min=1&max=3", auth, method="POST")
        assert status == 200 and body == {"message": f"Autoscaling '{probe}' worker (min=1, max=3)"}, (status, body, compose_workers["probe"])

        def rescaled() -> dict[str, Any] | None:
            scaler = (workers() or {}).get(probe, {}).get("stats", {}).get("autoscaler")
            return scaler if scaler and (scaler["min"], scaler["max"]) == (1, 3) else None

        poll(rescaled, "the probe pool's new autoscale range", log_path, deadline)

        status, body = get(f"{base}/api/worker/pool/autoscale/{outer}?min=1&max=3", auth, method="POST")
        assert status == 403 and "Autoscale not enabled" in str(body), (status, body)  # outer: one update at a time, by design
        assert get(f"{base}/api/worker/pool/autoscale/{probe}?min=1&max=3", None, method="POST")[0] == 401
    assert compose_workers["probe"][-2:] == ["--autoscale", "2,2"]  # PROBE_CONCURRENCY's default, at start as --concurrency 2 would be
