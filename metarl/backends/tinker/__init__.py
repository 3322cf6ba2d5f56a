"""The `tinker` backends: the trainer agent as an LLM on Tinker and its LoRA update."""
