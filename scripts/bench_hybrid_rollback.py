#!/usr/bin/env python3
"""Benchmark: what taking back a rejected draft tail costs on a hybrid target (issue 42).

Part 1, rollback cost by draft length. On synthetic targets of one size (8 layers, width 512):
a hybrid (lfm2: short convolutions, or qwen35: gated DeltaNet, each beside attention layers)
and an attention-only qwen3. Each round verifies n + 1 tokens with logits, accepts half the
draft, and takes the rest back, three ways (decoding/rollback.py, docs/loop.md §10):
  trim        the attention-only target: remove KV cells (llama_memory_seq_rm)
  snapshots   the hybrid with n_rs_seq >= n: select a recurrent-state snapshot
  checkpoint  the hybrid with n_rs_seq = 0: save the recurrent state before the pass, put it back,
              decode the kept tokens again
Reported per round: the verify pass, the rollback (the checkpoint's save included), and the
rollback as a share of the pass.

Part 2, specgguf vs the C++ loop (`llama-speculative-simple`, built by
scripts/build_llama_cpp_tools.sh) in tokens/s at draft lengths 4 and 16, greedy, same libllama,
with a model draft (a quantised variant of the counting target). For such drafts the C++ loop
checkpoints the hybrid and replays the accepted tokens after a partial acceptance; specgguf
uses snapshots up to n_rs_seq (16 here).

    python scripts/bench_hybrid_rollback.py [--rounds 40] [--lengths 1,2,4,8,16,32]
                                            [--max-tokens 128] [--repeat 3] [--skip-cpp]
                                            [--out bench/hybrid_rollback.json]
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
sys.path.insert(0, str(ROOT / "tests"))
import cpp_baseline  # noqa: E402  (the tool's location and output parser, shared with the tests)

WITH_CPP = "--skip-cpp" not in sys.argv and cpp_baseline.find_tool() is not None
if WITH_CPP:
    os.environ["LLAMA_CPP_LIB_PATH"] = str(cpp_baseline.lib_dir())  # before llama_cpp is imported

import numpy as np  # noqa: E402

from specgguf.decoding.engine import Engine  # noqa: E402
from specgguf.decoding.rollback import Rollback  # noqa: E402
from specgguf.drafters import make_drafter  # noqa: E402
from specgguf.runtime import native  # noqa: E402
from specgguf.runtime.target import Target  # noqa: E402
from specgguf.synthetic.lfm2 import Lfm2Shape, write_lfm2  # noqa: E402
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3  # noqa: E402
from specgguf.synthetic.qwen35 import Qwen35Shape, write_qwen35  # noqa: E402

WIDTH, LAYERS, FF = 512, 8, 1536
SHAPES = {
    "qwen3": QwenShape(n_layer=LAYERS, n_embd=WIDTH, n_head=8, n_head_kv=4, head_dim=64, n_ff=FF),
    # LFM2's own mix: a third of the layers attend, the rest are short convolutions
    "lfm2": Lfm2Shape(n_layer=LAYERS, conv_pattern=(True, True, False, True, True, False, True, True),
                      n_embd=WIDTH, n_head=8, n_head_kv=4, n_ff=FF),
    # Qwen3.5's: every fourth layer attends, the others are gated DeltaNet
    "qwen35": Qwen35Shape(n_layer=LAYERS, n_embd=WIDTH, n_head=8, n_head_kv=4, head_dim=64, rope_dim=32,
                          rope_sections=(8, 4, 4, 0), state_size=64, n_k_heads=4, n_v_heads=8, n_ff=FF),
}
PROMPT = ("User: Write a short story about a robot who learns to paint. Describe the colours it "
          "mixes and the first picture it finishes.\nAssistant:")


def write(arch: str, path: Path, **kw) -> Path:
    if arch == "qwen3":
        return write_qwen3(path, SHAPES[arch], seed=0, **kw)
    if arch == "lfm2":
        return write_lfm2(path, SHAPES[arch], seed=0, **kw)
    return write_qwen35(path, SHAPES[arch], seed=0, **kw)


def rollback_costs(path: Path, n_rs_seq: int, lengths, rounds: int, threads: int) -> list[dict]:
    """Per draft length: median verify-pass and rollback seconds over `rounds` rounds."""
    model = native.Model(path)
    ctx = native.Context(model, n_ctx=2048, n_batch=512, n_threads=threads, n_rs_seq=n_rs_seq)
    batch = native.Batch(ctx)
    rng = np.random.default_rng(0)
    out = []
    try:
        for n in lengths:
            ctx.clear()
            prompt = rng.integers(0, 400, 64).tolist()
            batch.clear().add_tokens(prompt, 0, "last")
            ctx.decode(batch)
            rollback, pos0 = Rollback(ctx, batch), len(prompt)
            verify_s, back_s = [], []
            for r in range(rounds + 2):  # the first two warm the widths up
                if pos0 + n + 2 > ctx.n_ctx:
                    break
                tokens = rng.integers(0, 400, n + 1).tolist()
                k = n // 2  # half the draft accepted: the rest is taken back
                t0 = time.perf_counter()
                rollback.before_pass(pos0, len(tokens))
                t1 = time.perf_counter()
                batch.clear().add_tokens(tokens, pos0, "all")
                ctx.decode(batch)
                ctx.logits_block(len(tokens))
                t2 = time.perf_counter()
                rollback.keep(pos0, tokens[:k + 1])
                t3 = time.perf_counter()
                if r >= 2:
                    verify_s.append(t2 - t1)
                    back_s.append((t1 - t0) + (t3 - t2))
                pos0 += k + 1
            v, b = float(np.median(verify_s)), float(np.median(back_s))
            out.append({"n": n, "mode": ctx.rollback, "verify_ms": 1e3 * v, "rollback_ms": 1e3 * b,
                        "rollback_share": b / v, "checkpoint_bytes": rollback.checkpoint_bytes})
    finally:
        batch.close()
        ctx.close()
        model.close()
    return out


def ours_once(target: Target, drafter, n: int, tokens: list[int], max_tokens: int) -> dict:
    gen = Engine(target, drafter, n).generate(tokens, max_tokens)
    for _ in gen:
        pass
    s = gen.stats
    return {"tokens": s.generated_tokens, "decode_s": s.decode_s, "rounds": s.rounds, "drafted": s.drafted,
            "accepted": s.accepted, "rollback": s.rollback}


def versus_cpp(arch: str, tpath: Path, dpath: Path, n: int, args, workdir: Path) -> dict:
    target = Target(tpath, n_ctx=args.ctx, n_threads=args.threads, n_rs_seq=min(n, 16))
    drafter = make_drafter(str(dpath), target, n_threads=args.threads, draft_max=n)
    try:
        tokens = target.tokenize(PROMPT)
        ours_once(target, drafter, n, tokens, 8)  # warm-up, as the C++ tool does its own
        best_ours = best_cpp = None
        for _ in range(args.repeat):
            cpp = cpp_baseline.run_speculative_simple(tpath, dpath, PROMPT, n_predict=args.max_tokens, n_ctx=args.ctx,
                                                      draft_max=n, threads=args.threads, verbose=False,
                                                      workdir=workdir)
            if best_cpp is None or cpp.tokens_per_second > best_cpp.tokens_per_second:
                best_cpp = cpp
            ours = ours_once(target, drafter, n, tokens, args.max_tokens)
            if best_ours is None or ours["decode_s"] < best_ours["decode_s"]:
                best_ours = ours
    finally:
        drafter.close()
        target.close()
    ours_tps = best_ours["tokens"] / best_ours["decode_s"]
    return {"model": arch, "draft_max": n, "ours_tokens_per_second": ours_tps,
            "cpp_tokens_per_second": best_cpp.tokens_per_second, "ratio": ours_tps / best_cpp.tokens_per_second,
            "ours_accept": best_ours["accepted"] / max(best_ours["drafted"], 1),
            "cpp_accept": best_cpp.n_accept / max(best_cpp.n_drafted, 1), "ours_rollback": best_ours["rollback"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--lengths", default="1,2,4,8,16,32")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--skip-cpp", action="store_true", help="part 1 only")
    ap.add_argument("--out", default="bench/hybrid_rollback.json")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="specgguf-bench-"))
    paths = {arch: write(arch, workdir / f"{arch}.gguf") for arch in SHAPES}

    costs = []
    for label, arch, n_rs_seq in [("qwen3 trim", "qwen3", 0), ("lfm2 snapshots", "lfm2", max(lengths)),
                                  ("lfm2 checkpoint", "lfm2", 0), ("qwen35 snapshots", "qwen35", max(lengths)),
                                  ("qwen35 checkpoint", "qwen35", 0)]:
        for row in rollback_costs(paths[arch], n_rs_seq, lengths, args.rounds, args.threads):
            costs.append({"target": label, **row})
            print(f"  {label} n={row['n']}: verify {row['verify_ms']:.2f} ms, rollback {row['rollback_ms']:.3f} ms",
                  file=sys.stderr, flush=True)

    rows = []
    if WITH_CPP:
        for arch in ("lfm2", "qwen35"):
            tpath = write(arch, workdir / f"{arch}-counting.gguf", counting=True)
            dpath = write(arch, workdir / f"{arch}-draft.gguf", counting=True, quant="Q8_0",
                          mix=1.5 if arch == "lfm2" else 2.5)  # some 60-80% of its drafts accepted
            for n in (4, 16):
                rows.append(versus_cpp(arch, tpath, dpath, n, args, workdir))
                r = rows[-1]
                print(f"  {arch} n={n}: ours {r['ours_tokens_per_second']:.1f} tok/s, "
                      f"C++ {r['cpp_tokens_per_second']:.1f} tok/s", file=sys.stderr, flush=True)

    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.processor() or platform.system()}), "
               f"{args.threads} threads, llama.cpp CPU backend"
               + (f", shared libllama from {cpp_baseline.TOOL}'s build" if WITH_CPP else ""))
    print(f"specgguf bench_hybrid_rollback: synthetic F32 targets, {LAYERS} layers x {WIDTH}; {machine}")
    print(f"\nrollback per round (median of {args.rounds}; half of each draft accepted)")
    header = f"{'target':18} {'n':>3} {'verify ms':>9} {'rollback ms':>11} {'share':>6} {'ckpt KiB':>8}"
    print(header)
    print("-" * len(header))
    for r in costs:
        print(f"{r['target']:18} {r['n']:>3} {r['verify_ms']:9.2f} {r['rollback_ms']:11.3f} "
              f"{100 * r['rollback_share']:5.1f}% {r['checkpoint_bytes'] / 1024:8.1f}")
    if rows:
        print(f"\nspecgguf vs llama-speculative-simple, model draft, {args.max_tokens} tokens, best of {args.repeat}")
        header = f"{'target':8} {'n':>3} {'ours tok/s':>10} {'C++ tok/s':>10} {'ratio':>6} {'accept':>11}"
        print(header)
        print("-" * len(header))
        for r in rows:
            print(f"{r['model']:8} {r['draft_max']:>3} {r['ours_tokens_per_second']:10.1f} "
                  f"{r['cpp_tokens_per_second']:10.1f} {r['ratio']:6.3f} "
                  f"{100 * r['ours_accept']:4.0f}%/{100 * r['cpp_accept']:3.0f}%")
    out = ROOT / args.out if not os.path.isabs(args.out) else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "rounds": args.rounds, "rollback": costs, "versus_cpp": rows}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
