"""Draft-checkpoint converters (imported as `specgguf.converters`).

`convert()` turns a DeepSpec DFlash/DSpark checkpoint (Qwen3, Gemma 4), a community
DFlash/DSpark/DFlash 2 export (SpecForge, vLLM speculators, LiquidAI, Ling, z-lab) or a
standard EAGLE-3 export into a GGUF draft for llama.cpp, with numpy and the `gguf` package
only (no torch).
"""

from .convert import Result, convert

__all__ = ["convert", "Result"]
