"""The cost ledger: every charge recorded once, keyed by an idempotency key."""

from __future__ import annotations

from decimal import Decimal

from metarl.store.columns import columns_of, insert_lists
from metarl.store.db import SqlTarget, run_sql
from metarl.store.records import CostEntry

COST_COLUMNS, COST_VALUES = insert_lists(CostEntry.__table__, columns_of(CostEntry.__table__, without=("id",)), {"created_at": "now()"})
RECORD_COST_SQL = f"""
INSERT INTO cost_ledger ({COST_COLUMNS})
VALUES ({COST_VALUES})
ON CONFLICT ON CONSTRAINT uq_cost_ledger_idempotency_key DO NOTHING
RETURNING id
"""


def cost_params(
    *,
    run_id: str,
    episode_id: int | None,
    source: str,
    description: str,
    quantity: float,
    unit: str,
    unit_price_usd: float,
    idempotency_key: str,
    simulated: bool,
) -> dict[str, object]:
    """The parameters of RECORD_COST_SQL for one charge (pure)."""
    amount = Decimal(str(quantity)) * Decimal(str(unit_price_usd))
    return {
        "run_id": run_id,
        "episode_id": episode_id,
        "source": source,
        "description": description[:255],
        "quantity": quantity,
        "unit": unit,
        "unit_price_usd": unit_price_usd,
        "amount_usd": amount,
        "simulated": simulated,
        "idempotency_key": idempotency_key,
    }


RUN_SPEND_SQL = "SELECT coalesce((SELECT amount_usd FROM run_spend WHERE run_id = %(run_id)s), 0)"
"""The run's spend so far: its `run_spend` row, which triggers on the ledger keep equal to its sum (migration 0008), so the read
does not grow with the run. Larger statements embed it as a subquery to save a round trip."""


def run_total_usd(session: SqlTarget, run_id: str) -> float:
    """Dollars recorded for the run so far (simulated entries included)."""
    return float(run_sql(session, RUN_SPEND_SQL, {"run_id": run_id}).scalar_one())
