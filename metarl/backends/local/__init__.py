"""The `local` backends: real learning on the CPU (GRPO inner jobs, torch eval, the local trainer-agent policy)."""
