"""The Prometheus exporter against real Postgres and Redis: known records in, exact values out;
and `metarl metrics` served as a subprocess and scraped once over 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from metarl.messaging.dispatch import send_outer, send_stage
from metarl.metrics import LATENCY_BUCKETS, build_registry
from metarl.pools import stop_process_group
from metarl.store.db import session_scope
from metarl.store.records import ClaimStatus, CostEntry, Episode, EpisodeGroup, Run, RunStatus, Stage, StageClaim
from tests.conftest import REPO
from workers.app import QUEUES, make_app

pytestmark = pytest.mark.integration

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only, never a proxy


# --------------------------------------------------------------------------------------------
# fixtures: a small, fully known set of records


def add_run(session: Any, name: str, status: RunStatus, policy_version: int) -> str:
    run_id = str(uuid.uuid4())
    session.add(Run(id=run_id, name=name, status=status, config={}, task_specs={}, policy_version=policy_version))
    session.flush()
    return run_id


def add_episodes(session: Any, run_id: str, stages: list[Stage]) -> list[int]:
    group = EpisodeGroup(run_id=run_id, task_id="addition", policy_version=0, size=len(stages))
    session.add(group)
    session.flush()
    episodes = [
        Episode(run_id=run_id, group_id=group.id, index_in_group=i, task_id="addition", policy_version=0, stage=stage) for i, stage in enumerate(stages)
    ]
    session.add_all(episodes)
    session.flush()
    return [episode.id for episode in episodes]


def add_claim(session: Any, run_id: str, episode_id: int, stage: Stage, status: ClaimStatus, duration: float | None, attempt: int = 1) -> None:
    session.add(
        StageClaim(
            run_id=run_id,
            episode_id=episode_id,
            stage=stage,
            probe_attempt=attempt,
            token=str(uuid.uuid4()),
            status=status,
            worker="test@host",
            duration_s=duration,
        )
    )


def add_cost(session: Any, run_id: str, source: str, amount: str, simulated: bool) -> None:
    session.add(
        CostEntry(
            run_id=run_id,
            source=source,
            description="test",
            quantity=1.0,
            unit="job",
            unit_price_usd=Decimal(amount),
            amount_usd=Decimal(amount),
            simulated=simulated,
            idempotency_key=str(uuid.uuid4()),
        )
    )


AGENT_DURATIONS = [0.05, 0.3, 2.0]
TRAIN_DURATIONS = [100.0, 7200.0, 20000.0]
QUEUED = {"agent": 3, "train": 1, "outer": 2}


@pytest.fixture
def records(pg_url: str) -> dict[str, str]:
    with session_scope(pg_url) as session:
        alpha = add_run(session, "alpha", RunStatus.running, 3)
        beta = add_run(session, "beta", RunStatus.finished, 7)
        gamma = add_run(session, "gamma", RunStatus.stopping, 1)
        a = add_episodes(session, alpha, [Stage.agent, Stage.agent, Stage.train, Stage.done, Stage.done, Stage.done])
        b = add_episodes(session, beta, [Stage.failed, Stage.done])
        for episode_id, duration in zip(a, AGENT_DURATIONS):
            add_claim(session, alpha, episode_id, Stage.agent, ClaimStatus.done, duration)
        for episode_id, duration in zip(a[3:], TRAIN_DURATIONS):
            add_claim(session, alpha, episode_id, Stage.train, ClaimStatus.done, duration)
        add_claim(session, alpha, a[0], Stage.agent, ClaimStatus.running, None, attempt=2)  # not finished: not counted
        add_claim(session, alpha, a[1], Stage.agent, ClaimStatus.failed, 9.0, attempt=2)  # failed: not counted
        add_claim(session, beta, b[0], Stage.probe, ClaimStatus.done, 0.2)
        add_cost(session, alpha, "train", "0.5", True)
        add_cost(session, alpha, "train", "0.25", True)
        add_cost(session, beta, "train", "1.0", True)
        add_cost(session, alpha, "policy", "1.5", False)
        add_cost(session, beta, "runpod", "0.123456789", False)
    return {"alpha": alpha, "beta": beta, "gamma": gamma}


@pytest.fixture
def queued(redis_url: str) -> dict[str, int]:
    """Real Celery messages waiting in the queues (no workers are running)."""
    app = make_app(redis_url)
    try:
        for _ in range(QUEUED["agent"]):
            send_stage(app, Stage.agent, 1, 1)
        send_stage(app, Stage.train, 2, 1)
        for step in range(QUEUED["outer"]):
            send_outer(app, step)
    finally:
        app.close()
    return {queue: QUEUED.get(queue, 0) for queue in QUEUES}


def scrape(pg_url: str, redis_url: str | None) -> tuple[str, dict[str, Any]]:
    text = generate_latest(build_registry(pg_url, redis_url)).decode()
    return text, {family.name: family for family in text_string_to_metric_families(text)}


def samples(family: Any, suffix: str = "") -> dict[tuple[tuple[str, str], ...], float]:
    """Samples by label set; a `run_id` label (next to the run name) is ignored, names are unique here."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in family.samples:
        if sample.name == family.name + suffix:
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "run_id"))
            assert key not in found, f"duplicate series {key} in {family.name}"
            found[key] = sample.value
    return found


