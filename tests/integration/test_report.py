"""`metarl report` on real records: a finished sim run on Redis and PostgreSQL, a run without outer steps, bad input."""

from __future__ import annotations

import csv
import io
import math
import os
import re
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from metarl.store.db import session_scope
from metarl.store.records import ClaimStatus, Episode, EpisodeGroup, GroupStatus, OuterStep, Reward, Run, Stage, StageClaim
from tests.conftest import metarl_cli
from tests.integration.helpers import sim_config

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRIC_COLUMNS = (
    "reward_mean",
    "held_out_reward_mean",
    "raw_improvement_mean",
    "large_model_share",
    "explicit_hparam_share",
    "first_try_pass_rate",
    "cost_usd_total",
)


class Page(HTMLParser):
    """Image sources, link targets and visible text of the report page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            self.images.append(values["src"] or "")
        elif tag == "a":
            self.links.append(values["href"] or "")
        assert tag != "script", "the report contains a script element"

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(index: Path) -> Page:
    page = Page()
    page.feed(index.read_text(encoding="utf-8"))
    page.close()
    return page


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def run_id_from(output: str) -> str:
    match = re.search(r"run ([0-9a-f\-]{36})", output)
    assert match, output
    return match.group(1)


def index_from(stdout: str) -> Path:
    lines = stdout.strip().splitlines()
    assert lines, "metarl report printed nothing"
    return Path(lines[-1])


def test_report_of_a_finished_sim_run(tmp_path: Path, service_env: dict[str, str], pools: object, pg_url: str) -> None:
    config = sim_config(tmp_path, name="report", max_outer_steps=3, held_out_group_size=3)
    done = metarl_cli(["run", str(config), "--no-workers", "--quiet"], service_env, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    run_id = run_id_from(done.stdout)

    result = metarl_cli(["report", run_id], dict(service_env, METARL_HOME=str(tmp_path / "home")), timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    index = index_from(result.stdout)
    assert index == tmp_path / "artifacts" / "reports" / run_id / "index.html", "default folder is <artifacts root>/reports/<run id>"
    folder = index.parent

    page = parse(index)
    assert len(page.images) == 7, page.images
    for source in page.images:
        image = folder / source
        assert image.parent == folder, source
        assert image.read_bytes()[:8] == PNG_MAGIC, source
    assert {"steps.csv", "latency.csv"} <= set(page.links)
    assert all((folder / link).is_file() for link in page.links)
    assert "SIMULATED" in " ".join(page.text)

    with session_scope(pg_url) as session:
        steps = session.execute(select(OuterStep).where(OuterStep.run_id == run_id).order_by(OuterStep.step)).scalars().all()
        held_out = held_out_by_version(session, run_id)
        held_out_sizes = session.execute(
            select(EpisodeGroup.size, func.count(Episode.id))
            .join(Episode, Episode.group_id == EpisodeGroup.id)
            .where(EpisodeGroup.run_id == run_id, EpisodeGroup.held_out.is_(True))
            .group_by(EpisodeGroup.id)
        ).all()
        assert held_out_sizes and all(tuple(row) == (3, 3) for row in held_out_sizes), held_out_sizes  # outer.held_out_group_size, not group_size 2
        expected = {step.step: dict(step.metrics) for step in steps}
        for step in steps:
            if step.policy_version_before in held_out:
                expected[step.step]["held_out_reward_mean"] = held_out[step.policy_version_before]
        train_seconds: dict[int, list[float]] = {}
        for step in steps:
            groups = session.execute(select(EpisodeGroup.id).where(EpisodeGroup.outer_step_id == step.id)).scalars().all()
            episodes = session.execute(select(Episode.id).where(Episode.group_id.in_(groups))).scalars().all()
            train_seconds[step.step] = [
                claim.duration_s
                for claim in session.execute(select(StageClaim).where(StageClaim.episode_id.in_(episodes), StageClaim.stage == Stage.train)).scalars()
                if claim.status == ClaimStatus.done and claim.duration_s is not None
            ]
    assert sorted(expected) == [1, 2, 3]

    rows = read_csv(folder / "steps.csv")
    assert [int(row["step"]) for row in rows] == [1, 2, 3], "one row per outer step"
    previous = 0.0
    for row in rows:
        metrics = expected[int(row["step"])]
        assert row["status"] == "done"
        for column in METRIC_COLUMNS:
            value = metrics.get(column)
            if value is None:
                assert row[column] == "", (column, row[column])
            else:
                assert math.isclose(float(row[column]), float(value), rel_tol=1e-12, abs_tol=1e-12), (column, row[column], value)
        assert math.isclose(float(row["cost_usd_step"]), metrics["cost_usd_total"] - previous, abs_tol=1e-9)
        previous = metrics["cost_usd_total"]
    assert any(row["raw_improvement_mean"] for row in rows), "the sim run recorded no raw improvement"

    latency = read_csv(folder / "latency.csv")
    assert [int(row["step"]) for row in latency] == [1, 2, 3]
    for row in latency:
        seconds = train_seconds[int(row["step"])]
        assert int(row["train_n"]) == len(seconds) > 0
        assert math.isclose(float(row["train_median_s"]), statistics.median(seconds), rel_tol=1e-9)
        assert float(row["train_p90_s"]) >= float(row["train_median_s"])
        assert int(row["agent_n"]) > 0 and int(row["eval_n"]) > 0

    again = metarl_cli(["report", run_id, "--out", str(tmp_path / "elsewhere")], dict(service_env, METARL_HOME=str(tmp_path / "home")), timeout=120)
    assert again.returncode == 0, again.stderr
    assert index_from(again.stdout) == tmp_path / "elsewhere" / "index.html"
    assert (folder / "steps.csv").read_text() == (tmp_path / "elsewhere" / "steps.csv").read_text()

    # a held-out group evaluated after its outer step's update is missing from that step's stored metrics;
    # the report still shows it, from the records
    late = next(step for step in steps if step.policy_version_before in held_out)
    with session_scope(pg_url) as session:
        stored = dict(session.get(OuterStep, late.id).metrics)
        stored.pop("held_out_reward_mean", None)
        session.execute(update(OuterStep).where(OuterStep.id == late.id).values(metrics=stored))
    late_report = metarl_cli(["report", run_id, "--out", str(tmp_path / "late")], dict(service_env, METARL_HOME=str(tmp_path / "home")), timeout=120)
    assert late_report.returncode == 0, late_report.stderr
    row = next(row for row in read_csv(tmp_path / "late" / "steps.csv") if int(row["step"]) == late.step)
    assert math.isclose(float(row["held_out_reward_mean"]), held_out[late.policy_version_before], rel_tol=1e-12)


def held_out_by_version(session, run_id: str) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """Mean reward of evaluated held-out episodes per policy version, computed here independently of the report code."""
    totals: dict[int, list[float]] = {}
    rows = session.execute(
        select(Episode.policy_version, Reward.total)
        .join(Reward, Reward.episode_id == Episode.id)
        .join(EpisodeGroup, EpisodeGroup.id == Episode.group_id)
        .where(EpisodeGroup.run_id == run_id, EpisodeGroup.held_out.is_(True), EpisodeGroup.status == GroupStatus.evaluated)
    ).all()
    for version, total in rows:
        totals.setdefault(int(version), []).append(float(total))
    assert totals, "the sim run evaluated no held-out group"
    return {version: statistics.fmean(values) for version, values in totals.items()}


def test_report_of_a_run_without_outer_steps(tmp_path: Path, pg_url: str) -> None:
    from metarl.runconfig import load_run
    from orchestrator.loop import create_run

    config, specs = load_run(sim_config(tmp_path, name="nosteps"))
    run_id = create_run(pg_url, config, specs)
    hostile = '<script>alert("x")</script> & <img src=y onerror=alert(1)>'
    with session_scope(pg_url) as session:
        session.execute(update(Run).where(Run.id == run_id).values(status_message=hostile))
    env = dict(os.environ, METARL_DATABASE_URL=pg_url, METARL_HOME=str(tmp_path / "home"))
    env.pop("METARL_BROKER_URL", None)
    out = tmp_path / "report"
    result = metarl_cli(["report", run_id, "--out", str(out)], env, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    assert index_from(result.stdout) == out / "index.html"
    source = (out / "index.html").read_text(encoding="utf-8")
    assert hostile not in source and "<img src=y" not in source
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img src=y onerror=alert(1)&gt;" in source
    page = parse(out / "index.html")
    assert page.images == [] and list(out.glob("*.png")) == []
    assert "the run has no outer steps yet" in " ".join(page.text)
    assert len(read_csv(out / "steps.csv")) == 0 and len(read_csv(out / "latency.csv")) == 0

    from metarl.versus_search import rows_to_csv
    from tests.unit.test_versus_search import bench_rows

    versus = tmp_path / "versus.csv"
    versus.write_text(rows_to_csv(bench_rows()))
    compared = metarl_cli(["report", run_id, "--out", str(tmp_path / "versus"), "--versus-search", str(versus)], env, timeout=120)
    assert compared.returncode == 0, compared.stderr + compared.stdout
    assert parse(tmp_path / "versus" / "index.html").images == ["versus_search.png"], "the comparison beside a run with no plots of its own"


def test_report_bad_input(tmp_path: Path, pg_url: str) -> None:
    env = dict(os.environ, METARL_DATABASE_URL=pg_url, METARL_HOME=str(tmp_path / "home"))
    env.pop("METARL_BROKER_URL", None)
    missing = "00000000-0000-4000-8000-000000000000"
    result = metarl_cli(["report", missing, "--out", str(tmp_path / "out")], env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith(f"error: no run with id {missing}") and "`metarl status` lists runs" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()

    hostile = metarl_cli(["report", "x'; DROP TABLE runs; --\x1b[2J"], env, timeout=60)
    assert hostile.returncode == 3 and "\x1b" not in hostile.stderr and "Traceback" not in hostile.stderr
    with session_scope(pg_url) as session:
        assert session.execute(select(Run)).first() is None

    from metarl.runconfig import load_run
    from orchestrator.loop import create_run

    config, specs = load_run(sim_config(tmp_path, name="badout"))
    run_id = create_run(pg_url, config, specs)
    (tmp_path / "file").write_text("x")
    blocked = metarl_cli(["report", run_id, "--out", str(tmp_path / "file" / "report")], env, timeout=60)
    assert blocked.returncode == 2, blocked.stderr
    assert blocked.stderr.startswith("error: cannot write the report to") and "Traceback" not in blocked.stderr
