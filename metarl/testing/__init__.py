"""Tools for fault drills, crash tests and benchmarks: exactly-once checks on a run's records, private services."""
