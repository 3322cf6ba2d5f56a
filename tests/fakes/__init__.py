"""Faithful fakes of outside services for tests (they run on 127.0.0.1 only)."""
