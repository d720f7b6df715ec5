#!/usr/bin/env python3
"""Benchmark: what one step of a sequential draft costs in Python, back to back and after a
pause (issue 27; docs/loop.md §8).

A draft step of eagle3, mtp or a draft model runs a few Python operations between two
llama.cpp passes: build the one-entry batch (a token and a hidden-state row), read the logits
row, arg-max it (a 151936-token vocabulary here), read the next hidden-state row. Timed here
on the synthetic Qwen3-vocabulary target and EAGLE-3 draft of scripts/gpu_check.py (--small
shapes), each operation once per step, in four settings that differ only in what happens
between two steps:

  back-to-back   nothing (the operations' own cost, everything in the CPU caches)
  spin 3 ms      a Python loop reading the clock (the thread stays on its core, as a CUDA
                 synchronisation spins while the GPU runs a pass)
  sleep 3 ms     the thread sleeps (its core may run something else)
  draft decode   the draft's own llama_process on this CPU (what the CPU rehearsal of
                 gpu_check.sh measures)

The table shows how much of the Python time that scripts/gpu_check.sh --cpu reports per round
is the operations themselves and how much is their data and code fetched again after a pause.

    python scripts/bench_python_gap.py [--steps 300] [--out bench/python_gap.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import gpu_check  # noqa: E402  (the real-shaped synthetic models)

from specgguf.drafters import make_drafter  # noqa: E402
from specgguf.runtime.target import Target  # noqa: E402

OPS = ("batch", "logits", "argmax", "nextn")
GAP_S = 0.003


def measure(drafter, tokens, steps: int, between) -> dict:
    """us per operation, the mean over `steps` draft steps with `between(step)` before each."""
    ctx, b, width = drafter.ctx, drafter.batch, drafter.n_embd_dec
    pos = drafter.pending_pos
    ctx.seq_rm(pos)
    b.clear().add_embedding(drafter.pending_g, pos, True, token=tokens[-1])
    ctx.decode(b)
    state = ctx.embeddings_nextn_ith(0, width)  # a copy: the decode between two steps overwrites the buffer
    h, tok = state.ctypes.data, tokens[-1]
    spent = dict.fromkeys(OPS, 0.0)
    clock = time.perf_counter
    for step in range(steps):
        between(step)
        t0 = clock()
        b.clear().add_embedding_at(h, width, pos + 1, True, token=tok)  # as Eagle3Drafter.draft's steps
        t1 = clock()
        logits = ctx.logits(0)
        t2 = clock()
        tok = int(logits.argmax())
        t3 = clock()
        ctx.embeddings_nextn_addr(0)  # the next step would add this row
        t4 = clock()
        for op, dt in zip(OPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            spent[op] += dt
    return {op: 1e6 * s / steps for op, s in spent.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "bench" / "python_gap.json"))
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("error: --steps must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="specgguf-gap-"))
    try:
        tpath = gpu_check.write_target(work / "target.gguf", gpu_check.SMALL)
        epath = gpu_check.write_eagle3(work / "eagle3.gguf", gpu_check.SMALL)
        target = Target(tpath, n_ctx=2048)
        try:
            tokens = target.tokenize(gpu_check.PROMPT)
            drafter = make_drafter(str(epath), target, draft_max=8)
            try:
                gpu_check.run_ours(target, drafter, 8, tokens, 16)  # prompt in both caches, boundary set
                ctx, b = drafter.ctx, drafter.batch

                def spin(_):
                    t = time.perf_counter()
                    while time.perf_counter() - t < GAP_S:
                        pass

                def decode(_):  # the draft's own pass: one row at the next position, again and again
                    ctx.seq_rm(drafter.pending_pos + 1)
                    b.clear().add_embedding(drafter.pending_g, drafter.pending_pos + 1, True, token=tokens[-1])
                    ctx.decode(b)

                settings = {"back-to-back": lambda _: None, "spin 3 ms": spin,
                            "sleep 3 ms": lambda _: time.sleep(GAP_S), "draft decode": decode}
                measure(drafter, tokens, 20, settings["back-to-back"])  # warm
                rows = {name: measure(drafter, tokens, a.steps, fn) for name, fn in settings.items()}
            finally:
                drafter.close()
        finally:
            target.close()
    finally:
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load:.2f}; vocabulary "
          f"{gpu_check.N_VOCAB}, {a.steps} steps per setting; us per operation of one draft step\n")
    print("| between two steps | " + " | ".join(OPS) + " | step |")
    print("| --- |" + " ---: |" * (len(OPS) + 1))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[op]:.1f}" for op in OPS) + f" | {sum(r.values()):.1f} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"arch": platform.machine(), "cores": os.cpu_count(), "load": load},
                               "n_vocab": gpu_check.N_VOCAB, "steps": a.steps, "gap_s": GAP_S,
                               "us_per_op": rows}, indent=1))
    print(f"\nsaved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
