"""The store: every SQL statement, session and connection of metarl (PostgreSQL is the source of truth)."""
