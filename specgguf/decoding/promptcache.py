"""The prompt cache: what a generation leaves in the caches serves the next one (docs/loop.md §7).

Two levels, as llama_cpp.Llama has them:
- the live context: the target's KV cache (and the draft's state) keep what the last
  generation read and wrote; the next generation keeps the longest common token prefix and
  decodes only the rest (`plan`);
- saved states (`StateCache`, optional, bounded in bytes): copies of the caches, taken when a
  prompt is about to cut what the live context holds, keyed by their tokens, so that
  alternating between long prompts (two documents, one system prompt for many users) does not
  re-read either.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def common_prefix(a: Sequence[int] | None, b: Sequence[int]) -> int:
    """The number of leading tokens a and b share (None shares nothing)."""
    if not a or not b:
        return 0
    n = min(len(a), len(b))
    if n < 64:
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    # long prompts: one vectorised comparison instead of a Python loop over 50k tokens
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


@dataclass
class SavedState:
    tokens: tuple[int, ...]  # what the caches held
    target: bytes  # the target's sequence state (KV cells)
    drafter: object  # the drafter that saved `draft` (its state fits no other)
    draft: object  # Drafter.save()'s object, or None: no draft state

    @property
    def nbytes(self) -> int:
        extra = 0
        d = self.draft
        for part in (d if isinstance(d, tuple) else (d,)):
            if isinstance(part, (bytes, bytearray)):
                extra += len(part)
            elif isinstance(part, np.ndarray):
                extra += part.nbytes
        return len(self.target) + extra + 8 * len(self.tokens)


class StateCache:
    """Saved cache states, least recently used first out, at most `capacity_bytes` in all.

    A state is found by the longest common prefix of its tokens with a new prompt; only a
    match longer than what the live context already shares is worth loading."""

    def __init__(self, capacity_bytes: int, min_tokens: int = 64):
        self.capacity_bytes, self.min_tokens = int(capacity_bytes), int(min_tokens)
        self._states: OrderedDict[tuple, SavedState] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._states)

    def best(self, tokens: Sequence[int]) -> tuple[SavedState | None, int]:
        """The saved state sharing the longest prefix with `tokens`, and that length."""
        with self._lock:
            best, best_n = None, 0
            for state in self._states.values():
                n = common_prefix(state.tokens, tokens)
                if n > best_n:
                    best, best_n = state, n
            if best is not None:
                self._states.move_to_end(best.tokens)
            return best, best_n

    def wants(self, tokens: Sequence[int]) -> bool:
        """Whether a state of these tokens is worth saving (long enough, not saved yet)."""
        return len(tokens) >= self.min_tokens and tuple(tokens) not in self._states

    def put(self, state: SavedState) -> bool:
        """Keep `state`, dropping the least recently used ones to stay within capacity;
        False when the state alone is larger than the capacity."""
        size = state.nbytes
        if size > self.capacity_bytes:
            return False
        with self._lock:
            old = self._states.pop(state.tokens, None)
            if old is not None:
                self.nbytes -= old.nbytes
            # a state whose tokens extend another's makes that one redundant
            for key in [k for k in self._states if len(k) <= len(state.tokens) and state.tokens[:len(k)] == k]:
                self.nbytes -= self._states.pop(key).nbytes
            while self._states and self.nbytes + size > self.capacity_bytes:
                _, dropped = self._states.popitem(last=False)
                self.nbytes -= dropped.nbytes
            self._states[state.tokens] = state
            self.nbytes += size
            return True

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self.nbytes = 0
