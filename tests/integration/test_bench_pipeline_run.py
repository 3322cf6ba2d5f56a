"""`python -m bench.pipeline_overhead` at its smallest size, end to end on the real services.

The four passes (plain, floor, ours, reuse) start their worker pools, finish every episode, and
the report names each pass; the floor pass checks in the database that every episode went through
every step with one closed claim per step.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import PG_ADMIN_URL, REDIS_HOST, REDIS_PORT, REPO, require_service


def test_the_bench_runs_all_four_passes_at_its_smallest_size() -> None:
    require_service("127.0.0.1", 5432, "PostgreSQL")
    require_service(REDIS_HOST, REDIS_PORT, "Redis")
    env = {**os.environ, "METARL_BENCH_PG_ADMIN_URL": PG_ADMIN_URL, "METARL_BENCH_REDIS_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.pipeline_overhead", "--episodes", "8", "--repeats", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = done.stdout.split("\npass ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = {line.split()[0]: line.split() for line in table}
    assert set(rows) == {"plain", "floor", "ours", "reuse"}
    assert all(row[4] == "41" for row in rows.values())  # tasks: 5 per episode + 1 outer per batch of 8
    assert "ratio ours/plain" in done.stdout and "ratio floor/plain" in done.stdout and "ratio ours/reuse" in done.stdout
