"""The batch-invariant mode: verify batches whose logits do not depend on how wide they are.

On a quantised CPU target a position's logits differ in the last bits (up to half a logit)
between a one-token decode and a verify batch of w rows, because ggml picks kernels by the
number of rows (docs/machines.md, "Batch invariance"). In this mode the target runs with
ggml's reference CPU kernels (native.reference_cpu_kernels), flash attention on (its vector path has
no per-width switch, and its split-KV decode is off under the reference flag), and weights
outside the repack buffers (whose gemm takes rows in fours). What is left is measured, not
assumed: `verify_width` decodes positions of a fixed text one at a time and as batches of the
widths below, past 512 cells of context, and returns the widest batch that gave one-token
decoding's logits bit for bit at every sampled width up to it. The engine never verifies a
wider batch. The answer is cached per library, model file and thread count.

Known not to hold: matrices stored as F32, F16 or BF16 (and any type llamafile's sgemm takes)
go through sgemm from 2 rows, which the reference flag does not reach; such a target measures
width 1, and the mode then refuses to draft on it.
"""

from __future__ import annotations

import os

import numpy as np

from . import native
from .paths import cache_dir, read_json, write_json

# every row count at which a ggml kernel choice is known to switch, and either side of it:
# 2 (sgemm), 4 (repack groups), 8 (tiled K-quants), 16/32 (tiles), 64 (flash attention's tiled path)
PROBE_WIDTHS = (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65)
PROBE_DEPTH = 520  # past 512 cells, where flash attention splits a one-token decode
PROBE_TEXT = ("The river rose in the night and by morning the lower fields were under water. The farmers "
              "moved the animals to the barn on the hill, counted them twice, and went back for the tools. "
              "Letters 4017, 88 and 2.5: [a, b] {c} <d> 'e' \"f\" - x*y + z = 12; ")
CACHE_VERSION = 1


def _identity(path: str) -> list:
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, int(st.st_mtime)]


def cache_key(model_path: str, n_threads: int, depth: int) -> str:
    return repr([CACHE_VERSION, _identity(native.library_path()), _identity(model_path), n_threads, depth])


def compare_widths(ctx: "native.Context", batch: "native.Batch", tokens: list[int], depth: int,
                   widths) -> dict:
    """With tokens[:depth] in the context: positions depth.. decoded one token at a time (plain
    decoding) and, afresh, as one batch of each width (a verify round). Per width: the largest
    |difference| of any logit, the rows that differ in any bit, the rows whose arg-max moved.
    Leaves the context empty. scripts/width_invariance.py prints the same for any setting."""
    wmax = max(widths)
    try:
        ctx.clear()
        for start in range(0, depth, ctx.n_batch):
            batch.clear().add_tokens(tokens[start:min(start + ctx.n_batch, depth)], start, "none")
            ctx.decode(batch)
        # a recurrent state goes back to depth only from a checkpoint (decoding/rollback.py)
        saved = ctx.partial_state_bytes() if ctx.rollback != "trim" else None
        ref = np.empty((wmax, ctx.n_vocab), dtype=np.float32)
        for i in range(wmax):
            batch.clear().add_tokens([tokens[depth + i]], depth + i, "all")
            ctx.decode(batch)
            ref[i] = ctx.logits_block(1)[0]
        rows = {}
        for w in widths:
            if saved is not None:
                ctx.load_partial_state_bytes(saved)
            ctx.seq_rm(depth)
            batch.clear().add_tokens(tokens[depth:depth + w], depth, "all")
            ctx.decode(batch)
            got = ctx.logits_block(w)
            diff = np.abs(got - ref[:w])
            rows[w] = {"max_abs_diff": float(diff.max()), "rows_differing": int((diff.max(axis=1) > 0).sum()),
                       "argmax_moves": int((got.argmax(axis=1) != ref[:w].argmax(axis=1)).sum())}
    finally:
        ctx.clear()
    return rows


def measure(ctx: "native.Context", batch: "native.Batch", model: "native.Model", depth: int,
            widths=PROBE_WIDTHS) -> dict:
    """Per probed width: how many rows differ from one-token decoding in any bit (PROBE_TEXT)."""
    need = depth + max(widths)
    tokens = model.tokenize(PROBE_TEXT * (1 + need // 20), add_special=True)[:need]
    if len(tokens) < need:  # a tokenizer that merges the whole text: vary it
        tokens = (tokens * (1 + need // max(len(tokens), 1)))[:need]
    return {w: r["rows_differing"] for w, r in compare_widths(ctx, batch, tokens, depth, widths).items()}


def widest_exact(differing: dict) -> int:
    """The widest probed width such that every probed width up to it was exact (1: none)."""
    best = 1
    for w in sorted(differing):
        if differing[w]:
            break
        best = w
    return best


def verify_width(target) -> int:
    """The widest verify batch that computes one-token decoding's logits on `target` (a
    runtime.target.Target loaded in the batch-invariant mode): cached, else measured now."""
    ctx = target.ctx
    depth = max(0, min(PROBE_DEPTH, ctx.n_ctx - max(PROBE_WIDTHS)))
    widths = [w for w in PROBE_WIDTHS if depth + w <= ctx.n_ctx]  # a tiny context verifies narrow batches
    if not widths:
        return 1
    key = cache_key(target.info.path, target.n_threads, depth)
    path = cache_dir() / "batch_invariance.json"
    known = read_json(path)
    if isinstance(known.get(key), int):
        return known[key]
    # the probe uses the context before any generation (Target's constructor): the prompt cache
    # has nothing to forget yet, and checks the context's length before it trusts it anyway
    width = widest_exact(measure(ctx, target.batch, target.model, depth, widths))
    known = read_json(path)
    known[key] = width
    write_json(path, known)
    return width