# --------------------------------------------------------------------------------------------


def test_exporter_values(pg_url: str, redis_url: str, records: dict[str, str], queued: dict[str, int]) -> None:
    _, families = scrape(pg_url, redis_url)

    depth = families["metarl_queue_depth"]
    assert depth.type == "gauge"
    assert samples(depth) == {(("queue", queue),): float(count) for queue, count in queued.items()}

    episodes = families["metarl_episodes"]
    assert samples(episodes) == {
        (("run", "alpha"), ("stage", "agent")): 2.0,
        (("run", "alpha"), ("stage", "train")): 1.0,
        (("run", "alpha"), ("stage", "done")): 3.0,
        (("run", "beta"), ("stage", "failed")): 1.0,
        (("run", "beta"), ("stage", "done")): 1.0,
    }

    version = families["metarl_policy_version"]
    assert samples(version) == {(("run", "alpha"),): 3.0, (("run", "beta"),): 7.0, (("run", "gamma"),): 1.0}, "every run, ended ones at their last version"

    cost = families["metarl_cost_usd"]
    assert cost.type == "counter"
    assert samples(cost, "_total") == pytest.approx(
        {
            (("simulated", "true"), ("source", "train")): 1.75,
            (("simulated", "false"), ("source", "policy")): 1.5,
            (("simulated", "false"), ("source", "runpod")): 0.123456789,
        }
    )


def test_stage_latency_histogram(pg_url: str, redis_url: str, records: dict[str, str]) -> None:
    _, families = scrape(pg_url, redis_url)
    histogram = families["metarl_stage_seconds"]
    assert histogram.type == "histogram"
    by_stage: dict[str, dict[str, Any]] = {}
    for sample in histogram.samples:
        entry = by_stage.setdefault(sample.labels["stage"], {"buckets": {}})
        if sample.name.endswith("_bucket"):
            entry["buckets"][float(sample.labels["le"])] = sample.value
        elif sample.name.endswith("_count"):
            entry["count"] = sample.value
        elif sample.name.endswith("_sum"):
            entry["sum"] = sample.value
    assert {"agent", "probe", "train"} <= set(by_stage)
    expected = {"agent": AGENT_DURATIONS, "train": TRAIN_DURATIONS, "probe": [0.2], "eval": []}
    for stage, durations in expected.items():
        if not durations and stage not in by_stage:
            continue  # a stage with no finished claim may be left out
        entry = by_stage[stage]
        assert entry["count"] == len(durations), stage
        assert entry["sum"] == pytest.approx(sum(durations)), stage
        assert set(entry["buckets"]) == {float(bound) for bound in LATENCY_BUCKETS} | {float("inf")}, stage
        for bound, value in entry["buckets"].items():
            assert value == sum(1 for d in durations if d <= bound), (stage, bound)
        counts = [entry["buckets"][bound] for bound in sorted(entry["buckets"])]
        assert counts == sorted(counts), f"{stage}: buckets must be cumulative"


def test_exporter_on_an_empty_database(pg_url: str, redis_url: str) -> None:
    text, families = scrape(pg_url, redis_url)
    assert samples(families["metarl_queue_depth"]) == {(("queue", queue),): 0.0 for queue in QUEUES}
    assert not samples(families["metarl_episodes"])
    assert not samples(families["metarl_policy_version"])
    assert not samples(families["metarl_cost_usd"], "_total")
    assert "# TYPE metarl_stage_seconds histogram" in text
    assert all(sample.value == 0 for sample in families["metarl_stage_seconds"].samples)


def test_exporter_without_a_broker(pg_url: str, records: dict[str, str]) -> None:
    """No broker URL: no queue-depth samples, everything else still exported."""
    _, families = scrape(pg_url, None)
    assert not samples(families["metarl_queue_depth"])
    assert samples(families["metarl_episodes"])


def test_a_finished_run_keeps_its_last_policy_version_series(pg_url: str) -> None:
    """The series of a run that ends (running -> finished, stopped or failed) stays, same labels, at its last version."""
    with session_scope(pg_url) as session:
        run_id = add_run(session, "ends", RunStatus.running, 4)
    _, families = scrape(pg_url, None)
    while_running = [(sample.labels, sample.value) for sample in families["metarl_policy_version"].samples]
    assert while_running == [({"run": "ends", "run_id": run_id}, 4.0)]
    for ended in (RunStatus.finished, RunStatus.stopped, RunStatus.failed):
        with session_scope(pg_url) as session:
            session.get(Run, run_id).status = ended
        _, families = scrape(pg_url, None)
        assert [(sample.labels, sample.value) for sample in families["metarl_policy_version"].samples] == while_running, ended


