"""The `sim` backends: a SIMULATOR of the cloud for tests, capacity planning and fault drills."""
