"""`ngram`: prompt lookup. Drafts the continuation of the most recent earlier occurrence of
the text's last few tokens, in the prompt or the output so far. Needs no draft model.

An index maps every n-gram (ngram_min <= n <= ngram_max) to the end of its latest earlier
occurrence, so a lookup is a few dict probes whatever the length of the text. Longer
matches are tried first: they predict better.
"""

from __future__ import annotations

from .base import Drafter


class NgramDrafter(Drafter):
    """A lookup is deterministic: every drafted token is a point mass for `ratio`."""

    kind = "ngram"

    def __init__(self, ngram_min: int = 2, ngram_max: int = 4):
        if not 1 <= ngram_min <= ngram_max:
            from ..errors import UserError

            raise UserError(f"n-gram sizes must satisfy 1 <= min <= max (got {ngram_min}, {ngram_max})")
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self._seq: list[int] = []
        self._index: dict[tuple, int] = {}

    def describe(self) -> str:
        return f"n-gram prompt lookup (match {self.ngram_max}..{self.ngram_min} tokens)"

    def reset(self) -> None:
        self._seq, self._index = [], {}

    def begin(self, history) -> None:
        self._seq, self._index = [], {}
        self._extend(history)

    def _extend(self, tokens) -> None:
        seq, index = self._seq, self._index
        for tok in tokens:
            seq.append(tok)
            end = len(seq) - 2  # n-grams ending here now have a known continuation
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end - n + 1 < 0:
                    break
                index[tuple(seq[end - n + 1:end + 1])] = end

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        if len(history) > len(self._seq):  # learn the tokens committed since the last round
            self._extend(history[len(self._seq):])
        text = self._seq + [id_last]
        for n in range(min(self.ngram_max, len(text)), self.ngram_min - 1, -1):
            end = self._index.get(tuple(text[-n:]))
            if end is not None:
                return text[end + 1:end + 1 + n_max]
        return []
