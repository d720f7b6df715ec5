"""Tiny deterministic GGUF models (random weights, real tokenizers) for tests, probes and demos:
`qwen3` (qwen3 targets and the eagle3/dflash drafts that read them), `gemma4` (gemma4 targets).
numpy and gguf only: nothing of specgguf, so the runtime's probes can use them.
"""
