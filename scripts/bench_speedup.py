#!/usr/bin/env python3
"""Benchmark: plain decoding vs `ngram`, `suffix`, `model` and hybrid (suffix + model)
drafting on the embedded Gemma 3 270M.

Two prompt sets: input-grounded (copy, rewrite or continue a given passage or code, where
the output repeats the input) and open-ended chat. Every configuration runs on the same
loaded target, side by side, greedy; the speedup is tokens/s over plain decoding of the same
prompts. Prints a table and writes JSON (default bench/speedup.json). The suffix and hybrid
drafters keep their store of earlier outputs across the runs, as in an app that embeds one
SpecGGUF. For the side-by-side with llama.cpp and llama-cpp-python, see bench_side_by_side.py.

    python scripts/bench_speedup.py [--max-tokens 128] [--draft-max 2,4,8] [--out FILE]
    python scripts/bench_speedup.py --sampling [--skip-greedy] [--sampling-draft-max 4]

--sampling adds a second table: at T = 0.7 and T = 1.0 (top-p 0.95, one fixed seed per
prompt), plain sampled decoding and the drafters of --sampling-drafters (default: the model
draft) under the `exact` rule (llama.cpp's: greedy drafts, kept while they equal the
target's keyed sample), the `coupled` rule (the draft samples with the target's noise) and
the `ratio` rule (min(1, p/q), residual resampling); then the same for a DSpark draft on a
synthetic qwen3 target (Gemma 3 has no layer-input graph for hidden-state drafts): a
counting target with noisy weights, so that its successor rule holds with probability
well below 1, and a DSpark draft that knows the rule. The speedup of a sampled row is over
plain sampling at the same temperature; `same` says whether the text equals plain
sampling's with the same seed (it must for exact and coupled, up to near-ties on Q4_K_M).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from specgguf.api import SpecGGUF
from specgguf.runtime.defaults import requantized_default
from specgguf.drafters import make_drafter
from specgguf.decoding.engine import Engine
from specgguf.decoding.sampling import SamplingParams

PASSAGE = (
    "The river rises in the northern hills and runs south for two hundred miles. In spring the "
    "snow melts and the water is high; in late summer it is slow and clear, and children swim at "
    "the old mill. The town grew up where the road crosses the river, and the bridge, built of grey "
    "stone in 1820, still carries the traffic of the market every Saturday."
)
CODE = (
    "def parse_config(path):\n    settings = {}\n    with open(path) as fh:\n        for line in fh:\n"
    "            line = line.strip()\n            if not line or line.startswith('#'):\n"
    "                continue\n            key, value = line.split('=', 1)\n"
    "            settings[key.strip()] = value.strip()\n    return settings\n"
)
PROMPTS = {
    "grounded": [
        f"Copy the following passage exactly.\n\n{PASSAGE}\n\nCopy:\n",
        f"Here is a Python function:\n\n{CODE}\nThe same function with type hints added:\n\n",
        f"{PASSAGE}\n\nQuestion: Summarise the passage above, reusing its own words.\nAnswer:",
    ],
    "open": [
        "User: Write a short story about a robot who learns to paint.\nAssistant:",
        "User: What are three good ways to learn a new language?\nAssistant:",
        "User: Explain why the sky is blue to a ten-year-old.\nAssistant:",
    ],
}


def run(llm: SpecGGUF, engine: Engine, prompts: list[str], max_tokens: int, sampling: dict | None = None,
        repeat: int = 1) -> dict:
    """All prompts through one engine; with repeat > 1 each prompt keeps its fastest run
    (other processes on a shared machine only ever slow a run down)."""
    gen_tokens = decode_s = drafted = accepted = rounds = 0
    outputs, per_prompt = [], []
    for i, prompt in enumerate(prompts):
        best = None
        for _ in range(repeat):
            sp = SamplingParams(seed=i, **sampling) if sampling else None
            gen = engine.generate(llm.tokenize(prompt), max_tokens, sampling=sp)
            for _ in gen:
                pass
            if best is None or gen.stats.tokens_per_second > best.stats.tokens_per_second:
                best = gen
        s = best.stats
        gen_tokens += s.generated_tokens
        decode_s += s.decode_s
        drafted, accepted, rounds = drafted + s.drafted, accepted + s.accepted, rounds + s.rounds
        outputs.append(best.tokens)
        per_prompt.append(s.tokens_per_second)
    return {"tokens": gen_tokens, "seconds": decode_s, "tokens_per_second": gen_tokens / decode_s,
            "drafted": drafted, "accepted": accepted, "rounds": rounds,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "tau": (accepted + rounds) / rounds if rounds else 0.0, "outputs": outputs,
            "per_prompt_tokens_per_second": per_prompt}


SAMPLING = {"T0.7": dict(temperature=0.7, top_p=0.95), "T1.0": dict(temperature=1.0, top_p=0.95)}


RULES = ("exact", "coupled", "ratio")


def sampling_rows(llm: SpecGGUF, drafters: dict, max_tokens: int, n: int, prompt_sets=None) -> list[dict]:
    """Plain sampling, then each drafter under each rule, at each temperature, per prompt set."""
    rows = []
    for set_name, prompts in (prompt_sets or PROMPTS).items():
        for label, settings in SAMPLING.items():
            base = run(llm, Engine(llm.target, None), prompts, max_tokens, settings)
            rows.append({"set": set_name, "sampling": label, "drafter": "plain", "accept": "-", "draft_max": 0,
                         **base, "speedup": 1.0})
            for name, drafter in drafters.items():
                for accept in RULES:
                    res = run(llm, Engine(llm.target, drafter, n), prompts, max_tokens, {**settings, "accept": accept})
                    res["speedup"] = res["tokens_per_second"] / base["tokens_per_second"]
                    res["identical_to_plain"] = res["outputs"] == base["outputs"]
                    rows.append({"set": set_name, "sampling": label, "drafter": name, "accept": accept,
                                 "draft_max": n, **res})
    return rows


def dspark_sampling_rows(max_tokens: int, n: int, threads: int | None) -> list[dict]:
    """The sampled rows for a DSpark draft, on a synthetic qwen3 pair built on the spot."""
    import shutil
    import tempfile

    from specgguf.synthetic.qwen3 import QwenShape, write_dflash, write_qwen3

    tmp = Path(tempfile.mkdtemp(prefix="specgguf-bench-dspark-"))
    try:
        target = write_qwen3(tmp / "target.gguf", QwenShape(), seed=0, counting=True, perturb=1.4)
        draft = write_dflash(tmp / "dspark.gguf", markov=True, confidence=True, counting=True)
        with SpecGGUF(str(target), n_ctx=1024, n_threads=threads) as syn:
            drafter = make_drafter(str(draft), syn.target, draft_max=n, n_threads=threads)
            try:
                rows = sampling_rows(syn, {"dspark": drafter}, max_tokens, n, {"synthetic": PROMPTS["open"]})
            finally:
                drafter.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def print_sampled(rows: list[dict], n: int) -> None:
    print(f"\nsampled (top-p 0.95, seed = prompt index; draft max {n}; speedup over plain sampling "
          "at the same temperature; same: text equal to plain sampling's)")
    header = (f"{'set':9} {'T':5} {'drafter':8} {'rule':7} {'tok/s':>7} {'speedup':>8} {'accept':>7} {'tau':>5} "
              f"{'same':>5}")
    print(header)
    print("-" * len(header))
    for r in rows:
        same = "-" if r["drafter"] == "plain" else ("yes" if r["identical_to_plain"] else "no")
        print(f"{r['set']:9} {r['sampling']:5} {r['drafter']:8} {r['accept']:7} {r['tokens_per_second']:7.1f} "
              f"{r['speedup']:7.2f}x {100 * r['acceptance_rate']:6.0f}% {r['tau']:5.2f} {same:>5}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-max", default="2,4,8,auto", help="fixed lengths and/or auto, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="runs per prompt; the fastest counts")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="bench/speedup.json")
    ap.add_argument("--sampling", action="store_true",
                    help="add the exact, coupled and ratio rows at T = 0.7 and 1.0 (model and DSpark drafts)")
    ap.add_argument("--sampling-draft-max", type=int, default=4)
    ap.add_argument("--sampling-drafters", default="model", help="Gemma drafters of the sampled rows, comma-separated")
    ap.add_argument("--skip-greedy", action="store_true", help="only the sampling rows (with --sampling)")
    args = ap.parse_args()
    lengths = [x if x == "auto" else int(x) for x in args.draft_max.split(",")]

    draft_path = requantized_default("q3_k_s")
    llm = SpecGGUF(None, n_ctx=2048, n_threads=args.threads)
    drafters = {"ngram": make_drafter("ngram", llm.target),
                "suffix": make_drafter("suffix", llm.target),
                "model": make_drafter(str(draft_path), llm.target, n_threads=args.threads),
                "hybrid": make_drafter(f"suffix+{draft_path}", llm.target, n_threads=args.threads)}
    rows, sampled = [], []
    try:
        run(llm, Engine(llm.target, None), ["Warm-up."], 8)  # first decode pays one-off costs
        if args.sampling:
            chosen = {k: drafters[k] for k in args.sampling_drafters.split(",")}
            sampled = sampling_rows(llm, chosen, args.max_tokens, args.sampling_draft_max)
            sampled += dspark_sampling_rows(args.max_tokens, args.sampling_draft_max, args.threads)
        for set_name, prompts in (() if args.skip_greedy else PROMPTS.items()):
            base = run(llm, Engine(llm.target, None), prompts, args.max_tokens, repeat=args.repeat)
            rows.append({"set": set_name, "drafter": "plain", "draft_max": 0, **base})
            for name, drafter in drafters.items():
                for n in lengths:
                    res = run(llm, Engine(llm.target, drafter, n), prompts, args.max_tokens, repeat=args.repeat)
                    res["identical_to_plain"] = res["outputs"] == base["outputs"]
                    res["worst_prompt_speedup"] = min(
                        a / b for a, b in zip(res["per_prompt_tokens_per_second"], base["per_prompt_tokens_per_second"]))
                    rows.append({"set": set_name, "drafter": name, "draft_max": n, **res})
            for r in rows:
                if r["set"] == set_name:
                    r["speedup"] = r["tokens_per_second"] / base["tokens_per_second"]
    finally:
        for d in drafters.values():
            d.close()
        llm.close()

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} (llama.cpp CPU backend)"
    print(f"specgguf bench_speedup: Gemma 3 270M Q4_K_M target, {args.max_tokens} tokens x 3 prompts per set; "
          f"model draft = {draft_path.name}; {machine}")
    header = (f"{'set':9} {'drafter':8} {'n':>4} {'tok/s':>7} {'speedup':>8} {'worst':>6} {'accept':>7} "
              f"{'tau':>5} {'same':>5}")
    if rows:
        print(header)
        print("-" * len(header))
    for r in rows:
        same = "-" if r["drafter"] == "plain" else ("yes" if r["identical_to_plain"] else "NO")
        worst = f"{r['worst_prompt_speedup']:5.2f}x" if "worst_prompt_speedup" in r else "     -"
        print(f"{r['set']:9} {r['drafter']:8} {r['draft_max']:>4} {r['tokens_per_second']:7.1f} "
              f"{r['speedup']:7.2f}x {worst} {100 * r['acceptance_rate']:6.0f}% {r['tau']:5.2f} {same:>5}")
    if rows:
        print("speedup: all prompts of the set over plain; worst: the slowest prompt's own ratio")
    if sampled:
        print_sampled(sampled, args.sampling_draft_max)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in rows + sampled:
        r.pop("outputs")
    out.write_text(json.dumps({"machine": machine, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "max_tokens": args.max_tokens, "rows": rows, "sampling_rows": sampled}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
