#!/usr/bin/env python3
"""What deterministic draft lengths cost (docs/loop.md §2.4): tokens per second of `auto`
(timed costs, the profile this machine has learned) against `--deterministic` (the frozen
prior), plain decoding beside them, on the same prompts, greedy, each run in its own process,
interleaved, best of --repeat.

    python scripts/bench_deterministic.py [--repeat 3] [--tokens 128] [--draft ngram] [--out bench/deterministic.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specgguf.cli.options import DEMO_PROMPT  # noqa: E402

PROMPTS = {
    "copy (README demo)": DEMO_PROMPT,
    "numbers (issue 29)": "Write the numbers from one to forty separated by commas: one, two, three, four, five,",
}
MODES = {"plain": [], "auto": ["--draft-max", "auto"], "deterministic": ["--draft-max", "auto", "--deterministic"]}


def run(prompt: str, mode: str, draft: str, tokens: int, target: str | None) -> dict:
    cmd = [sys.executable, "-m", "specgguf", "generate", *([target] if target else []), "-p", prompt, "-n",
           str(tokens), "--json", *MODES[mode]]
    if mode != "plain":
        cmd += ["--draft", draft]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{mode}: exit {out.returncode}: {out.stderr.strip()[-400:]}")
    r = json.loads(out.stdout)
    return {"tps": r["stats"]["tokens_per_second"], "tokens": r["tokens"], "tau": r["stats"]["tau"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--target", default=None, help="a GGUF (default: the embedded Gemma 3 270M Q4_K_M)")
    ap.add_argument("--out", default="bench/deterministic.json")
    args = ap.parse_args()
    best: dict = {}
    for _ in range(args.repeat):
        for name, prompt in PROMPTS.items():
            for mode in MODES:
                r = run(prompt, mode, args.draft, args.tokens, args.target)
                b = best.setdefault(name, {}).setdefault(mode, r)
                if r["tps"] > b["tps"]:
                    best[name][mode] = r
    print(f"{'prompt':22} {'plain tok/s':>12} {'auto tok/s':>11} {'determ. tok/s':>14} {'determ./auto':>13}"
          f" {'same text':>10}")
    for name, rows in best.items():
        p, a, d = rows["plain"], rows["auto"], rows["deterministic"]
        print(f"{name:22} {p['tps']:12.1f} {a['tps']:11.1f} {d['tps']:14.1f} {d['tps'] / a['tps']:13.2f}"
              f" {str(a['tokens'] == d['tokens'] == p['tokens']):>10}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({k: {m: {"tokens_per_second": v["tps"], "tau": v["tau"]} for m, v in rows.items()}
                               for k, rows in best.items()}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
