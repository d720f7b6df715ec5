"""Parallel sequences, the slots: each generation of a parallel target runs on a `Slot`, a view
of the target for one sequence id over the `SharedContext` (sharedctx.py, docs/loop.md §9).

The `SlotPool` hands a generation the free slot whose cache holds the longest prefix of its
prompt (the per-slot prompt cache), and waits while all are busy. Output is unchanged: each
row of a batch attends to its own sequence only, so on targets whose kernels are
batch-invariant (F32, or the batch-invariant mode) an answer is the one it gets alone; on
quantised targets with the default kernels a wider batch moves logits within the noise a
verify batch already has (docs/machines.md), and answers can part at a near-tie.
"""

from __future__ import annotations

import threading
import time

from ..errors import UserError
from .promptcache import PromptCache, common_prefix
from .sharedctx import PATIENCE_S, PendingRows, SeqContext, SharedContext


class Slot:
    """The target as one sequence sees it (engine.Engine takes it for a Target)."""

    def __init__(self, pool: "SlotPool", seq: int):
        target = pool.target
        self.pool, self.seq, self.parent = pool, seq, target
        self.ctx = SeqContext(pool.shared, seq, target.n_ctx)
        self.batch = PendingRows(target.ctx.n_batch)
        self.model, self.info = target.model, target.info
        self.n_threads, self.n_gpu_layers, self.rpc_servers = target.n_threads, target.n_gpu_layers, target.rpc_servers
        self.verify_width, self.batch_invariant = target.verify_width, target.batch_invariant
        # a cost profile of its own: a pass of R rows of several sequences costs more than one
        # sequence's verify pass of R rows (each row attends over the unified cache's cells of
        # all sequences, masked), so the two must not teach each other
        self.kernels = f"{target.kernels or 'default'}+parallel"
        self.seed_kernels = target.kernels  # ...which starts from the one-sequence profile
        # what this sequence's cells hold is its PromptCache's (decoding/promptcache.py)
        self.active = self.owner = None  # the generation holding the slot, and its thread
        self.last_used = 0.0

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.parent.tokenize(text, add_special)

    def acquire(self, generation) -> None:
        self.pool.claim(self, generation)

    def release(self) -> None:
        self.pool.free(self)


class SlotPool:
    """N slots on one multi-sequence Target; engines per slot, built by `make_engine(slot)`."""

    def __init__(self, target, make_engine, patience_s: float = PATIENCE_S):
        self.target, self.n = target, target.n_parallel
        if self.n < 2:
            raise UserError("a slot pool needs a target made with n_parallel >= 2")
        self.shared = SharedContext(target.ctx, target.batch, patience_s)
        self.slots = [Slot(self, seq) for seq in range(self.n)]
        self.engines = [make_engine(slot) for slot in self.slots]
        # one cost profile for all: the shared passes measure it (widths of all the rows)
        self.profile = self.engines[0].profile
        for engine in self.engines[1:]:
            if engine.profile is not None:
                engine.profile = self.profile
        if self.profile is not None:
            self.shared.on_pass = self._measured
        self._plain: list | None = None
        self._cond = threading.Condition()
        self._closed = False

    def _measured(self, rows: int, seconds: float, positions: list[int]) -> None:
        with self.profile.lock:
            self.profile.costs_for(sum(positions) // len(positions)).observe_verify(rows - 1, seconds)

    def plain_engines(self, make_plain):
        if self._plain is None:
            self._plain = [make_plain(slot) for slot in self.slots]
        return self._plain

    # -- choosing and holding slots -----------------------------------------------------------
    def choose(self, generation, engines) -> object:
        """The engine (of `engines`, one per slot) whose slot is free and holds the longest
        prefix of the generation's prompt; waits while none is free (asking `cancelled`)."""


        with self._cond:
            while True:
                if self._closed:
                    raise UserError("the model was closed: create a new one to generate again")
                free = [s for s in self.slots if s.active is None]
                if free:
                    body = generation.prompt[:-1]
                    best = max(free, key=lambda s: (common_prefix(PromptCache.of(s).tokens, body), -s.last_used))
                    best.active, best.owner = generation, threading.get_ident()
                    self.shared.join(best.seq)
                    return engines[best.seq]
                if generation.cancelled():
                    return None
                self._cond.wait(0.05)

    def claim(self, slot: Slot, generation) -> None:
        """Hold `slot` for `generation` (a no-op when choose() already did)."""
        with self._cond:
            if slot.active not in (None, generation) and slot.owner == threading.get_ident():
                from ..runtime.target import BusyError

                raise BusyError("this slot is already generating in this thread (an unfinished stream): finish or "
                                "close() that generation first")
            while slot.active is not None and slot.active is not generation:
                if self._closed:
                    raise UserError("the model was closed: create a new one to generate again")
                self._cond.wait(0.05)
            if self._closed:
                raise UserError("the model was closed: create a new one to generate again")
            if slot.active is None:
                slot.active, slot.owner = generation, threading.get_ident()
                self.shared.join(slot.seq)

    def free(self, slot: Slot) -> None:
        self.shared.leave(slot.seq)
        with self._cond:
            slot.active = slot.owner = None
            slot.last_used = time.monotonic()
            self._cond.notify_all()

    def busy(self) -> int:
        return sum(s.active is not None for s in self.slots)

    def reset(self) -> None:
        """Forget every slot's contents (each waits for its generation to end)."""
        for slot in self.slots:
            marker = object()
            self.claim(slot, marker)
            try:
                PromptCache.of(slot).clear()
            finally:
                self.free(slot)

    def close(self) -> None:
        """Refuse new generations, end this thread's unfinished ones (as Target.close does) and
        wait for the other threads' to end."""
        me = threading.get_ident()
        with self._cond:
            self._closed = True
            mine = [s.active for s in self.slots if s.active is not None and s.owner == me]
        for generation in mine:
            generation.close("cancelled")  # its cleanup frees the slot
        with self._cond:
            while any(s.active is not None for s in self.slots):
                self._cond.wait(0.05)
        self.shared.close()
