#!/usr/bin/env python3
"""What `--draft-max auto` costs where drafting does not pay: plain decoding and auto with a
given drafter, interleaved run by run (order alternating) on the open-ended prompts of
bench_speedup, so that drift on a shared machine hits both alike. Prints a table, writes JSON.

    python scripts/bench_auto_overhead.py [--draft model|ngram] [--reps 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_speedup import PROMPTS  # noqa: E402

from specgguf.api import SpecGGUF  # noqa: E402
from specgguf.runtime.defaults import requantized_default  # noqa: E402
from specgguf.drafters import make_drafter  # noqa: E402
from specgguf.decoding.engine import Engine  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", choices=["model", "ngram"], default="model")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default="bench/auto_overhead.json")
    args = ap.parse_args()
    llm = SpecGGUF(None, n_ctx=2048)
    spec = str(requantized_default("q3_k_s")) if args.draft == "model" else "ngram"
    drafter = make_drafter(spec, llm.target, draft_max="auto")
    engines = {"plain": Engine(llm.target, None), "auto": Engine(llm.target, drafter, "auto")}
    totals = {k: [0, 0.0, 0] for k in engines}  # tokens, seconds, drafted
    try:
        for rep in range(args.reps):
            for i, prompt in enumerate(PROMPTS["open"]):
                names = ["plain", "auto"] if (rep + i) % 2 == 0 else ["auto", "plain"]
                for name in names:
                    gen = engines[name].generate(llm.tokenize(prompt), args.max_tokens)
                    for _ in gen:
                        pass
                    t = totals[name]
                    t[0] += gen.stats.generated_tokens
                    t[1] += gen.stats.decode_s
                    t[2] += gen.stats.drafted
    finally:
        drafter.close()
        llm.close()
    rate = {k: v[0] / v[1] for k, v in totals.items()}
    print(f"open-ended prompts x {args.reps} interleaved runs, {args.max_tokens} tokens, draft {args.draft}")
    print(f"{'mode':6} {'tok/s':>7} {'drafted':>8}")
    for k, v in totals.items():
        print(f"{k:6} {rate[k]:7.1f} {v[2]:8d}")
    print(f"auto / plain = {rate['auto'] / rate['plain']:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"draft": args.draft, "reps": args.reps, "tokens_per_second": rate,
                               "ratio": rate["auto"] / rate["plain"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
