"""A GBNF grammar applied to the target at every verified position (docs/structured-output.md).

- drafts are cut at the first token the grammar forbids before they are verified (`cut`);
- verification masks the target at position i with the grammar state after d_1..d_i (`Walk`):
  greedy takes the arg-max over allowed tokens, sampling draws from the masked distribution,
  so the output is the one plain grammar-constrained decoding gives (token for token greedy,
  in distribution sampled): the same masked target, whatever the draft proposed.

Cost: asking llama.cpp about all 262k tokens of a Gemma vocabulary takes milliseconds, so greedy
asks about the arg-max first, then about the candidates at or above the 64th largest logit, and
the whole vocabulary only when none of them is allowed. That is exact: the first allowed token
in logit order is the masked arg-max, and ties at the cut are all in the candidate set (the
lowest id wins, as numpy's and llama.cpp's greedy arg-max pick it).

Where grammars come from (JSON schemas, `response_format`, tools) is the request layer's job:
`specgguf/request/constraints.py`.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import RequestError
from ..runtime import native

TOP_K = 64  # greedy's second try: candidates at or above the TOP_K-th largest logit

# native.Grammar points the process's stderr (fd 2) at a file while llama.cpp parses, to catch
# the parser's complaint; two threads doing that at once could leave stderr pointing at the
# other's file for good. The server compiles on its request threads and its worker: one at a time.
_COMPILING = threading.Lock()


def compile_gbnf(model: native.Model, gbnf: str) -> native.Grammar:
    """llama.cpp's grammar for `gbnf` on `model`'s vocabulary (one compilation at a time)."""
    with _COMPILING:
        return native.Grammar(model, gbnf)


class Constraint:
    """The grammar state of one generation: after every token emitted so far."""

    def __init__(self, model: native.Model, gbnf: str):
        self.model = model
        self.grammar = compile_gbnf(model, gbnf)
        self.cut_tokens = 0  # drafted tokens dropped before verification
        self.full_scans = 0  # verified positions that needed the whole vocabulary

    def close(self) -> None:
        self.grammar.close()

    def cut(self, draft: list[int]) -> list[int]:
        """The longest prefix of `draft` the grammar allows (it ends at an allowed end token)."""
        if not draft:
            return draft
        g = self.grammar.clone()
        try:
            for j, tok in enumerate(draft):
                if not g.allows(tok):
                    self.cut_tokens += len(draft) - j
                    return draft[:j]
                if self.model.is_eog(tok):
                    return draft[:j + 1]
                g.accept(tok)
            return draft
        finally:
            g.close()

    def walk(self, draft: list[int]) -> "Walk":
        return Walk(self, draft)


class Walk:
    """One round's verification: position i sees the grammar after the drafts before it.

    The acceptance rules ask positions 0, 1, ... in order and go on past i only when d_i was
    kept, so the state advances in place; `finish(ids)` adds the target's own last token."""

    def __init__(self, constraint: Constraint, draft: list[int]):
        self.c, self.g, self.draft, self.pos = constraint, constraint.grammar, draft, 0

    def _at(self, i: int):
        if i < self.pos:
            raise RuntimeError("grammar positions must be visited in order")
        while self.pos < i:
            self.g.accept(self.draft[self.pos])
            self.pos += 1
        return self.g

    def argmax(self, i: int, x: np.ndarray) -> int:
        """The highest-scoring allowed token at position i (lowest id among ties)."""
        g = self._at(i)
        t = int(x.argmax())
        if (i < len(self.draft) and t == self.draft[i]) or g.allows(t):  # drafts were checked by `cut`
            return t
        if x.size > TOP_K:
            cand = np.flatnonzero(x >= np.partition(x, -TOP_K)[-TOP_K])
            ok = g.allowed(cand)
            if ok.any():
                cand = cand[ok]
                return int(cand[x[cand].argmax()])
        self.c.full_scans += 1
        ok = g.allowed()
        if not ok.any():
            raise RequestError("the grammar allows no token of this vocabulary here: it cannot be completed "
                               "with this model", param="grammar", code="invalid_value")
        return int(np.where(ok, x, -np.inf).argmax())

    def mask(self, i: int, x: np.ndarray) -> np.ndarray:
        """The logits at position i with forbidden tokens at -inf (for sampling)."""
        self.c.full_scans += 1
        ok = self._at(i).allowed()
        if not ok.any():
            raise RequestError("the grammar allows no token of this vocabulary here: it cannot be completed "
                               "with this model", param="grammar", code="invalid_value")
        return np.where(ok, x, -np.inf)

    def finish(self, ids: list[int]) -> None:
        g = self._at(len(ids) - 1)
        if not self.c.model.is_eog(ids[-1]):
            g.accept(ids[-1])
