"""The error the store's functions raise when the database fails them, for callers outside the store (which import no SQLAlchemy)."""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError

StoreError = SQLAlchemyError
"""Any database failure of a store function: the server unreachable or gone mid-statement, a statement it refused.
Callers that can wait for the database (a heartbeat, a best-effort note) catch it; the rest let it end their unit of work."""
