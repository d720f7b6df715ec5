"""Draft kinds behind one small protocol (after llama.cpp's `common_speculative` hooks).

The engine calls, per generation and per round (runtime-protocol.md §1):

    reset()                           a new generation starts: forget all state
    begin(history)                    once, after the prompt is in the target
    process(tokens, pos0)             after EVERY target decode, with the same tokens
    draft(history, id_last, pos0, n)  propose up to n tokens following id_last
    rollback(pos)                     forget draft state at positions >= pos
    accept(k)                         k of the proposed tokens were accepted

`history` holds the tokens already in the target's KV cache (prompt and output so far);
`id_last` is the newest token, not yet in the cache, at position `pos0`.
"""

from __future__ import annotations

import os
from typing import Protocol, Sequence


class Drafter(Protocol):
    kind: str

    def reset(self) -> None: ...

    def begin(self, history: Sequence[int]) -> None: ...

    def process(self, tokens: Sequence[int], pos0: int) -> None: ...

    def draft(self, history: Sequence[int], id_last: int, pos0: int, n_max: int) -> list[int]: ...

    def rollback(self, pos: int) -> None: ...

    def accept(self, n_accepted: int) -> None: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


KINDS = ("model", "ngram")


def make_drafter(spec: str, target, **options) -> Drafter:
    """Build a drafter for `target` from a CLI-style spec: 'ngram' or a path to a draft GGUF."""
    from ..errors import UserError

    if spec == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(ngram_min=options.get("ngram_min", 2), ngram_max=options.get("ngram_max", 4))
    if spec.endswith(".gguf") or os.path.exists(spec):
        from .model import ModelDrafter

        return ModelDrafter(spec, target, n_gpu_layers=options.get("n_gpu_layers_draft", target.n_gpu_layers),
                            n_threads=options.get("n_threads"), p_min=options.get("p_min", 0.0))
    raise UserError(f"unknown --draft {spec!r}: give a draft GGUF file (path ending in .gguf) or 'ngram'")
