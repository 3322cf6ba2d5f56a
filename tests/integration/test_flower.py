"""Flower against the real worker pools: the five queues and the five pool workers show up in its
REST API, behind basic auth. Everything talks to 127.0.0.1 only; every process started is killed."""

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
from pathlib import Path
from typing import Any

import pytest

from metarl.pools import stop_process_group

from metarl.settings import BROKER_ENV, DATABASE_ENV
from tests.conftest import REPO
from workers.app import QUEUES

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0
# No proxies: all traffic stays on 127.0.0.1 whatever HTTP(S)_PROXY says.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, auth: tuple[str, str] | None, timeout: float = 10.0) -> tuple[int, Any]:
    assert url.startswith("http://127.0.0.1:"), url
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with OPENER.open(request, timeout=timeout) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as err:
        return err.code, None


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we created, then SIGKILL whatever is left."""
    stop_process_group(process)


@pytest.fixture
def flower(pools: Any, redis_url: str, pg_url: str, tmp_path: Path) -> Iterator[tuple[str, tuple[str, str], Path]]:
    """Flower on a free loopback port with a random per-test login; yields (base url, auth, log)."""
    port = free_port()
    auth = ("ops", secrets.token_urlsafe(16))
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLOWER_")}
    env[BROKER_ENV] = redis_url
    env[DATABASE_ENV] = pg_url
    log_path = tmp_path / "flower.log"
    command = [
        sys.executable, "-m", "celery", "-A", "workers.app", "flower",
        "--address=127.0.0.1", f"--port={port}", f"--basic-auth={auth[0]}:{auth[1]}",
        "--persistent=False", "--inspect_timeout=3000",
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
