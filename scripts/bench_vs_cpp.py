#!/usr/bin/env python3
"""Benchmark: specgguf's Python loop vs llama.cpp's C++ loop (`llama-speculative-simple`).

Same models, prompt, context, threads and draft lengths, greedy, on the SAME libllama: this
script points LLAMA_CPP_LIB_PATH at the C++ tool's folder before specgguf is imported, so
the difference is the loop itself (Python, ctypes, numpy arg-max) and nothing in the build.
Build the tool first: scripts/build_llama_cpp_tools.sh.

Per configuration both sides run --repeat times, interleaved, and the fastest run of each
counts (the machine is shared). Reported: tokens/s of each, their ratio, rounds, and the
Python loop's overhead per round in microseconds, two ways:
  d/round  = our decode time / our rounds - C++ decode time / C++ rounds
  py/round = our time outside llama_process (perf_counter around every decode) / rounds
The C++ loop runs until it has MORE than -n tokens (docs/loop.md §6.3), so rounds and
token counts differ slightly; rates and per-round times are compared, not totals.

    python scripts/bench_vs_cpp.py [--max-tokens 128] [--draft-max 2,4,8] [--repeat 3]
                                   [--models synthetic,gemma] [--profile] [--out bench/vs_cpp.json]
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

if cpp_baseline.find_tool() is None:
    sys.exit(f"error: {cpp_baseline.TOOL} is not built; run scripts/build_llama_cpp_tools.sh first")
os.environ["LLAMA_CPP_LIB_PATH"] = str(cpp_baseline.lib_dir())  # before llama_cpp is imported

from specgguf.runtime import native  # noqa: E402
from specgguf.drafters import make_drafter  # noqa: E402
from specgguf.decoding.engine import Engine  # noqa: E402
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3  # noqa: E402
from specgguf.runtime.target import Target  # noqa: E402

PROMPT = ("User: Write a short story about a robot who learns to paint. Describe the colours it "
          "mixes and the first picture it finishes.\nAssistant:")
BENCH_SHAPE = QwenShape(n_layer=4, n_embd=512, n_head=8, n_head_kv=4, head_dim=64, n_ff=1536)


class DecodeTimer:
    """Accumulates wall time spent inside llama_process (Context.decode) on every context."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0
        self._orig = native.Context.decode

    def __enter__(self):
        orig, timer, clock = self._orig, self, time.perf_counter

        def timed(ctx, batch):
            t0 = clock()
            try:
                return orig(ctx, batch)
            finally:
                timer.seconds += clock() - t0
                timer.calls += 1

        native.Context.decode = timed
        return self

    def __exit__(self, *exc):
        native.Context.decode = self._orig


def models(which: list[str], workdir: Path) -> list[tuple[str, Path, Path]]:
    out = []
    if "synthetic" in which:
        t = write_qwen3(workdir / "bench-qwen3-target.gguf", BENCH_SHAPE, seed=0)
        d = write_qwen3(workdir / "bench-qwen3-draft.gguf", BENCH_SHAPE, seed=0, perturb=0.1)
        out.append(("qwen3-synthetic-512x4", t, d))
    if "gemma" in which:
        from specgguf.runtime.defaults import default_target, requantized_default

        out.append(("gemma3-270m+q3_k_s", default_target(), requantized_default("q3_k_s")))
    return out


