"""Where a round's Python time goes: an optional per-phase clock for the loop (issue 27).

`Engine.generate(..., trace=RoundTrace())` (scripts/gpu_check.py --trace) makes `engine._rounds` call
`mark(phase)` at the end of each phase of every round; without a trace the loop pays one
`is not None` test per phase. Phases, in round order:

    draft        the drafter's draft() (its own Python: batches, arg-maxes, lookups), the
                 engine's cuts (grammar, stop strings, auto lengths), drafter.rollback(pos0)
    batch        building the verify batch [id_last, d1..dn]
    decode       the ctypes call around llama_process for the verify batch
    logits       reaching the verify logits (a view of llama.cpp's buffer)
    verify       acceptance: arg-maxes (or sampling) and the comparison with the draft
    process      on_verified, the drafter's catch-up on the verified batch (hidden states
                 handed over, injected or encoded), accept(k), rollback
    bookkeeping  seq_rm of the target, statistics, auto-length records, the history, the
                 yield of each token to the caller and the checks before the next round

Each phase is measured twice: wall time (`time.perf_counter`) and CPU time of the calling
thread (`time.thread_time`). Time inside llama_process (every context: the target's verify
pass and whatever the drafter decodes) is not Python and is taken out of the phase it falls
in and kept apart as `llama`. On a shared machine wall time also counts the moments the
thread waited for a core; thread CPU time does not, so it is the better measure of the
Python cost there (it still includes the kernel's side of the ctypes calls and page faults).
A mark costs two clock reads (about 1 us together on Linux, `overhead_us`), counted in the
phase it ends.
"""

from __future__ import annotations

import time

PHASES = ("draft", "batch", "decode", "logits", "verify", "process", "bookkeeping")


class RoundTrace:
    def __init__(self):
        self.wall = dict.fromkeys(PHASES, 0.0)
        self.cpu = dict.fromkeys(PHASES, 0.0)
        self.llama_wall = self.llama_cpu = 0.0  # inside llama_process, every context
        self.llama_calls = 0
        self.rounds = 0
        self._w = self._c = None
        self._lw = self._lc = 0.0

    # -- the loop's side --------------------------------------------------------------
    def start(self) -> None:
        self._w, self._c = time.perf_counter(), time.thread_time()
        self._lw, self._lc = self.llama_wall, self.llama_cpu

    def mark(self, phase: str) -> None:
        w, c = time.perf_counter(), time.thread_time()
        if self._w is not None:
            lw, lc = self.llama_wall, self.llama_cpu
            self.wall[phase] += (w - self._w) - (lw - self._lw)
            self.cpu[phase] += (c - self._c) - (lc - self._lc)
            self._lw, self._lc = lw, lc
        if phase == "draft":
            self.rounds += 1
        self._w, self._c = w, c

    def stop(self) -> None:
        """The time since the last mark goes to bookkeeping; marks after stop() start afresh."""
        self.mark("bookkeeping")
        self._w = None

    # -- llama_process, timed by `timing_process` -----------------------------------------
    def process_timed(self, dw: float, dc: float) -> None:
        self.llama_wall += dw
        self.llama_cpu += dc
        self.llama_calls += 1

    # -- results ----------------------------------------------------------------------
    def per_round_us(self) -> dict:
        """{'wall': {phase: us per round, ..., 'python': sum}, 'cpu': {...}, 'llama_wall_us',
        'llama_calls', 'rounds', 'overhead_us'}."""
        n = max(self.rounds, 1)
        out = {"rounds": self.rounds, "llama_calls_per_round": self.llama_calls / n,
               "llama_wall_us": 1e6 * self.llama_wall / n, "llama_cpu_us": 1e6 * self.llama_cpu / n,
               "overhead_us": len(PHASES) * clock_cost_us()}
        for name, table in (("wall", self.wall), ("cpu", self.cpu)):
            per = {p: 1e6 * table[p] / n for p in PHASES}
            per["python"] = sum(per.values())
            out[name] = per
        return out


def timing_process(native_context_cls, trace: RoundTrace):
    """A context manager that times every `_process` (llama_process) of `native_context_cls`
    into `trace` while it is open."""
    from contextlib import contextmanager

    @contextmanager
    def cm():
        orig = native_context_cls._process

        def timed(ctx, kind, batch):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return orig(ctx, kind, batch)
            finally:
                trace.process_timed(time.perf_counter() - w, time.thread_time() - c)

        native_context_cls._process = timed
        try:
            yield trace
        finally:
            native_context_cls._process = orig

    return cm()


_CLOCK_US = None


def clock_cost_us() -> float:
    """What one mark's two clock reads cost here, in us (measured once)."""
    global _CLOCK_US
    if _CLOCK_US is None:
        n = 2000
        t0 = time.thread_time()
        for _ in range(n):
            time.perf_counter()
            time.thread_time()
        _CLOCK_US = 1e6 * (time.thread_time() - t0) / n
    return _CLOCK_US
