"""The broker side shared by the orchestrator and the workers: the Celery app, queues, transports, dispatch."""
