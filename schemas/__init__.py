"""Types only: the pydantic models of task specs, `job.toml` and the run config, and the record states.

Import from the modules themselves (`schemas.run_config`, `schemas.job`, ...); this package imports nothing of metarl.
"""
