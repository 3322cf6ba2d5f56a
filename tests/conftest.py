"""Shared fixtures: real PostgreSQL and Redis on 127.0.0.1, fresh database per test, worker pools as subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parent.parent
TEST_EVAL_SECRET = "metarl-tests-hidden-eval-secret-0001"
os.environ.setdefault("METARL_EVAL_SECRET", TEST_EVAL_SECRET)  # the deployment secret of the hidden-eval partition (metarl/learning/eval_secret.py)
PG_ADMIN_URL = os.environ.get("METARL_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_service(host: str, port: int, name: str) -> None:
    if _reachable(host, port):
        return
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not reachable on {host}:{port}; .ci/run should have started it")
    pytest.skip(f"{name} is not reachable on {host}:{port}")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test; dropped afterwards."""
    require_service("127.0.0.1", 5432, "PostgreSQL")
    name = f"metarl_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    from metarl.store import db

    db.upgrade(url)
    yield url
    db.dispose_engines()
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis database number reserved for this test (lock key in db 0), flushed before and after."""
    require_service(REDIS_HOST, REDIS_PORT, "Redis")
    import redis

    registry = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=0)
    owner = f"{os.getpid()}:{uuid.uuid4().hex}"
    number = next((n for n in range(1, 16) if registry.set(f"metarl-test-db-lock:{n}", owner, nx=True, ex=3600)), None)
    if number is None:
        pytest.fail("all Redis test databases 1-15 are reserved by other test sessions")
    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()
    if registry.get(f"metarl-test-db-lock:{number}") == owner.encode():
        registry.delete(f"metarl-test-db-lock:{number}")
    registry.close()


@pytest.fixture
def service_env(pg_url: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a command on the test's services, with a METARL_HOME of its own (never the checkout's .metarl)."""
    env = dict(os.environ)
    env["METARL_DATABASE_URL"] = pg_url
    env["METARL_BROKER_URL"] = redis_url
    env["METARL_HOME"] = str(tmp_path / "metarl-home")
    return env


@pytest.fixture(scope="session", autouse=True)
def checkout_home_untouched() -> Iterator[None]:
    """No test leaves a services note in the checkout's .metarl: it would turn the README's embedded quick start into a refusal."""
    note = REPO / ".metarl" / "services.json"
    existed = note.exists()
    yield
    if note.exists() and not existed:
        note.unlink()
        pytest.fail(f"a test wrote {note} (a `metarl` command ran in services mode without its own METARL_HOME)")


@pytest.fixture
def pools(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[object]:
    """One worker process per pool against the test database and broker."""
    from metarl.pools import WorkerPools

    worker_pools = WorkerPools(pg_url, redis_url, tmp_path / "logs")
    worker_pools.start()
    yield worker_pools
    worker_pools.stop()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny torch models run far faster on one intra-op thread than contending for shared cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def metarl_cli(args: list[str], env: dict[str, str], timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `metarl` command line in a subprocess."""
    return subprocess.run([sys.executable, "-m", "metarl_cli.main", *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`METARL_SKIP_SLOW=1` skips tests marked slow (CI runs them by default)."""
    if os.environ.get("METARL_SKIP_SLOW") != "1":
        return
    skip = pytest.mark.skip(reason="METARL_SKIP_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


PLUGIN_SITE = REPO / "tests" / "fixtures" / "families" / "plugin_site"
"""A site folder holding the test plugin package `metarl_vowels` and its dist-info (entry points)."""


@pytest.fixture
def plugin_installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test plugin package on sys.path with its dist-info (its entry points), the registries reloaded."""
    from metarl.learning import registry

    monkeypatch.syspath_prepend(str(PLUGIN_SITE))
    registry.refresh_registry()
    yield
    registry.refresh_registry()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An S3-compatible server (moto) on 127.0.0.1 for the session; its endpoint URL (tests/s3_server.py)."""
    from tests.s3_server import s3_server

    with s3_server(tmp_path_factory.mktemp("s3")) as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the session's S3 server, with this process's AWS_* environment pointing at it; its name."""
    from tests.s3_server import make_bucket, s3_env

    for name, value in s3_env(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    bucket = f"metarl-{uuid.uuid4().hex[:12]}"
    make_bucket(s3_endpoint, bucket)
    return bucket
