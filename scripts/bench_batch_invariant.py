#!/usr/bin/env python3
"""What the batch-invariant mode costs, and whether it keeps its promise (issue 29; docs/machines.md,
"Batch invariance"): decode tokens/s of plain and speculative decoding with the default kernels
and with `batch_invariant=True`, and whether each speculative answer is, token for token, the
plain answer of its own mode.

Models and prompts are the side-by-side benchmark's (scripts/bench_prompts.py):
  gemma    the embedded Gemma 3 270M Q4_K_M on its single prompts (raw text), 128 tokens;
  smollm2  SmolLM2-135M-Instruct Q4_1 on its instruct requests (chat template), 128 tokens.
Rows: plain, ngram (auto lengths, the default), suffix, and a model draft (the Gemma requantized
to Q3_K_S for Gemma; SmolLM2 drafting for itself, a check of identity more than of speed).
Greedy. Every run opens a new SpecGGUF (no prompt cache, no suffix store carried); the runs of a
prompt are interleaved across modes and rows, --repeat times, and the fastest counts. The cost
profiles are warmed first in a private cache directory (a user's second run). llama_cpp's own
libllama (the stock wheel a user has), never the C++ tool's.

    python scripts/bench_batch_invariant.py [--repeat 2] [--max-tokens 128] [--models gemma,smollm2]
                                            [--threads N] [--out bench/batch_invariant.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specgguf.api import SpecGGUF  # noqa: E402
from specgguf.runtime import native  # noqa: E402
from specgguf.runtime.defaults import default_chat_target, default_target, requantized_default  # noqa: E402

from bench_prompts import INSTRUCT, PROMPTS  # noqa: E402

MODES = {"default": False, "batch-invariant": True}


def model_setup(name: str) -> tuple[Path, dict, dict]:
    """(target, {row: draft}, {prompt name: text or chat messages}) of one model."""
    if name == "gemma":
        target = default_target()
        return target, {"plain": None, "ngram": "ngram", "suffix": "suffix",
                        "model (Q3_K_S Gemma)": str(requantized_default("q3_k_s"))}, dict(PROMPTS)
    target = default_chat_target()
    prompts = {item: [{"role": "user", "content": text}] for items in INSTRUCT.values() for item, text in items.items()}
    return target, {"plain": None, "ngram": "ngram", "suffix": "suffix", "model (itself)": str(target)}, prompts


def run(target, draft, prompt, invariant: bool, max_tokens: int, threads: int) -> dict:
    with SpecGGUF(target, draft=draft, n_ctx=4096, n_threads=threads, batch_invariant=invariant) as llm:
        toks = llm.chat_prompt(prompt) if isinstance(prompt, list) else llm.tokenize(prompt)
        gen, text = llm.stream_tokens(toks, max_tokens, speculate=draft is not None)
        "".join(text)
        s = gen.stats
    return {"tok_s": s.generated_tokens / s.decode_s if s.decode_s else 0.0, "tokens": list(gen.tokens),
            "decode_s": s.decode_s, "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "verify_width": s.verify_width, "batch_invariant": s.batch_invariant}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--models", default="gemma,smollm2")
    ap.add_argument("--threads", type=int, default=native.default_threads())
    ap.add_argument("--out", default=str(ROOT / "bench" / "batch_invariant.json"))
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    if a.repeat < 1 or a.max_tokens < 1 or not models or any(m not in ("gemma", "smollm2") for m in models):
        sys.exit("error: --repeat and --max-tokens must be >= 1; --models is a list of gemma, smollm2")
    os.environ["SPECGGUF_CACHE"] = tempfile.mkdtemp(prefix="specgguf-bench-")  # private profiles
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{a.threads} threads; greedy, {a.max_tokens} tokens, best of {a.repeat}; llama_cpp's own libllama")
    results: dict = {}
    for model in models:
        target, rows, prompts = model_setup(model)
        first = next(iter(prompts.values()))
        for invariant in MODES.values():  # warm the profiles (and measure the invariant width once)
            for draft in rows.values():
                if draft is not None:
                    run(target, draft, first, invariant, a.max_tokens, a.threads)
        runs = {mode: {row: {p: [] for p in prompts} for row in rows} for mode in MODES}
        for rep in range(a.repeat):
            for p, prompt in prompts.items():
                for mode, invariant in MODES.items():
                    for row, draft in rows.items():
                        runs[mode][row][p].append(run(target, draft, prompt, invariant, a.max_tokens, a.threads))
            print(f"  {model}: repeat {rep + 1}/{a.repeat} done")
        results[model] = runs

    # per model, mode and row: tokens over decode seconds of the fastest run of every prompt; a
    # speculative row's text is plain's when every run of a prompt equals plain's (same mode)
    table: dict = {}
    for model, runs in results.items():
        table[model] = {}
        for mode in MODES:
            plain = {p: runs[mode]["plain"][p][0]["tokens"] for p in runs[mode]["plain"]}
            for row, by_p in runs[mode].items():
                fastest = [max(rs, key=lambda r: r["tok_s"]) for rs in by_p.values()]
                tokens, seconds = sum(len(r["tokens"]) for r in fastest), sum(r["decode_s"] for r in fastest)
                same = sum(all(r["tokens"] == plain[p] for r in rs) for p, rs in by_p.items())
                table[model].setdefault(row, {})[mode] = {
                    "tok_s": tokens / seconds if seconds else 0.0, "tokens": tokens, "same_as_plain": same,
                    "prompts": len(by_p), "verify_width": fastest[0]["verify_width"]}
    md = ["| model | row | default tok/s | batch-invariant tok/s | invariant / default | "
          "text = plain's (default) | text = plain's (invariant) |",
          "| --- | --- | ---: | ---: | ---: | --- | --- |"]
    for model, rows in table.items():
        name = "Gemma 3 270M Q4_K_M" if model == "gemma" else "SmolLM2-135M-Instruct Q4_1"
        for row, by_mode in rows.items():
            d, i = by_mode["default"], by_mode["batch-invariant"]
            same = ["-", "-"] if row == "plain" else [f"{m['same_as_plain']}/{m['prompts']}" for m in (d, i)]
            md.append(f"| {name} | {row} | {d['tok_s']:.1f} | {i['tok_s']:.1f} | {i['tok_s'] / d['tok_s']:.2f} | "
                      + " | ".join(same) + " |")
    print("\n" + "\n".join(md))
    load_end = os.getloadavg()
    print(f"load at the end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"arch": platform.machine(), "cores": os.cpu_count(), "threads": a.threads,
                                           "load_start": load, "load_end": load_end},
                               "max_tokens": a.max_tokens, "repeat": a.repeat, "table": table,
                               "markdown": "\n".join(md), "runs": results}, indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
