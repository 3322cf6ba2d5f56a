"""Local learning backends: task families, tiny base models, GRPO inner trainer, scorer.

Modules (import them directly; this package imports nothing heavy):

- ``families``: task families, graders, hidden evals, contamination checks (no torch).
- ``tokenizer``: the character-level Hugging Face tokenizer.
- ``models``: ``ensure_base_model`` builds and caches the local stand-ins for Qwen3 0.6B / 1.7B.
- ``grpo``: ``LocalTrainConfig`` and ``train`` (real GRPO on the CPU).
- ``scoring``: ``score_checkpoint`` and the prompt/grade functions any evaluator shares.
- ``presets``: the sensible and the deliberately bad reference configs.
"""
