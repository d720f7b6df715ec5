"""Parallel sequences, the shared-context mechanics: N generations at once in one llama.cpp context, one target pass per round
for all of them (continuous batching; docs/loop.md §9).

Each generation runs on its own thread, in the same loop as a lone one (engine.Generation):
it drafts, asks for a verify pass, reads its rows and commits. What changes is underneath.
A `Slot` is a view of the target for one sequence id: its context view (`SeqContext`) names
that sequence in every KV call, its batch (`PendingRows`) only records the rows asked for,
and its `decode` hands them to the `SharedContext`, which waits until every active sequence
has asked (or for as long as that sequence usually takes to come back: PATIENCE_S), decodes
all the rows in one batch, and wakes each sequence with the offset of its rows. A sequence reads its logits
and says so (`outputs_read`) before the next pass may overwrite them. Sequences join at the
next pass and leave when they end: a request never waits for another one to finish.

Slots and their scheduling are `slots.py`'s.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref

from ..errors import LlamaError

# How long a pass waits for an active sequence that has not asked yet, counted from the end of
# the pass before: about three times what that sequence usually takes to come back (its Python
# between passes, ~0.3-1 ms of CPU, but the sequences take the GIL in turn and share the cores
# with llama.cpp's threads), at least PATIENCE_S, at most MAX_PATIENCE_S: one whose client reads
# slowly (a stream nobody iterates) is left for the next pass and costs the others that much.
PATIENCE_S = 0.004
MAX_PATIENCE_S = 0.025


class _Request:
    __slots__ = ("seq", "rows", "n_tokens", "n_outputs", "done", "error", "token_offset", "output_offset")

    def __init__(self, seq: int, rows):
        self.seq, self.rows = seq, rows
        self.n_tokens = sum(len(tokens) for tokens, _, _ in rows)
        self.n_outputs = sum(len(tokens) if outputs == "all" else 1 if outputs == "last" and tokens else 0
                             for tokens, _, outputs in rows)
        self.done, self.error = False, None
        self.token_offset = self.output_offset = 0


def _run_passes(jobs: queue.Queue) -> None:
    """The decode thread: one job (a pass, of the target or of a draft) after another, until None."""
    while True:
        job = jobs.get()
        if job is None:
            return
        fn, done, out = job
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the caller
            out.append(exc)
        del fn  # hold nothing between passes
        done.set()


class SharedContext:
    """One multi-sequence native.Context and its batch, shared by the threads of the slots."""

    def __init__(self, ctx, batch, patience_s: float = PATIENCE_S, wait_for_all: bool = True,
                 runner: "SharedContext | None" = None):
        """wait_for_all: a pass waits for every active sequence (the target's verify passes, which
        every round of every sequence asks for); False: a pass starts as soon as the context is free
        and takes whatever was asked meanwhile (a draft model's passes, which a sequence asks for
        only while it drafts). runner: run the passes on that SharedContext's decode thread."""
        self.ctx, self.batch, self.patience_s = ctx, batch, patience_s
        self.wait_for_all = wait_for_all
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._pass_end = 0.0
        self._return_s: dict[int, float] = {}  # per sequence: time from a pass's end to its next ask
        self._active: set[int] = set()  # sequences in a generation
        self._holders: set[int] = set()  # sequences still reading the last pass's outputs
        self._busy = False  # a pass, or a KV call, is running on the context
        self.passes = 0
        self.last_width = 0  # rows of the last pass (/metrics)
        # what each sequence put in its last pass (output rows) and commits per round (a moving
        # average): the rest of the batch, as one sequence's length chooser sees it
        self._rows: dict[int, int] = {}
        self._tokens: dict[int, float] = {}
        self._read_for: dict[tuple, set[int]] = {}  # what a pass extracts -> sequences whose drafters read it
        self._readers: set[int] = set()
        # on_pass(rows, seconds, positions): a pass whose rows all had outputs, timed (a verify
        # pass of that width, for the cost profile); None: not reported
        self.on_pass = None
        # Every pass runs on this one thread, whichever sequence leads it: llama.cpp's CPU
        # backend keeps an OpenMP thread team per calling thread, and teams of other threads
        # that idle beside the working one slow each pass by 10-25% on a small machine
        # (measured: one row 14 ms from a process's first calling thread, 16.5-18 ms from others)
        # (the thread holds the queue only: a model dropped without close() is still freed, and
        # its thread told to end)
        # A draft model's context shares its target's thread: one thread, one team, and never
        # two passes at once on the cores.
        self._owns_runner = runner is None
        if runner is not None:
            self._jobs, self._runner = runner._jobs, runner._runner
            return
        self._jobs: queue.Queue = queue.Queue()
        self._runner = threading.Thread(target=_run_passes, args=(self._jobs,), name="specgguf-decode", daemon=True)
        self._runner.start()
        weakref.finalize(self, self._jobs.put, None)

    def run(self, fn):
        """fn() on the decode thread; its result (a draft context's passes go through here:
        native.Context.runner)."""
        done, out = threading.Event(), []
        self._jobs.put((fn, done, out))
        done.wait()
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    def _decode_on_runner(self, batch) -> float:
        ctx = self.ctx

        def timed() -> float:
            t0 = time.perf_counter()
            ctx.decode(batch)
            return time.perf_counter() - t0

        return self.run(timed)

    def set_layer_input(self, seq: int, layer: int, on: bool) -> None:
        """A drafter of `seq` reads (on) or stops reading the inputs of target layer `layer`:
        llama.cpp extracts them while any sequence's drafter does, and a sequence that reads
        them holds every pass it was in, outputs or not, until it says it has read it."""
        self._read_by(seq, ("layer", layer), on, lambda wanted: self.ctx.set_layer_input(layer, wanted))

    def set_embeddings_nextn(self, seq: int, on: bool) -> None:
        """As set_layer_input, for the target's state after its final norm at every row (mtp)."""
        self._read_by(seq, ("nextn",), on, lambda wanted: self.ctx.set_embeddings_nextn(wanted, False))

    def _read_by(self, seq: int, what: tuple, on: bool, switch) -> None:
        with self._cond:
            users = self._read_for.setdefault(what, set())
            before = bool(users)
            (users.add if on else users.discard)(seq)
            self._readers = set().union(*self._read_for.values())
        if bool(users) != before:
            self.kv(switch, bool(users))

    def close(self) -> None:
        """Stop the decode thread (after the last pass), if this context started it."""
        if self._owns_runner and self._runner.is_alive():
            self._jobs.put(None)
            self._runner.join()

    # -- membership ---------------------------------------------------------------------------
    def join(self, seq: int) -> None:
        with self._cond:
            self._active.add(seq)

    def leave(self, seq: int) -> None:
        with self._cond:
            self._active.discard(seq)
            self._holders.discard(seq)
            self._rows.pop(seq, None)
            self._tokens.pop(seq, None)
            self._return_s.pop(seq, None)
            self._cond.notify_all()

    def outputs_read(self, seq: int, committed: int = 0) -> None:
        """`seq` is done with its outputs of the last pass, from which it committed `committed` tokens."""
        if committed:
            old = self._tokens.get(seq)
            self._tokens[seq] = committed if old is None else old + 0.25 * (committed - old)
        if seq in self._holders:
            with self._cond:
                self._holders.discard(seq)
                self._cond.notify_all()

    def others(self, seq: int) -> tuple[int, float]:
        """(output rows, tokens committed per round) of the other active sequences."""
        rows = tokens = 0
        for s in list(self._active):
            if s != seq:
                rows += self._rows.get(s, 1)
                tokens += self._tokens.get(s, 1.0)
        return rows, tokens

    @property
    def active(self) -> int:
        return len(self._active)

    # -- passes -------------------------------------------------------------------------------
    def decode(self, seq: int, rows) -> tuple[int, int]:
        """Decode `rows` ([(tokens, pos0, outputs)], one sequence's) in the next pass; returns
        (token offset, output offset) of the first row in that pass's batch."""
        req = _Request(seq, rows)
        if req.n_tokens > self.batch.capacity:
            raise LlamaError(f"{req.n_tokens} rows do not fit a batch of {self.batch.capacity}")
        with self._cond:
            self._holders.discard(seq)
            back = time.monotonic() - self._pass_end
            if back < MAX_PATIENCE_S:  # a stall (a client not reading) would teach it to wait long
                old = self._return_s.get(seq)
                self._return_s[seq] = back if old is None else old + 0.2 * (back - old)
            self._pending.append(req)
            self._cond.notify_all()
            while not req.done:
                wait = self._ready()
                if wait == 0.0:
                    self._lead()
                else:
                    self._cond.wait(wait)
        if req.error is not None:
            raise req.error
        return req.token_offset, req.output_offset

    def _ready(self) -> float | None:
        """0: a pass may start now; else how long to wait (None: until notified)."""
        if self._busy or self._holders or not self._pending:
            return None
        if not self.wait_for_all:
            return 0.0
        asked = {r.seq for r in self._pending}
        missing = self._active - asked
        if not missing:
            return 0.0
        wait = max(min(max(3 * self._return_s.get(s, 0.0), self.patience_s), MAX_PATIENCE_S) for s in missing)
        left = self._pass_end + wait - time.monotonic()
        return 0.0 if left <= 0 else left

    def _lead(self) -> None:
        """Run one pass (called with the lock held; released while llama.cpp runs)."""
        taken, n = [], 0
        for r in self._pending:
            if n + r.n_tokens > self.batch.capacity:
                break
            taken.append(r)
            n += r.n_tokens
        self._pending = self._pending[len(taken):]
        self._busy = True
        self._cond.release()
        error, seconds = None, 0.0
        try:
            batch = self.batch.clear()
            tokens = outputs = 0
            for r in taken:
                r.token_offset, r.output_offset = tokens, outputs
                for toks, pos0, outs in r.rows:
                    batch.add_tokens(toks, pos0, outs, seq=r.seq)
                tokens, outputs = tokens + r.n_tokens, outputs + r.n_outputs
            seconds = self._decode_on_runner(batch)
        except BaseException as exc:  # every sequence of the pass hears of it
            error = exc
        finally:
            self._cond.acquire()
        for r in taken:
            if r.n_outputs:
                self._rows[r.seq] = r.n_outputs
        if error is None and outputs == n and self.on_pass is not None and not self.ctx.cold:
            try:
                self.on_pass(n, seconds, [pos0 for r in taken for _, pos0, _ in r.rows])
            except Exception:  # a cost profile is an optimisation: never fail a pass for it
                pass
        self._busy = False
        self._pass_end = time.monotonic()
        self.passes += 1
        self.last_width = n
        for r in taken:
            r.done, r.error = True, error
            if error is None and (r.n_outputs or r.seq in self._readers):
                self._holders.add(r.seq)
        self._cond.notify_all()

    def kv(self, fn, *args):
        """Run a KV call (seq_rm, state copy, ...) while no pass runs."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            self._busy = True
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class PendingRows:
    """A slot's batch: the engine fills it as it fills a native.Batch; decode hands it over."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.rows: list = []
        self.n_tokens = self.n_outputs = 0

    def clear(self) -> "PendingRows":
        self.rows = []
        self.n_tokens = self.n_outputs = 0
        return self

    def add_token(self, token: int, pos: int, output: bool = False) -> None:
        self.add_tokens([token], pos, "last" if output else "none")

    def add_tokens(self, tokens, pos0: int, outputs: str = "none") -> None:
        self.rows.append((list(tokens), pos0, outputs))
        self.n_tokens += len(tokens)
        self.n_outputs += len(tokens) if outputs == "all" else 1 if outputs == "last" and tokens else 0


