#!/usr/bin/env python3
"""Does a verify batch compute a position's logits bit for bit as a one-token decode does?

For each model, build setting and context depth: the context is filled with `depth` tokens,
then positions depth .. depth+63 are decoded one token at a time (what plain decoding does)
and, afresh, as one batch of width w = 2 .. 64 with logits for every row (what a verify round
of w-1 drafts does). Per width: the largest |difference| of any logit, how many of the w rows
differ in any bit, and in how many the arg-max (greedy's token) moves. Each setting runs in
its own process, since ggml reads its switches (GGML_CPU_TILED_MM...) once per process.

    python scripts/width_invariance.py [--models gemma,smollm2] [--depths 16,600]
        [--settings default,no-repack,no-repack+no-tiled,no-repack+tiled-forced,fa-on] [--widths 2-64]
        [--out bench/width_invariance.json]

Settings (docs/machines.md, "Batch invariance"):
  default                 specgguf's: CPU repack buffers on, flash attention off
  no-repack               use_extra_bufts=false: no CPU repack (the AMX fallback's loading)
  no-repack+no-tiled      and GGML_CPU_TILED_MM=0: no tiled K-quant matmul (taken at >= 8 rows)
  no-repack+tiled-forced  and GGML_CPU_TILED_MM_FORCE=1: the tiled K-quant matmul at every width
  fa-on                   flash attention on (split-KV single-token decode past 512 cells)
  fa-on+no-repack+no-tiled
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("The river rose in the night and by morning the lower fields were under water. The farmers "
        "moved the animals to the barn on the hill, counted them twice, and went back for the tools. ")

SETTINGS = {
    "default": {"extra_bufts": True, "flash_attn": 0, "env": {}},
    "no-repack": {"extra_bufts": False, "flash_attn": 0, "env": {}},
    "no-tiled": {"extra_bufts": True, "flash_attn": 0, "env": {"GGML_CPU_TILED_MM": "0"}},
    "no-repack+no-tiled": {"extra_bufts": False, "flash_attn": 0, "env": {"GGML_CPU_TILED_MM": "0"}},
    "no-repack+tiled-forced": {"extra_bufts": False, "flash_attn": 0, "env": {"GGML_CPU_TILED_MM_FORCE": "1"}},
    "fa-on": {"extra_bufts": True, "flash_attn": 1, "env": {}},
    "fa-on+no-repack+no-tiled": {"extra_bufts": False, "flash_attn": 1, "env": {"GGML_CPU_TILED_MM": "0"}},
    "ref": {"extra_bufts": False, "flash_attn": 1, "env": {}, "ref": True},
    "ref+fa-off": {"extra_bufts": False, "flash_attn": 0, "env": {}, "ref": True},
}


def model_path(name: str) -> str:
    from specgguf.runtime.defaults import default_chat_target, default_target

    known = {"gemma": default_target, "smollm2": default_chat_target}
    return str(known[name]()) if name in known else name


def measure(path: str, setting: dict, depth: int, widths: list[int]) -> dict:
    """One process, one setting: per width, (max |diff|, rows differing, arg-max moves)."""
    from specgguf.runtime import native
    from specgguf.runtime.invariance import compare_widths

    wmax = max(widths)
    model = native.Model(path, extra_bufts=setting["extra_bufts"])
    ctx = native.Context(model, n_ctx=depth + wmax + 64, n_batch=512, flash_attn=setting["flash_attn"],
                         reference_kernels=setting.get("ref", False))
    batch = native.Batch(ctx)
    tokens = model.tokenize(TEXT * (1 + (depth + wmax) // 30), add_special=True)[:depth + wmax]
    if len(tokens) < depth + wmax:
        raise SystemExit(f"{path}: the text gives only {len(tokens)} tokens")

    t0 = time.perf_counter()
    rows = compare_widths(ctx, batch, tokens, depth, widths)
    elapsed = time.perf_counter() - t0
    del batch, ctx, model
    return {"seconds": round(elapsed, 2), "widths": rows}


def invariant_up_to(widths: dict) -> int:
    """The largest w such that every measured width up to w gave width 1's bits."""
    best = 1
    for w in sorted(widths, key=int):
        if widths[w]["rows_differing"]:
            break
        best = int(w)
    return best


def parse_widths(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    if not out or min(out) < 2 or max(out) > 512:
        raise SystemExit(f"--widths: widths within 2..512, e.g. 2-64 (got {text!r})")
    return sorted(set(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gemma,smollm2", help="gemma, smollm2 or GGUF paths, comma-separated")
    ap.add_argument("--depths", default="16,600", help="tokens in the context before the compared positions")
    ap.add_argument("--settings", default="default,no-repack,no-repack+no-tiled,no-repack+tiled-forced,fa-on")
    ap.add_argument("--widths", default="2-64")
    ap.add_argument("--out", default="bench/width_invariance.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one measurement in this process: its environment is the setting's
        job = json.loads(args.child)
        print(json.dumps(measure(job["path"], SETTINGS[job["setting"]], job["depth"], job["widths"])))
        return 0
    widths = parse_widths(args.widths)
    settings = args.settings.split(",")
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    depths = [int(d) for d in args.depths.split(",")]
    from specgguf.runtime import native

    result = {"library": native.library_path(), "system_info": native.system_info() if hasattr(native, "system_info")
              else None, "cpu_count": os.cpu_count(), "runs": []}
    for name in args.models.split(","):
        path = model_path(name)
        for depth in depths:
            table = {}
            for setting in settings:
                env = dict(os.environ, **SETTINGS[setting]["env"])
                job = json.dumps({"path": path, "setting": setting, "depth": depth, "widths": widths})
                proc = subprocess.run([sys.executable, __file__, "--child", job], capture_output=True, text=True,
                                      env=env, cwd=ROOT, timeout=1800)
                if proc.returncode != 0:
                    raise SystemExit(f"{name} {setting} depth {depth}: exit {proc.returncode}: {proc.stderr[-600:]}")
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                table[setting] = run
                result["runs"].append({"model": name, "path": Path(path).name, "depth": depth, "setting": setting,
                                       "invariant_up_to": invariant_up_to(run["widths"]), **run})
            print(f"\n{name} ({Path(path).name}), {depth} tokens of context: max |diff| / rows differing "
                  f"(arg-max moves) vs one-token decoding")
            print(f"{'width':>5} " + " ".join(f"{s:>24}" for s in settings))
            for w in widths:
                cells = []
                for s in settings:
                    r = table[s]["widths"][str(w)] if str(w) in table[s]["widths"] else table[s]["widths"][w]
                    cells.append(f"{r['max_abs_diff']:.3g} / {r['rows_differing']} ({r['argmax_moves']})")
                print(f"{w:>5} " + " ".join(f"{c:>24}" for c in cells))
            print(f"{'inv.':>5} " + " ".join(f"{'<= ' + str(invariant_up_to(table[s]['widths'])):>24}"
                                            for s in settings))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
