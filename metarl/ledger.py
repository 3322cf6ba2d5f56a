"""The cost ledger: every charge recorded once, keyed by an idempotency key."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from schemas.records import CostEntry


def record_cost(
    session: Session,
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
) -> bool:
    """Insert one charge; returns False (and changes nothing) if that key was already billed."""
    amount = Decimal(str(quantity)) * Decimal(str(unit_price_usd))
    inserted = session.execute(
        insert(CostEntry)
        .values(
            run_id=run_id,
            episode_id=episode_id,
            source=source,
            description=description[:255],
            quantity=quantity,
            unit=unit,
            unit_price_usd=unit_price_usd,
            amount_usd=amount,
            simulated=simulated,
            idempotency_key=idempotency_key,
        )
        .on_conflict_do_nothing(constraint="uq_cost_ledger_idempotency_key")
        .returning(CostEntry.id)
    ).scalar_one_or_none()
    return inserted is not None


def run_total_usd(session: Session, run_id: str) -> float:
    total = session.execute(select(func.coalesce(func.sum(CostEntry.amount_usd), 0)).where(CostEntry.run_id == run_id)).scalar_one()
    return float(total)