class SeqContext:
    """native.Context's interface for one sequence of a shared context (what the engine calls)."""

    def __init__(self, shared: SharedContext, seq: int, n_ctx: int):
        self.shared, self.seq, self.n_ctx = shared, seq, n_ctx
        ctx = shared.ctx
        self.model, self.n_batch, self.n_ubatch, self.n_vocab = ctx.model, ctx.n_batch, ctx.n_ubatch, ctx.n_vocab
        self._tokens = self._outputs = 0

    @property
    def closed(self) -> bool:
        return self.shared.ctx.closed

    @property
    def native(self):
        """The shared native.Context (a draft context's ctx_other: the target's weights)."""
        return self.shared.ctx

    def set_layer_input(self, layer: int, on: bool) -> None:
        self.shared.set_layer_input(self.seq, layer, on)

    def set_embeddings_nextn(self, on: bool, masked: bool = False) -> None:
        if masked:
            raise ValueError("a shared target extracts its nextn state at every row (unmasked) only")
        self.shared.set_embeddings_nextn(self.seq, on)

    def embeddings_nextn(self, n_rows: int, width: int, copy: bool = True):
        """This sequence's rows of the last pass's nextn states (read before outputs_read)."""
        t = self._tokens
        rows = self.shared.ctx.embeddings_nextn(t + n_rows, width, copy=False)[t:]
        return rows.copy() if copy else rows

    def layer_input_view(self, layer: int, n_rows: int):
        """This sequence's rows of the last pass's inputs of `layer` (read before outputs_read)."""
        t = self._tokens
        return self.shared.ctx.layer_input_view(layer, t + n_rows)[t:]

    @property
    def cold(self) -> bool:
        return self.shared.ctx.cold

    def decode(self, batch: PendingRows) -> None:
        self._tokens, self._outputs = self.shared.decode(self.seq, batch.rows)
        self.shared.ctx.note_pass(self.seq, batch.n_tokens)  # how far back its snapshots reach

    def outputs_read(self, committed: int = 0) -> None:
        self.shared.outputs_read(self.seq, committed)

    def batch_others(self) -> tuple[int, float]:
        """(rows, tokens per round) the other sequences bring to a pass (tuning.best_prefix)."""
        return self.shared.others(self.seq)

    def logits(self, i: int):
        return self.shared.ctx.logits(self._tokens + i)

    def argmax(self, i: int) -> int:
        return int(self.logits(i).argmax())

    def logits_block(self, n_rows: int):
        o = self._outputs
        return self.shared.ctx.logits_block(o + n_rows)[o:]

    def synchronize(self) -> None:
        pass

    def seq_rm(self, p0: int, p1: int = -1) -> None:
        self.shared.kv(self.shared.ctx.seq_rm, p0, p1, self.seq)

    def try_seq_rm(self, p0: int) -> bool:
        return self.shared.kv(self.shared.ctx.try_seq_rm, p0, self.seq)

    def pos_max(self) -> int:
        return self.shared.kv(self.shared.ctx.pos_max, self.seq)

    def pos_min(self) -> int:
        return self.shared.kv(self.shared.ctx.pos_min, self.seq)

    def can_resume_at(self, n: int) -> bool:
        return self.shared.kv(self.shared.ctx.can_resume_at, n, self.seq)

    def state_bytes(self) -> bytes:
        return self.shared.kv(self.shared.ctx.state_bytes, self.seq)

    @property
    def rollback(self) -> str:
        return self.shared.ctx.rollback

    @property
    def n_rs_seq(self) -> int:
        return self.shared.ctx.n_rs_seq

    def partial_state_bytes(self) -> bytes:
        return self.shared.kv(self.shared.ctx.partial_state_bytes, self.seq)

    def load_partial_state_bytes(self, data: bytes) -> None:
        self.shared.kv(self.shared.ctx.load_partial_state_bytes, data, self.seq)

    def load_state_bytes(self, data: bytes) -> None:
        self.shared.kv(self.shared.ctx.load_state_bytes, data, self.seq)

    def clear(self) -> None:
        self.shared.kv(self.shared.ctx.clear, self.seq)
