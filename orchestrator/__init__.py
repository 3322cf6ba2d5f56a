"""The orchestrator: keeps a window of episodes in flight, forms outer batches, reconciles after crashes."""
