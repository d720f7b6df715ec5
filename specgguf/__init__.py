"""specgguf: speculative decoding for GGUF models on llama.cpp, from Python.

Public names (everything else is internal and may change):

- `SpecGGUF`: a target GGUF plus an optional draft (None, "ngram" or a draft GGUF whose kind
  is read from the file); `generate()`, `stream()`, `create_completion()`,
  `create_chat_completion()` / `chat()` with llama_cpp.Llama's dict shapes, `close()`.
- `Result`: what `SpecGGUF.generate()` returns (text, tokens, finish_reason, stats).
- `Chunk`: one piece of `SpecGGUF.stream()`; the last carries finish_reason, tokens, stats.
- `GenerationStats`: rounds, drafted/accepted counts, tau, timings; `to_dict()` is the JSON.
- `UserError`: bad input, with a one-line message saying what to do; a `ValueError`, so
  `except ValueError` catches every kind of bad input.
- `RequestError`: a refused request (a `UserError`, so a `ValueError` too) with OpenAI's
  error fields; `to_dict()` is OpenAI's error body.

The names load lazily, so that `import specgguf.converters` does not load llama.cpp.
"""

from __future__ import annotations

__all__ = ["SpecGGUF", "Result", "Chunk", "GenerationStats", "UserError", "RequestError"]

_WHERE = {"SpecGGUF": "api", "Result": "api", "Chunk": "api", "GenerationStats": "decoding.stats",
          "UserError": "errors", "RequestError": "errors"}


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'specgguf' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
