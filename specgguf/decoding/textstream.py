"""Tokens to text, incrementally: UTF-8 split across tokens, and stop strings.

A stop string may straddle several tokens, so text that could still become one is held
back until it cannot; when one appears, the text before it is released and the
generation is closed with finish_reason "stop".

The stop strings also tell the engine where a draft stops mattering (`StopStrings.useful_draft`,
the generation's `draft_limit` hook, given to it when it is built): a drafted token after the one that would complete a stop
string can never be output, so it is not verified. Agents stop every turn at a stop string,
and a lookup draft copied from earlier text runs on past it (docs/loop.md).
"""

from __future__ import annotations

import codecs
from typing import Iterator


class StopStrings:
    """A generation's stop strings, and the output's last bytes they are matched against:
    what the engine's `draft_limit` hook needs (`useful_draft`) before any text is read, so
    it exists before the generation does; the `TextStream` that reads the output feeds it."""

    def __init__(self, model, stop: list[str] | None = None):
        self.model = model
        self.stop = [s for s in (stop or []) if s]
        self._tail = b""
        if self.stop:
            self._stop_bytes = [s.encode("utf-8") for s in self.stop]
            # the output's last bytes, as many as a stop string could still need (+3: a
            # character split across tokens)
            self._keep = max(len(b) for b in self._stop_bytes) + 3
            self._pieces: dict[int, bytes] = {}

    @property
    def draft_limit(self):
        """The engine's draft_limit hook (None: no stop string, every draft is useful)."""
        return self.useful_draft if self.stop else None

    def output(self, piece: bytes) -> None:
        """One more output token's bytes."""
        self._tail = (self._tail + piece)[-self._keep:]

    def useful_draft(self, draft: list[int]) -> int:
        """How many of `draft` (the tokens after the output so far) can still be output: up to
        and including the one whose text completes a stop string; all when none does."""
        pieces, piece = self._pieces, self.model.token_to_piece
        text, ends = self._tail, []
        for tok in draft:
            b = pieces.get(tok)
            if b is None:
                b = pieces[tok] = piece(tok)
            text += b
            ends.append(len(text))
        start = len(self._tail)
        first = None  # where the earliest stop string found in the draft's text ends
        for stop in self._stop_bytes:
            at = text.find(stop, max(start - len(stop) + 1, 0))
            if at >= 0 and (first is None or at + len(stop) < first):
                first = at + len(stop)
        if first is None:
            return len(draft)
        return next(i + 1 for i, end in enumerate(ends) if end >= first)


class TextStream:
    """The text of a generation, as it is verified: iterate it for pieces; `text` is all of it.
    `stops`: the StopStrings the generation was built with (its draft_limit hook)."""

    def __init__(self, generation, stops: StopStrings):
        self.generation, self.stops = generation, stops
        self.model, self.stop = stops.model, stops.stop
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.text = ""  # everything released so far

    def __iter__(self) -> Iterator[str]:
        pending = ""
        hold = max((len(s) for s in self.stop), default=0)
        for tok in self.generation:
            piece = self.model.token_to_piece(tok)
            pending += self._decoder.decode(piece)
            keep = 0
            if self.stop:
                self.stops.output(piece)
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
