"""Tokens to text, incrementally: UTF-8 split across tokens, and stop strings.

A stop string may straddle several tokens, so text that could still become one is held
back until it cannot; when one appears, the text before it is released and the
generation is closed with finish_reason "stop".
"""

from __future__ import annotations

import codecs
from typing import Iterator


class TextStream:
    def __init__(self, generation, model, stop: list[str] | None = None):
        self.generation, self.model = generation, model
        self.stop = [s for s in (stop or []) if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""  # everything released so far

    def __iter__(self) -> Iterator[str]:
        pending = ""
        hold = max((len(s) for s in self.stop), default=0)
        for tok in self.generation:
            pending += self._decoder.decode(self.model.token_to_piece(tok))
            keep = 0
            if self.stop:
                cut = min((i for i in (pending.find(s) for s in self.stop) if i >= 0), default=-1)
                if cut >= 0:
                    self.generation.close("stop")
                    yield from self._release(pending[:cut])
                    return
                keep = _stop_prefix_len(pending, self.stop, hold)
            out, pending = pending[:len(pending) - keep], pending[len(pending) - keep:]
            yield from self._release(out)
        yield from self._release(pending + self._decoder.decode(b"", final=True))

    def _release(self, text: str) -> Iterator[str]:
        if text:
            self.text += text
            yield text


def _stop_prefix_len(text: str, stops: list[str], hold: int) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    for n in range(min(hold - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0
