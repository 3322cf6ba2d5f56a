"""An S3-compatible server on 127.0.0.1 for the tests: moto's standalone server (`moto_server`, from the dev extra),
started in a subprocess on a free port and stopped afterwards. The artifact store reaches it the standard way:
`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (metarl/artifact_store.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment that points boto and s3fs at the server (moto accepts any credentials)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "metarl-test-key-id",
        "AWS_SECRET_ACCESS_KEY": "metarl-test-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@contextmanager
def s3_server(log_dir: Path) -> Iterator[str]:
    """Run moto's S3 server on a free loopback port for the block; its endpoint URL."""
    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if executable is None:
        raise RuntimeError("moto_server is not installed: pip install -e '.[dev]'")
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "moto_server.log", "ab") as log:
        process = subprocess.Popen([executable, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}: see {log_dir / 'moto_server.log'}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create a bucket on the server (boto3 is what s3fs is built on)."""
    import boto3

    env = s3_env(endpoint)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=bucket)
