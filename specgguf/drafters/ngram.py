"""`ngram`: prompt lookup. Drafts the continuation of the most recent earlier occurrence of
the text's last few tokens, in the prompt or the output so far. Needs no draft model.

An index maps every n-gram (ngram_min <= n <= ngram_max) to the end of its latest earlier
occurrence, so a lookup is a few dict probes whatever the length of the text. Longer
matches are tried first: they predict better. The drafts are those of llama.cpp's
`ngram-simple` (the kind it is compared with); `--draft suffix` is the stronger lookup.

Confidence (base.Drafter): a continuation token is as sure as the match behind it is long:
the n-gram found, extended backwards as far as the earlier occurrence keeps matching (up to
`MATCH_CAP`), plus the draft tokens before it (each accepted one lengthens the match).
"""

from __future__ import annotations

from .base import Drafter

MATCH_CAP = 16  # backward extension of a match stops here (longer ones predict no better)


def match_confidence(match_len: int, n: int) -> list[float]:
    """Raw confidence of n continuation tokens behind a match of match_len tokens: the i-th
    token follows a match of match_len + i tokens once the ones before it were accepted."""
    return [1.0 - 1.0 / (match_len + i + 1) for i in range(n)]


class NgramDrafter(Drafter):
    """A lookup is deterministic: every drafted token is a point mass for `ratio`."""

    kind = "ngram"
    lookup = True
    max_length = 64  # auto: the whole continuation, cut to what pays

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
        seq = self._seq  # the text is seq + [id_last]; no copy of it is made
        self.last_confidence = []
        tail = seq[max(len(seq) - self.ngram_max + 1, 0):] if self.ngram_max > 1 else []
        tail.append(id_last)
        for n in range(min(self.ngram_max, len(seq) + 1), self.ngram_min - 1, -1):
            end = self._index.get(tuple(tail[-n:]))
            if end is not None:
                out = seq[end + 1:end + 1 + n_max]
                if len(out) < n_max and end + 1 + len(out) == len(seq):
                    out.append(id_last)
                m = n  # how far back the earlier occurrence keeps matching
                while m < MATCH_CAP and end - m >= 0 and len(seq) - m >= 0 \
                        and seq[end - m] == seq[len(seq) - m]:
                    m += 1
                self.last_confidence = match_confidence(m, len(out))
                return out
        return []
