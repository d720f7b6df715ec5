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
import weakref
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


# the live context keeps a common prefix from this length on: a shorter one costs next to
# nothing to read again, and reading it afresh splits the prompt into batches exactly as a
# new instance does (on quantised CPU targets the split can move the last bits, docs/loop.md §6.4)
MIN_REUSE = 32
# recurrent-state checkpoints a target keeps at prompt boundaries (one state each: for a 27B
# gated-DeltaNet hybrid some tens of MB, for LFM2's short convolutions well under one)
MAX_CHECKPOINTS = 4

_OWNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class PromptCache:
    """What one target's context (a `Target`, or one sequence's `Slot`) and its drafters' states
    hold between generations, and the only writer of it.

    `tokens`: the tokens the target's cache holds (None: unknown; the next generation starts
    afresh). Each drafter that ran on this target holds tokens of its own (`held`), equal to
    the target's after a generation that used it, stale after one that did not (a plain run
    between two drafted ones). `states`: the saved states (`StateCache`) or None.
    One per target: `PromptCache.of(target)`."""

    def __init__(self, target):
        self.target = target
        self.tokens: list[int] | None = None
        self.states: StateCache | None = None
        # a recurrent target's state cannot be cut at any token: its states after recent prompts
        # ((tokens, partial state)), newest last, let a prompt that shares one go on from there
        self._checkpoints: list[tuple[tuple[int, ...], bytes]] = []
        self._drafts: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, target) -> "PromptCache":
        cache = _OWNERS.get(target)
        if cache is None:
            cache = _OWNERS[target] = cls(target)
        return cache

    def held(self, drafter) -> list[int] | None:
        """The tokens `drafter`'s state holds (None: unknown)."""
        return None if drafter is None else self._drafts.get(drafter)

    def forget(self, drafter=None) -> None:
        """Nothing is known of the target's cache (and `drafter`'s): the next generation reads its
        whole prompt."""
        self.tokens = None
        if drafter is not None:
            self._drafts.pop(drafter, None)

    def forget_drafts(self) -> None:
        """Nothing is known of any drafter's state (the target's cache was cleared)."""
        self._drafts.clear()

    def commit(self, tokens, drafter=None) -> None:
        """After a generation: the target's cache and `drafter`'s state hold `tokens` (None:
        unknown, start afresh)."""
        self.tokens = None if tokens is None else list(tokens)
        if drafter is not None:
            if tokens is None:
                self._drafts.pop(drafter, None)
            else:
                self._drafts[drafter] = list(tokens)

    # -- a new generation: what it can keep -----------------------------------------------
    def reuse(self, body: list[int], drafter=None) -> int:
        """Keep the longest common prefix of `body` with what the caches hold (or with a saved
        state, when that shares more), trim the rest, and return how many tokens are kept.
        The drafter keeps what it can (Drafter.resume); one that reads the target's passes
        holds the target back to what it kept, any other catches up on its own."""
        ctx = self.target.ctx
        if self.tokens is not None and ctx.pos_max() + 1 != len(self.tokens):
            self.tokens = None  # the context was used behind this owner's back: trust nothing
        n = common_prefix(self.tokens, body)
        if n < MIN_REUSE:
            n = 0
        if self.states is not None:
            if self.tokens is not None and n < len(self.tokens) - MIN_REUSE:
                # the live state is about to be cut: keep a copy first (a chat that goes on
                # never pays for one; switching conversations pays one copy)
                self.save(self.tokens, drafter)
            saved, n_saved = self.states.best(body)
            if saved is not None and n_saved > n and n_saved >= MIN_REUSE:
                self.restore(saved, drafter)
                n = n_saved
        self.tokens = None  # until the caches are consistent again (commit)
        n_draft = 0
        if drafter is not None:
            kept = self._drafts.pop(drafter, None)
            n_draft = drafter.resume(min(common_prefix(kept, body), n))
            if drafter.reads_target:
                n = min(n, n_draft)
        if n > 0 and not (ctx.can_resume_at(n) and ctx.try_seq_rm(n)):
            n = self._resume_checkpoint(body, n)  # 0: a sliding-window cache that cannot go back that far
        if n == 0:
            ctx.clear()
        if drafter is not None:
            if n_draft > n:
                n_draft = drafter.resume(n)
                if drafter.reads_target and n_draft < n:
                    # back at a recurrent checkpoint, the drafter wants target rows before it
                    # (eagle3 goes back one more), which no pass can give now: read afresh
                    ctx.clear()
                    n = n_draft = drafter.resume(0)
            if n_draft < n:  # a draft model's own cache catches up without the target
                drafter.process(body[n_draft:n], n_draft)
        return n

    def checkpoint(self, tokens) -> None:
        """The target's cache holds `tokens` (a prompt, read): keep its recurrent state for a later
        prompt that shares them (llama-server's context checkpoints; nothing for a KV-only cache)."""
        ctx = self.target.ctx
        if ctx.rollback == "trim" or len(tokens) < MIN_REUSE:
            return
        key = tuple(tokens)
        self._checkpoints = [c for c in self._checkpoints if c[0] != key][-(MAX_CHECKPOINTS - 1):]
        self._checkpoints.append((key, ctx.partial_state_bytes()))

    def _resume_checkpoint(self, body, n: int) -> int:
        """Go back to the longest checkpoint of the first `n` tokens of `body` (which the cache
        holds); the number of tokens kept (0: none fits)."""
        ctx = self.target.ctx
        best = None
        for key, data in self._checkpoints:
            m = len(key)
            if MIN_REUSE <= m <= n and (best is None or m > len(best[0])) and tuple(body[:m]) == key:
                best = (key, data)
        if best is None:
            return 0
        ctx.load_partial_state_bytes(best[1])
        ctx.seq_rm(len(best[0]))  # the attention cells past it
        return len(best[0])

    def restore(self, saved: SavedState, drafter=None) -> None:
        """Load a saved state into the target (and the drafter, when it saved it; else the
        drafter's state is unknown)."""
        self.tokens = None
        self.target.ctx.load_state_bytes(saved.target)
        self.tokens = list(saved.tokens)
        if drafter is not None:
            self._drafts.pop(drafter, None)
            if saved.drafter is drafter and saved.draft is not None and drafter.restore(saved.draft):
                self._drafts[drafter] = list(saved.tokens)

    def save(self, tokens, drafter=None) -> None:
        """Keep a copy of the caches' state for a later prompt that shares these tokens."""
        from ..errors import LlamaError

        states = self.states
        if states is None or not states.wants(tokens):
            return
        if drafter is not None and self._drafts.get(drafter) != list(tokens):
            drafter = None  # its state is of other tokens (a plain run came between): the target's alone
        try:
            state = SavedState(tuple(tokens), self.target.ctx.state_bytes(), drafter,
                               drafter.save() if drafter is not None else None)
        except LlamaError:
            return  # the cache is an optimisation: a state llama.cpp cannot copy is not kept
        states.put(state)

    # -- SpecGGUF.save_state / load_state ------------------------------------------------
    def snapshot(self, drafter=None) -> SavedState:
        """The caches' state after the last generation, for `load` (llama_cpp.Llama.save_state)."""
        tokens = self.tokens or []
        draft = drafter.save() if drafter is not None and self._drafts.get(drafter) == tokens else None
        return SavedState(tuple(tokens), self.target.ctx.state_bytes() if tokens else b"", drafter, draft)

    def load(self, state: SavedState, drafter=None) -> None:
        """Put back a state from `snapshot`: the next prompt that shares its tokens reads only the rest."""
        self.forget(drafter)
        if not state.tokens:
            self.target.ctx.clear()
            return
        self.target.ctx.load_state_bytes(state.target)
        self.tokens = list(state.tokens)
        if drafter is not None:
            if state.drafter is drafter and state.draft is not None and drafter.restore(state.draft):
                self._drafts[drafter] = list(state.tokens)
            else:
                drafter.reset()

    def clear(self) -> None:
        """Empty the target's cache: nothing is held by it or by any drafter (saved states stay)."""
        self.target.ctx.clear()
        self.tokens = None
        self._checkpoints = []
        self._drafts.clear()
