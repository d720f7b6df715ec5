"""`ngram`: prompt lookup. Drafts the continuation of the most recent earlier occurrence of
the text's last few tokens, in the prompt or the output so far. Needs no draft model.

An index maps every n-gram (ngram_min <= n <= ngram_max) to the end of its latest earlier
occurrence, so a lookup is a few dict probes whatever the length of the text. Longer
matches are tried first: they predict better. The drafts are those of llama.cpp's
`ngram-simple` (the kind it is compared with); `--draft suffix` is the stronger lookup.

Confidence (base.Drafter): a continuation token is as sure as the match behind it is long:
the n-gram found, extended backwards as far as the earlier occurrence keeps matching (up to
`MATCH_CAP`), plus the draft tokens before it (each accepted one lengthens the match). A
token is less sure when the n-gram before it has been followed by different tokens in the
text (`"name": "` in a JSON list): the latest occurrence is then one guess among several,
until the match is long enough (`MATCH_CAP`) to tell them apart.
"""

from __future__ import annotations

from .base import Drafter

MATCH_CAP = 16  # backward extension of a match stops here (longer ones predict no better)


def match_confidence(match_len: int, n: int, ways=None) -> list[float]:
    """Raw confidence of n continuation tokens behind a match of match_len tokens: the i-th
    token follows a match of match_len + i tokens once the ones before it were accepted.
    ways[i]: how many different tokens have followed the n-gram before token i in the text;
    unless the match is long enough to tell those occurrences apart, token i is one of that
    many guesses."""
    conf = [1.0 - 1.0 / (match_len + i + 1) for i in range(n)]
    if ways is not None:
        for i, w in enumerate(ways[:n]):
            if w > 1 and match_len + i < MATCH_CAP:
                conf[i] /= w
    return conf


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
        self._ways: dict[tuple, int | set] = {}  # n-gram -> its next token, or the set of them

    def describe(self) -> str:
        return f"n-gram prompt lookup (match {self.ngram_max}..{self.ngram_min} tokens)"

    def reset(self) -> None:
        self._seq, self._index, self._ways = [], {}, {}

    def resume(self, n: int) -> int:
        self.reset()
        return n  # the index is rebuilt from the history by begin()

    def save(self):
        return ()  # nothing beyond the history

    def restore(self, state) -> bool:
        self.reset()
        return True

    def begin(self, history) -> None:
        self.reset()
        self._extend(history)

    def _extend(self, tokens) -> None:
        seq, index, ways = self._seq, self._index, self._ways
        for tok in tokens:
            seq.append(tok)
            end = len(seq) - 2  # n-grams ending here now have a known continuation: tok
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end - n + 1 < 0:
                    break
                key = tuple(seq[end - n + 1:end + 1])
                index[key] = end
                seen = ways.get(key)
                if seen is None:
                    ways[key] = tok
                elif isinstance(seen, set):
                    seen.add(tok)
                elif seen != tok:
                    ways[key] = {seen, tok}

    def _ways_along(self, key: tuple, end: int, n: int, match_len: int) -> list[int]:
        """For each of the n tokens continuing the occurrence that ends at `end` (matched by
        `key`), how many different tokens have followed the n-gram before it."""
        seq, ways, size = self._seq, self._ways, self.ngram_max
        out = []
        for i in range(min(n, max(MATCH_CAP - match_len, 0))):  # longer matches are not discounted
            k = key if i == 0 else tuple(seq[end + i - size + 1:end + i + 1])
            seen = ways.get(k)
            out.append(len(seen) if isinstance(seen, set) else 1)
        return out

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        if len(history) > len(self._seq):  # learn the tokens committed since the last round
            self._extend(history[len(self._seq):])
        seq = self._seq  # the text is seq + [id_last]; no copy of it is made
        self.last_confidence = []
        tail = seq[max(len(seq) - self.ngram_max + 1, 0):] if self.ngram_max > 1 else []
        tail.append(id_last)
        for n in range(min(self.ngram_max, len(seq) + 1), self.ngram_min - 1, -1):
            key = tuple(tail[-n:])
            end = self._index.get(key)
            if end is not None:
                out = seq[end + 1:end + 1 + n_max]
                if len(out) < n_max and end + 1 + len(out) == len(seq):
                    out.append(id_last)
                m = n  # how far back the earlier occurrence keeps matching
                while m < MATCH_CAP and end - m >= 0 and len(seq) - m >= 0 \
                        and seq[end - m] == seq[len(seq) - m]:
                    m += 1
                self.last_confidence = match_confidence(m, len(out), self._ways_along(key, end, len(out), m))
                return out
        return []
