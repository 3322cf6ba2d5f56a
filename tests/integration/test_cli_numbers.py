"""Numbers on the `metarl` command line that used to give tracebacks (or start silently): each is exit 2 with a message
naming the option and the range, no traceback, nothing started and nothing written (real Postgres compared before and after)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.conftest import metarl_cli
from tests.integration.test_cli_bad_input import snapshot

pytestmark = pytest.mark.integration

# argv -> text that must be on stderr
CASES: dict[str, tuple[list[str], str]] = {
    "episode-beyond-bigint": (
        ["status", "--episode", "99999999999999999999"],
        "argument --episode: 99999999999999999999 is out of range: give an episode id from 1 to 9223372036854775807",
    ),
    "episode-zero": (["status", "--episode", "0"], "argument --episode: 0 is out of range"),
    "episode-negative-with-run": (["status", "abc", "--episode=-5"], "argument --episode: -5 is out of range"),
    "episode-not-a-number": (["status", "--episode", "1e3"], "'1e3' is not a whole number"),
    "port-beyond-65535": (["metrics", "--port", "70000"], "argument --port: 70000 is out of range: give a TCP port from 1 to 65535"),
    "port-zero": (["metrics", "--port", "0"], "argument --port: 0 is out of range"),
    "interval-negative": (["metrics", "--interval=-1"], "argument --interval: -1 is out of range: give more than 0 and at most 3600 seconds"),
    "interval-zero": (["metrics", "--interval", "0"], "argument --interval: 0 is out of range"),
    "interval-nan": (["metrics", "--interval", "nan"], "argument --interval: nan is out of range"),
    "interval-inf": (["metrics", "--interval", "inf"], "argument --interval: inf is out of range"),
    "autoscale-max-below-min": (
        ["worker", "--pool", "agent", "--autoscale", "2,16"],
        "2,16 puts the max below the min (the order is MAX,MIN): did you mean 16,2?",
    ),
    "autoscale-not-numbers": (["worker", "--pool", "agent", "--autoscale", "a,b"], "is not MAX,MIN"),
    "autoscale-three-numbers": (["worker", "--pool", "agent", "--autoscale", "8,4,2"], "is not MAX,MIN"),
    "autoscale-negative": (["worker", "--pool", "agent", "--autoscale=-1"], "is not MAX,MIN"),
    "autoscale-zero": (["worker", "--pool", "agent", "--autoscale", "0"], "max is 0: give 1 to 64 worker processes"),
    "autoscale-too-large": (["worker", "--pool", "agent", "--autoscale", "1000,1"], "max is 1000: give 1 to 64"),
    "concurrency-zero": (["worker", "--pool", "agent", "--concurrency", "0"], "argument --concurrency: 0 is out of range"),
    "concurrency-too-large": (["worker", "--pool", "agent", "--concurrency", "100000"], "argument --concurrency: 100000 is out of range"),
    "concurrency-and-autoscale": (["worker", "--pool", "agent", "--concurrency", "2", "--autoscale", "4,2"], "not allowed with argument"),
    "bad-loglevel": (["worker", "--pool", "agent", "--loglevel", "loud"], "argument --loglevel: invalid choice"),
}


def check_refused(result, expected: str) -> None:  # type: ignore[no-untyped-def]
    context = f"exit {result.returncode}\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 2, context
    assert "Traceback" not in result.stderr, context
    assert expected in result.stderr, context


@pytest.mark.parametrize("case", list(CASES))
def test_bad_number_is_a_usage_error(case: str, tmp_path: Path, service_env: dict[str, str]) -> None:
    argv, expected = CASES[case]
    before = snapshot(service_env["METARL_DATABASE_URL"])
    result = metarl_cli(argv, dict(service_env, METARL_HOME=str(tmp_path / "home")), timeout=60)
    check_refused(result, expected)
    assert snapshot(service_env["METARL_DATABASE_URL"]) == before
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("where", ["port-in-use", "address-not-here"])
def test_metrics_on_an_address_it_cannot_listen_on(where: str, tmp_path: Path, service_env: dict[str, str]) -> None:
    """Told before the database is touched: exit 2, the address and the reason, no traceback."""
    before = snapshot(service_env["METARL_DATABASE_URL"])
    env = dict(service_env, METARL_HOME=str(tmp_path / "home"))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        host = "127.0.0.1" if where == "port-in-use" else "192.0.2.1"  # TEST-NET-1: never an address of this machine
        result = metarl_cli(["metrics", "--host", host, "--port", str(port)], env, timeout=60)
    check_refused(result, f"error: cannot listen on {host}:{port}: ")
    assert "Fix: give a --host of this machine and a free --port" in result.stderr
    assert snapshot(service_env["METARL_DATABASE_URL"]) == before
    assert not (tmp_path / "home").exists()
