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

Sampling (`verify.py`'s `ratio` rule needs the distribution each token was drafted from):

    draft(..., sampler=None)          when sampling, the engine passes a `sampling.Sampler`;
                                      pick each token with `tok, q = sampler.propose(logits,
                                      sampler.window(history, id_last) + drafted_so_far)`
    last_q                            after draft(): one q per returned token (the full-vocab
                                      vector it was drawn from, or None for a point mass), or
                                      None when every token was picked deterministically

A kind whose draft() takes no `sampler` keeps drafting as it does, and `ratio` treats its
tokens as point masses (acceptance p(d), residual p without d): still exact, only less
accepted. Never stop or discard a draft because of a token you drew: decide on the draft's
own top candidate first (see ModelDrafter's p_min), or the q you report is not the one the
tokens came from.
"""

from __future__ import annotations

import os
from typing import Protocol, Sequence


class Drafter(Protocol):
    kind: str

    def reset(self) -> None: ...

    def begin(self, history: Sequence[int]) -> None: ...

    def process(self, tokens: Sequence[int], pos0: int) -> None: ...

    def draft(self, history: Sequence[int], id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]: ...

    def rollback(self, pos: int) -> None: ...

    def accept(self, n_accepted: int) -> None: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def top10_prob(logits, tok: int) -> float:
    """llama.cpp's draft confidence for --draft-p-min: the softmax over the 10 best logits
    (not the whole vocabulary) at token `tok`."""
    import numpy as np

    top = np.partition(logits, -10)[-10:]
    top = np.exp(top - top.max())
    return float(np.exp(logits[tok] - logits.max()) / top.sum())


KINDS = ("model", "ngram", "eagle3", "dflash", "dspark")


def detect_kind(info) -> str:
    """The kind a draft GGUF serves as: eagle3, dflash, dspark (a Markov head), or model."""
    if info.arch == "eagle3":
        return "eagle3"
    if info.arch == "dflash":
        return "dspark" if info.has_tensor("markov_w1.weight") else "dflash"
    return "model"


def make_drafter(spec: str, target, kind: str | None = None, draft_max: int = 8, n_threads: int | None = None,
                 n_gpu_layers: int | None = None, p_min: float = 0.0, n_min: int = 0, **options) -> Drafter:
    """Build a drafter for `target` from a CLI-style spec: 'ngram' or a path to a draft GGUF.
    `kind` overrides the detected kind (for example dspark slot rules for a DFlash file)."""
    from ..errors import UserError
    from ..ggufinfo import read_gguf

    if spec == "ngram" or kind == "ngram":
        from .ngram import NgramDrafter

        return NgramDrafter(ngram_min=options.get("ngram_min", 2), ngram_max=options.get("ngram_max", 4))
    if not (spec.endswith(".gguf") or os.path.exists(spec)):
        raise UserError(f"unknown --draft {spec!r}: give a draft GGUF file (path ending in .gguf) or 'ngram'")
    if kind is not None and kind not in KINDS:
        raise UserError(f"unknown --draft-kind {kind!r}: use one of {', '.join(KINDS)}")
    info = read_gguf(spec, "draft")
    detected = detect_kind(info)
    kind = kind or detected
    allowed = {"model": {"model"}, "eagle3": {"eagle3"}, "dflash": {"dflash", "dspark"}, "dspark": {"dspark"}}
    if kind not in allowed[detected]:
        raise UserError(f"draft {info.path.name} is a {detected} draft (arch {info.arch}); it cannot run as "
                        f"--draft-kind {kind}")
    common = dict(n_threads=n_threads, p_min=p_min, n_min=n_min,
                  n_gpu_layers=target.n_gpu_layers if n_gpu_layers is None else n_gpu_layers)
    if kind == "model":
        from .model import ModelDrafter

        return ModelDrafter(info, target, **common)
    if kind == "eagle3":
        from .eagle3 import Eagle3Drafter

        return Eagle3Drafter(info, target, **common)
    from .dflash import DFlashDrafter

    return DFlashDrafter(info, target, kind, draft_max=draft_max, **common)
