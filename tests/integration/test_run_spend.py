"""A run's spend total (`run_spend`, migration 0008) equals its cost ledger's sum whatever writes the ledger."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, text

from metarl.interfaces import CostItem
from metarl.store import db
from metarl.store.db import session_scope, sql_transaction
from metarl.store.episodes import record_costs
from metarl.store.exactly_once import spend_violations
from metarl.store.ledger import run_total_usd
from metarl.store.records import CostEntry, RunSpend
from tests.integration.helpers import new_episode

pytestmark = pytest.mark.integration


def charge(key: str, quantity: float, price: float = 0.37) -> CostItem:
    return CostItem(source="sim", description=f"charge {key}", quantity=quantity, unit="gpu_second", unit_price_usd=price, key=key)


def ledger_sum(url: str, run_id: str) -> tuple[Decimal, int]:
    with session_scope(url) as session:
        total, lines = session.execute(text("SELECT coalesce(sum(amount_usd), 0), count(*) FROM cost_ledger WHERE run_id = :r"), {"r": run_id}).one()
        return total, lines


def kept(url: str, run_id: str) -> tuple[Decimal, int] | None:
    with session_scope(url) as session:
        row = session.get(RunSpend, run_id)
        return None if row is None else (row.amount_usd, row.entries)


def test_replayed_charges_add_once_and_the_budget_reads_the_total(pg_url: str) -> None:
    run_id, episode_id = new_episode(pg_url)
    other_run, _ = new_episode(pg_url)
    charges = [charge(f"k{i}", quantity=i + 0.25) for i in range(6)]
    for _ in range(3):  # a redelivered message records the same charges again
        with sql_transaction(pg_url, autocommit=True) as session:
            record_costs(session, run_id, episode_id, charges, simulated=True)
    with sql_transaction(pg_url, autocommit=True) as session:
        record_costs(session, other_run, None, [charge("other", 1000.0)], simulated=True)
    expected = sum(Decimal(str(c.quantity)) * Decimal(str(c.unit_price_usd)) for c in charges)
    assert ledger_sum(pg_url, run_id) == (expected, 6)
    assert kept(pg_url, run_id) == (expected, 6)
    with session_scope(pg_url) as session:
        assert run_total_usd(session, run_id) == pytest.approx(float(expected))
        assert spend_violations(session, run_id) == []
        assert run_total_usd(session, "no-such-run") == 0.0


def test_concurrent_writers_racing_on_the_same_keys_keep_the_total_exact(pg_url: str) -> None:
    run_id, episode_id = new_episode(pg_url)
    rng = random.Random(3)
    keys = [f"race-{i}" for i in range(60)]
    quantity = {key: rng.uniform(0, 500) for key in keys}

    def writer(seed: int) -> None:
        mine = random.Random(seed).sample(keys, 40)  # overlapping subsets: most keys are written by several threads at once
        for start in range(0, len(mine), 4):
            with sql_transaction(pg_url, autocommit=True) as session:
                record_costs(session, run_id, episode_id, [charge(key, quantity[key]) for key in mine[start : start + 4]], simulated=True)

    with ThreadPoolExecutor(max_workers=6) as pool:
        for done in [pool.submit(writer, seed) for seed in range(6)]:
            done.result(timeout=60)  # re-raises a writer's error here
    total, lines = ledger_sum(pg_url, run_id)
    assert kept(pg_url, run_id) == (total, lines)
    assert lines == len({key for seed in range(6) for key in random.Random(seed).sample(keys, 40)})


def test_edits_and_deletes_of_ledger_lines_are_taken_back_out(pg_url: str) -> None:
    run_id, episode_id = new_episode(pg_url)
    other_run, _ = new_episode(pg_url)
    with sql_transaction(pg_url, autocommit=True) as session:
        record_costs(session, run_id, episode_id, [charge("a", 10), charge("b", 20), charge("c", 30)], simulated=True)
    with session_scope(pg_url) as session:
        session.execute(text("UPDATE cost_ledger SET amount_usd = amount_usd * 2 WHERE idempotency_key = 'a'"))
        session.execute(text("UPDATE cost_ledger SET run_id = :other WHERE idempotency_key = 'b'"), {"other": other_run})
        session.execute(text("DELETE FROM cost_ledger WHERE idempotency_key = 'c'"))
        session.execute(text("UPDATE cost_ledger SET description = 'renamed' WHERE idempotency_key = 'a'"))
    for run in (run_id, other_run):
        assert kept(pg_url, run) == ledger_sum(pg_url, run)
    assert kept(pg_url, run_id) == (Decimal("7.400000000"), 1)
    with session_scope(pg_url) as session:
        session.execute(text("DELETE FROM runs WHERE id = :r"), {"r": run_id})
    assert kept(pg_url, run_id) is None
    assert ledger_sum(pg_url, run_id) == (0, 0)


def test_the_exactly_once_check_flags_a_total_that_disagrees(pg_url: str) -> None:
    run_id, episode_id = new_episode(pg_url)
    with session_scope(pg_url) as session:
        session.add(
            CostEntry(
                run_id=run_id,
                episode_id=episode_id,
                source="sim",
                description="orm",
                quantity=2,
                unit="s",
                unit_price_usd=1.5,
                amount_usd=3,
                idempotency_key="orm-1",
            )
        )
    with session_scope(pg_url) as session:
        assert spend_violations(session, run_id) == []
        session.execute(text("UPDATE run_spend SET amount_usd = 2 WHERE run_id = :r"), {"r": run_id})
    with session_scope(pg_url) as session:
        assert spend_violations(session, run_id) == ["run_spend holds $2 over 1 line(s), the ledger $3.000000000 over 1"]


def test_migration_0008_fills_the_totals_of_an_existing_ledger(pg_url: str) -> None:
    from alembic import command

    runs = [new_episode(pg_url) for _ in range(3)]
    command.downgrade(db.alembic_config(pg_url), "0007")
    engine = create_engine(db.normalise_url(pg_url))
    with engine.begin() as connection:
        assert connection.execute(text("SELECT to_regclass('run_spend')")).scalar() is None
        for n, (run_id, episode_id) in enumerate(runs[:2]):
            for i in range(n + 2):
                connection.execute(
                    text(
                        "INSERT INTO cost_ledger (run_id, episode_id, source, description, quantity, unit, unit_price_usd, amount_usd, simulated, idempotency_key, created_at)"
                        " VALUES (:r, :e, 'sim', 'old', 1, 's', :p, :p, true, :k, now())"
                    ),
                    {"r": run_id, "e": episode_id, "p": Decimal("0.125") * (i + 1), "k": f"old-{n}-{i}"},
                )
    engine.dispose()
    db.dispose_engines()
    db.upgrade(pg_url)
    assert kept(pg_url, runs[0][0]) == (Decimal("0.375000000"), 2)
    assert kept(pg_url, runs[1][0]) == (Decimal("0.750000000"), 3)
    assert kept(pg_url, runs[2][0]) is None
    with session_scope(pg_url) as session:
        assert all(spend_violations(session, run_id) == [] for run_id, _ in runs)
