"""Benchmark scripts (each prints its own table)."""
