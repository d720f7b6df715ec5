#!/usr/bin/env python3
"""Benchmark: llama.cpp's backend sampling (an arg-max in the graph) against reading the logits
and arg-maxing them in numpy, on one target GGUF (issue 27; docs/loop.md §8).

A round's Python reads a 151936-float row per drafted or verified token; a greedy sampler in
the graph would hand back a token id instead. Two contexts on the same model see the same
tokens: one plain, one with a greedy chain (`Context.sample_in_graph`). Measured:

  one row    48 one-token passes (a sequential draft step): does the graph's token equal the
             logits' arg-max, and what a pass plus reading its token costs on each side (ms,
             median; on a GPU the read waits for the pass)
  block      a 17-token pass with every output (a verify at draft length 16, a DSpark block):
             the same two questions, median of 10

Run on any build (scripts/gpu_check.sh runs it in a child process, so that a llama.cpp abort
costs only this probe):

    python scripts/probe_backend_sampling.py TARGET.gguf [--gpu-layers 99] [--threads 8]
        [--out bench/backend_sampling.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specgguf.runtime import native  # noqa: E402

STEPS, BLOCK, REPEATS, PREFIX = 48, 17, 10, 32


def one_row(model, ctxs, batches, tokens) -> dict:
    plain, graph = ctxs
    times = {"logits": [], "graph": []}
    ids = {"logits": [], "graph": []}
    tok, pos = tokens[PREFIX], PREFIX
    for _ in range(STEPS):
        for name, ctx, b in (("logits", plain, batches[0]), ("graph", graph, batches[1])):
            b.clear().add_token(tok, pos, True)
            t0 = time.perf_counter()
            ctx.decode(b)
            got = int(ctx.logits(0).argmax()) if name == "logits" else ctx.sampled_token(0)
            times[name].append(time.perf_counter() - t0)
            ids[name].append(got)
        tok, pos = ids["logits"][-1], pos + 1  # both sides go on with the logits' token
    return _summary(ids, times)


def block(model, ctxs, batches, tokens) -> dict:
    plain, graph = ctxs
    times = {"logits": [], "graph": []}
    ids = {"logits": [], "graph": []}
    pos = PREFIX + STEPS  # one_row left positions 0 .. PREFIX + STEPS - 1 in both caches
    for _ in range(REPEATS):
        for name, ctx, b in (("logits", plain, batches[0]), ("graph", graph, batches[1])):
            ctx.seq_rm(pos)
            b.clear().add_tokens(tokens[:BLOCK], pos, "all")
            t0 = time.perf_counter()
            ctx.decode(b)
            if name == "logits":
                got = ctx.logits_block(BLOCK).argmax(axis=1).tolist()
            else:
                got = [ctx.sampled_token(i) for i in range(BLOCK)]
            times[name].append(time.perf_counter() - t0)
            ids[name] = got
    return _summary(ids, times)


def _summary(ids: dict, times: dict) -> dict:
    a, g = ids["logits"], ids["graph"]
    return {"equal": a == g, "mismatches": sum(x != y for x, y in zip(a, g)), "n": len(a),
            "first_ids": {"logits": a[:4], "graph": g[:4]},
            "logits_ms": 1e3 * statistics.median(times["logits"]), "graph_ms": 1e3 * statistics.median(times["graph"])}


def probe(path: str, gpu_layers: int, threads: int) -> dict:
    model = native.Model(path, n_gpu_layers=gpu_layers)
    try:
        rng = np.random.default_rng(0)
        tokens = [int(t) for t in rng.integers(16, model.n_vocab - 16, PREFIX + 1)]
        plain = native.Context(model, n_ctx=1024, n_batch=64, n_threads=threads)
        graph = native.Context(model, n_ctx=1024, n_batch=64, n_threads=threads, n_outputs_max_per_seq=64)
        graph.sample_in_graph(0)
        batches = [native.Batch(plain), native.Batch(graph)]
        for ctx, b in zip((plain, graph), batches):
            b.clear().add_tokens(tokens[:PREFIX], 0, "none")
            ctx.decode(b)
        out = {"model": Path(path).name, "n_vocab": model.n_vocab, "gpu_layers": gpu_layers, "threads": threads}
        for name, fn in (("one_row", one_row), ("block", block)):
            try:
                out[name] = fn(model, (plain, graph), batches, tokens)
            except Exception as exc:  # a refused pass is a finding, not a crash
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        return out
    finally:
        model.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "backend_sampling.json"))
    a = ap.parse_args()
    r = probe(a.target, a.gpu_layers, a.threads or native.default_threads())
    print(f"backend sampling on {r['model']} (vocabulary {r['n_vocab']}, {r['gpu_layers']} GPU layers)")
    print("| pass | ids equal | mismatches | logits + numpy arg-max ms | graph arg-max ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in ("one_row", "block"):
        x = r[name]
        if "error" in x:
            print(f"| {name} | refused: {x['error']} | | | |")
        else:
            print(f"| {name} | {'yes' if x['equal'] else 'no'} | {x['mismatches']}/{x['n']} | "
                  f"{x['logits_ms']:.2f} | {x['graph_ms']:.2f} |")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
