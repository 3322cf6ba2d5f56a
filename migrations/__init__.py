"""Alembic migrations of the metarl records (`metarl db upgrade`)."""