# BUG (metarl/metrics.py): runs are labelled by name only, and names are not unique (a crashed run
# stays `running`; the same config is started again). Two active runs named alike give two samples
# with identical labels, which Prometheus rejects as duplicates. Fix: add a `run_id` label.
def test_no_duplicate_series_for_same_named_runs(pg_url: str) -> None:
    with session_scope(pg_url) as session:
        add_run(session, "same", RunStatus.running, 1)
        add_run(session, "same", RunStatus.running, 5)
    _, families = scrape(pg_url, None)
    for family in families.values():
        keys = [(s.name, tuple(sorted(s.labels.items()))) for s in family.samples]
        assert len(keys) == len(set(keys)), f"duplicate series in {family.name}: {keys}"


# --------------------------------------------------------------------------------------------
# `metarl metrics` as a process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def metrics_server(service_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log_path = tmp_path / "metrics.log"
    env = dict(service_env, METARL_HOME=str(tmp_path / "home"))
    command = [sys.executable, "-m", "metarl_cli.main", "metrics", "--host", "127.0.0.1", "--port", str(port), "--interval", "0.2"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}/metrics", log_path
    finally:
        stop_process_group(process)


def test_metrics_command_serves_over_loopback(metrics_server: tuple[str, Path], records: dict[str, str], queued: dict[str, int]) -> None:
    url, log_path = metrics_server
    deadline = time.monotonic() + 30
    body, last = None, None
    while time.monotonic() < deadline:
        try:
            with OPENER.open(url, timeout=5) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                body = response.read().decode()
                break
        except (urllib.error.URLError, ConnectionError) as err:
            last = err
            time.sleep(0.3)
    assert body is not None, f"no scrape within 30 s: {last!r}\n{log_path.read_text(errors='replace')[-3000:]}"
    families = {family.name: family for family in text_string_to_metric_families(body)}
    for name in ("metarl_queue_depth", "metarl_episodes", "metarl_stage_seconds", "metarl_cost_usd", "metarl_policy_version"):
        assert name in families, name
    assert samples(families["metarl_queue_depth"])[(("queue", "agent"),)] == queued["agent"]
    assert samples(families["metarl_policy_version"])[(("run", "alpha"),)] == 3
    assert "serving Prometheus metrics on http://127.0.0.1:" in log_path.read_text()


# --------------------------------------------------------------------------------------------
# after a real (short) sim run through the CLI: the exporter agrees with the records (~20 s)


def test_exporter_agrees_with_a_short_sim_run(service_env: dict[str, str], pg_url: str, redis_url: str, tmp_path: Path) -> None:
    from sqlalchemy import func, select

    from tests.conftest import metarl_cli

    config = (REPO / "examples" / "sim.toml").read_text()
    config = config.replace('task_specs_dir = "../tasks_specs"', f'task_specs_dir = "{REPO / "tasks_specs"}"')
    config = config.replace("max_outer_steps = 4", "max_outer_steps = 1")
    (tmp_path / "run.toml").write_text(config)
    env = dict(service_env, METARL_HOME=str(tmp_path / "home"))
    result = metarl_cli(["run", str(tmp_path / "run.toml"), "--quiet"], env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]

    _, families = scrape(pg_url, redis_url)
    with session_scope(pg_url) as session:
        stages = dict(session.execute(select(Episode.stage, func.count()).group_by(Episode.stage)).all())
        ledger = session.execute(select(func.coalesce(func.sum(CostEntry.amount_usd), 0))).scalar_one()
        done_claims = dict(
            session.execute(
                select(StageClaim.stage, func.count())
                .where(StageClaim.status == ClaimStatus.done, StageClaim.duration_s.is_not(None))
                .group_by(StageClaim.stage)
            ).all()
        )
        versions = {(("run", name),): float(version) for name, version in session.execute(select(Run.name, Run.policy_version)).all()}
    assert samples(families["metarl_episodes"]) == {(("run", "sim-loop"), ("stage", stage.value)): float(count) for stage, count in stages.items()}
    assert sum(samples(families["metarl_cost_usd"], "_total").values()) == pytest.approx(float(ledger))
    assert float(ledger) > 0, "the sim backends record simulated costs"
    counts = {s.labels["stage"]: s.value for s in families["metarl_stage_seconds"].samples if s.name.endswith("_count")}
    for stage, count in done_claims.items():
        if stage.value in ("agent", "probe", "train", "eval"):
            assert counts[stage.value] == count, stage
    assert samples(families["metarl_policy_version"]) == versions, "the finished run keeps its last policy version"