def ours_once(target: Target, drafter, n: int, tokens: list[int], max_tokens: int) -> dict:
    engine = Engine(target, drafter, n)
    with DecodeTimer() as timer:
        gen = engine.generate(tokens, max_tokens)
        for _ in gen:
            pass
    s = gen.stats
    # the generation runs its prefill lazily, inside the same timer: take it out again
    # (prefill_s is the wall time around the prefill decodes, so python time is slightly low)
    in_llama = timer.seconds - s.prefill_s
    return {"tokens": s.generated_tokens, "rounds": s.rounds, "decode_s": s.decode_s, "prefill_s": s.prefill_s,
            "llama_s": in_llama, "drafted": s.drafted, "accepted": s.accepted, "out": gen.tokens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-max", default="2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--models", default="synthetic,gemma")
    ap.add_argument("--profile", action="store_true", help="cProfile one specgguf run per configuration")
    ap.add_argument("--out", default="bench/vs_cpp.json")
    args = ap.parse_args()
    lengths = [int(x) for x in args.draft_max.split(",")]
    rows, profiles = [], {}
    workdir = Path(tempfile.mkdtemp(prefix="specgguf-bench-"))
    for label, tpath, dpath in models(args.models.split(","), workdir):
        target = Target(tpath, n_ctx=args.ctx, n_threads=args.threads)
        drafter = make_drafter(str(dpath), target, n_threads=args.threads)
        try:
            tokens = target.tokenize(PROMPT)
            ours_once(target, drafter, 4, tokens, 8)  # warm-up, as the C++ tool does its own
            for n in lengths:
                best_ours = best_cpp = None
                for _ in range(args.repeat):
                    cpp = cpp_baseline.run_speculative_simple(
                        tpath, dpath, PROMPT, n_predict=args.max_tokens, n_ctx=args.ctx, draft_max=n,
                        threads=args.threads, verbose=False, workdir=workdir)
                    if best_cpp is None or cpp.decode_s / max(cpp.n_predict, 1) < best_cpp.decode_s / max(best_cpp.n_predict, 1):
                        best_cpp = cpp
                    ours = ours_once(target, drafter, n, tokens, args.max_tokens)
                    if best_ours is None or ours["decode_s"] < best_ours["decode_s"]:
                        best_ours = ours
                cpp, ours = best_cpp, best_ours
                cpp_rounds = cpp.n_predict - cpp.n_accept  # each round commits accepted + 1
                ours_tps = ours["tokens"] / ours["decode_s"]
                row = {
                    "model": label, "draft_max": n,
                    "ours_tokens": ours["tokens"], "ours_rounds": ours["rounds"], "ours_decode_s": ours["decode_s"],
                    "ours_tokens_per_second": ours_tps,
                    "ours_accept": ours["accepted"] / ours["drafted"] if ours["drafted"] else 0.0,
                    "cpp_tokens": cpp.n_predict, "cpp_rounds": cpp_rounds, "cpp_decode_s": cpp.decode_s,
                    "cpp_tokens_per_second": cpp.tokens_per_second,
                    "cpp_accept": cpp.n_accept / cpp.n_drafted if cpp.n_drafted else 0.0,
                    "ratio": ours_tps / cpp.tokens_per_second if cpp.tokens_per_second else 0.0,
                    "overhead_us_per_round": 1e6 * (ours["decode_s"] / ours["rounds"] - cpp.decode_s / cpp_rounds),
                    "python_us_per_round": 1e6 * (ours["decode_s"] - ours["llama_s"]) / ours["rounds"],
                }
                rows.append(row)
                print(f"  {label} n={n}: ours {ours_tps:.1f} tok/s, C++ {cpp.tokens_per_second:.1f} tok/s "
                      f"({row['ratio']:.3f}x)", file=sys.stderr, flush=True)
                if args.profile:
                    import cProfile
                    import io
                    import pstats

                    prof = cProfile.Profile()
                    prof.enable()
                    ours_once(target, drafter, n, tokens, args.max_tokens)
                    prof.disable()
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
                    profiles[f"{label} n={n}"] = buf.getvalue()
        finally:
            drafter.close()
            target.close()

    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.processor() or platform.system()}), "
               f"{args.threads} threads, llama.cpp CPU backend, shared libllama from {cpp_baseline.TOOL}'s build")
    print(f"specgguf bench_vs_cpp: {args.max_tokens} tokens, greedy, best of {args.repeat}; {machine}")
    header = (f"{'model':24} {'n':>2} {'ours tok/s':>10} {'C++ tok/s':>10} {'ratio':>6} {'rounds':>11} "
              f"{'accept':>11} {'d/round us':>10} {'py/round us':>11}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:24} {r['draft_max']:>2} {r['ours_tokens_per_second']:10.1f} {r['cpp_tokens_per_second']:10.1f} "
              f"{r['ratio']:6.3f} {r['ours_rounds']:>5}/{r['cpp_rounds']:<5} "
              f"{100 * r['ours_accept']:4.0f}%/{100 * r['cpp_accept']:3.0f}%  {r['overhead_us_per_round']:10.0f} "
              f"{r['python_us_per_round']:11.0f}")
    for name, text in profiles.items():
        print(f"\n== cProfile, specgguf {name} ==\n{text}")
    out = ROOT / args.out if not os.path.isabs(args.out) else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "max_tokens": args.max_tokens, "repeat": args.repeat, "prompt": PROMPT,
                               "rows": rows, "profiles": profiles}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
