"""Celery workers: one app, five queues (agent, probe, train, eval, outer), one task module per stage kind."""
