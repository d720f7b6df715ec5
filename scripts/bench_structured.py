#!/usr/bin/env python3
"""Structured output with and without drafts: plain grammar-constrained decoding against
speculative decoding with the same grammar (ngram and a model draft), greedy, interleaved run by
run on one machine. Per mode: tokens/s, acceptance, tau, draft tokens cut by the grammar,
positions that needed a whole-vocabulary grammar scan, and whether the tokens equal plain's.

    python scripts/bench_structured.py [--target gemma|synthetic] [--reps 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specgguf.api import SpecGGUF
from specgguf.request.constraints import json_grammar, schema_grammar
from specgguf.drafters import make_drafter
from specgguf.decoding.engine import Engine

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                                           "city": {"type": "string", "maxLength": 24},
                                           "languages": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                                         "maxItems": 4}},
          "required": ["name", "age", "city", "languages"]}
CASES = [
    ("Alice is 30, lives in Paris and speaks French and English. As JSON:\n", PERSON),
    ("Bob (41) is from Berlin; he speaks German. JSON record:\n", PERSON),
    ("List three colours as a JSON object with a key colours:\n", None),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=["gemma", "synthetic"], default="gemma")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--out", default="bench/structured.json")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if args.target == "gemma":
        from specgguf.runtime.defaults import requantized_default

        target, model_draft = None, str(requantized_default("q3_k_s"))
    else:
        from specgguf.synthetic.qwen3 import QwenShape, write_qwen3

        target = str(write_qwen3(Path(tmp.name) / "t.gguf", QwenShape(), seed=0))
        model_draft = str(write_qwen3(Path(tmp.name) / "d.gguf", QwenShape(), seed=0, perturb=0.1))
    llm = SpecGGUF(target, n_ctx=1024)
    engines = {"plain": Engine(llm.target, None, 1),
               "ngram": Engine(llm.target, make_drafter("ngram", llm.target, draft_max=args.draft_max),
                               args.draft_max),
               "model": Engine(llm.target, make_drafter(model_draft, llm.target, draft_max=args.draft_max),
                               args.draft_max)}
    keys = ("tokens", "seconds", "drafted", "accepted", "rounds", "cut", "full_scans", "equal", "runs")
    totals = {k: dict.fromkeys(keys, 0) for k in engines}
    try:
        for rep in range(args.reps):
            for i, (prompt, schema) in enumerate(CASES):
                gbnf = json_grammar() if schema is None else schema_grammar(schema, "schema")
                toks = llm.target.tokenize(prompt)
                order = list(engines) if (rep + i) % 2 == 0 else list(engines)[::-1]
                outs = {}
                for name in order:
                    gen = engines[name].generate(toks, args.max_tokens, grammar=gbnf)
                    t0 = time.perf_counter()
                    outs[name] = list(gen)
                    t = totals[name]
                    t["seconds"] += time.perf_counter() - t0
                    t["tokens"] += len(outs[name])
                    t["drafted"] += gen.stats.drafted
                    t["accepted"] += gen.stats.accepted
                    t["rounds"] += gen.stats.rounds
                    t["cut"] += gen.constraint.cut_tokens
                    t["full_scans"] += gen.constraint.full_scans
                    t["runs"] += 1
                for name in engines:
                    totals[name]["equal"] += outs[name] == outs["plain"]
    finally:
        for e in engines.values():
            if e.drafter is not None:
                e.drafter.close()
        llm.close()
        tmp.cleanup()
    rows = {}
    base = totals["plain"]["tokens"] / max(totals["plain"]["seconds"], 1e-9)
    print(f"{'mode':6} {'tok/s':>7} {'speedup':>7} {'accept':>7} {'tau':>5} {'cut':>5} {'scans':>6} {'equal':>6}")
    for name, t in totals.items():
        tps = t["tokens"] / max(t["seconds"], 1e-9)
        rows[name] = dict(t, tokens_per_s=round(tps, 2), speedup=round(tps / base, 3),
                          acceptance=round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
                          tau=round(t["tokens"] / t["rounds"], 3) if t["rounds"] else None)
        r = rows[name]
        print(f"{name:6} {tps:7.2f} {r['speedup']:7.2f} {r['acceptance'] or 0:7.2f} {r['tau'] or 0:5.2f} "
              f"{t['cut']:5d} {t['full_scans']:6d} {t['equal']:>3}/{t['runs']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"target": args.target, "draft_max": args.draft_max, "max_tokens": args.max_tokens,
                               "reps": args.reps, "modes": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
