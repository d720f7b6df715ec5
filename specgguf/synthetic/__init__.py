"""Tiny deterministic GGUF models (random weights, real tokenizers) for tests, probes and demos:
`qwen3` (qwen3 targets and the eagle3/dflash drafts that read them), `gemma4` (gemma4 targets),
and the hybrid targets `lfm2` (short-conv and attention layers; write_lfm2) and `qwen35`
(Qwen3.5/3.6 dense: gated DeltaNet and gated attention layers, optionally an MTP block;
write_qwen35). numpy and gguf only: nothing of specgguf, so the runtime's probes can use them.
"""
