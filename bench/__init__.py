"""Benchmarks of the metarl backends (run as modules, e.g. ``python -m bench.inner_jobs``)."""
