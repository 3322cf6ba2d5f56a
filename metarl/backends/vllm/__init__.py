"""The `vllm` eval backend: hidden-eval scoring with vLLM on GPU eval workers."""
