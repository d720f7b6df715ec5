"""Cost of the sampled path per verified position at a 262k vocabulary (Gemma 3).

Per position the engine turns the target's logits into a distribution (penalties, top-k,
top-p, min-p, temperature) and picks the token. This script times exactly that on real
Gemma 3 270M logit rows, for several sampler settings, with the sampling module of this
tree and, with --baseline REV, with the one of git revision REV side by side (that
module's own API: `probs()` then `sample()` before keyed noise, `dist()` then
`sample(dist, pos)` after). Prints a table and writes JSON.

    python scripts/bench_sampling_cost.py --baseline e1b7f00 --out bench/sampling_cost.json

Timings are the best of --repeats passes over the rows (a shared machine: the minimum is
the least disturbed); name the machine when quoting them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "T0.7": dict(temperature=0.7),
    "T0.7 top-k 40": dict(temperature=0.7, top_k=40),
    "T1.0 top-p 0.95": dict(temperature=1.0, top_p=0.95),
    "T0.7 top-k 64 top-p 0.95": dict(temperature=0.7, top_k=64, top_p=0.95),
    "T0.8 min-p 0.05": dict(temperature=0.8, min_p=0.05),
    "T0.8 top-k 40 top-p 0.95 min-p 0.05 rep 1.1": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                                                       repeat_penalty=1.1),
}
PROMPT = "Once upon a time, in a village by the sea, there lived an old fisherman who"


def gemma_rows(n_rows: int) -> tuple[np.ndarray, list[int]]:
    """n_rows real logit rows of the embedded Gemma 3 270M (float32, as llama.cpp gives them)."""
    from specgguf.api import SpecGGUF

    with SpecGGUF(n_ctx=512) as llm:
        toks = llm.tokenize(PROMPT)
        cont = llm.generate(toks, max_tokens=n_rows).tokens
        seq = toks + cont
        ctx, batch = llm.target.ctx, llm.target.batch
        ctx.clear()
        batch.clear().add_tokens(seq, 0, "all")
        ctx.decode(batch)
        rows = np.stack([ctx.logits(len(toks) - 1 + i).copy() for i in range(n_rows)])
    return rows, seq


def baseline_module(rev: str):
    """specgguf's sampling module at git revision `rev`, imported as a package of its own."""
    tmp = Path(tempfile.mkdtemp(prefix="specgguf-baseline-"))
    pkg = tmp / "specgguf_baseline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("sampling", "errors", "noise"):
        try:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:specgguf/{name}.py"], check=True,
                                  capture_output=True, text=True).stdout
        except subprocess.CalledProcessError:
            continue
        (pkg / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("specgguf_baseline.sampling")


def per_position(mod, settings: dict, rows: np.ndarray, seq: list[int], repeats: int) -> float:
    """Best-of-`repeats` mean seconds to pick the token of one position from its logits."""
    sampler = mod.Sampler(mod.SamplingParams(seed=1, **settings))
    keyed = hasattr(sampler, "dist")
    recent = seq[:40]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i, row in enumerate(rows):
            if keyed:
                sampler.sample(sampler.dist(row, recent), 100 + i)
            else:
                sampler.sample(sampler.probs(row, recent))
        best = min(best, (time.perf_counter() - t0) / len(rows))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=None, help="git revision whose sampling module is timed beside this one")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    rows, seq = gemma_rows(args.rows)
    import specgguf.decoding.sampling as current

    mods = {"this tree": current}
    if args.baseline:
        mods = {f"baseline {args.baseline}": baseline_module(args.baseline), **mods}
    results = []
    print(f"sampled path per verified position, vocabulary {rows.shape[1]}, {platform.machine()} "
          f"({len(rows)} Gemma 3 270M rows, best of {args.repeats})")
    print("| settings | " + " | ".join(f"{m} (ms)" for m in mods) + (" | speedup |" if len(mods) > 1 else " |"))
    print("|---" * (len(mods) + 1 + (len(mods) > 1)) + "|")
    for name, settings in CONFIGS.items():
        ms = {m: 1e3 * per_position(mod, settings, rows, seq, args.repeats) for m, mod in mods.items()}
        vals = list(ms.values())
        line = f"| {name} | " + " | ".join(f"{v:.3f}" for v in vals)
        line += f" | {vals[0] / vals[-1]:.1f}x |" if len(vals) > 1 else " |"
        print(line)
        results.append({"settings": name, **{f"{m} ms": round(v, 4) for m, v in ms.items()}})
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"vocabulary": int(rows.shape[1]), "rows": len(rows), "machine": platform.machine(),
                                   "processor": platform.processor(), "results": results}, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
