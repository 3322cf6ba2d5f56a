"""The `metarl` command line: the top layer, above the orchestrator and the workers."""
