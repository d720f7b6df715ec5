#!/usr/bin/env python3
"""What the AMX fallback costs (docs/machines.md): the embedded Gemma, plain and n-gram decoding
and prefill, on the installed libllama with its verdict (the fallback where it crashes) and on a
build without AMX (the C++ tools build of scripts/build_llama_cpp_tools.sh, which adds -mno-amx-*
on a GCC < 13.2.1) with its default buffers and with the fallback forced. Each row runs in its
own process (the library is chosen per process), interleaved, best of --repeat.

    python scripts/bench_amx_fallback.py [--repeat 3] [--tokens 128] [--out bench/amx_fallback.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get("SPECGGUF_CPP_TOOLS_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "specgguf" / "llama-cpp-tools" / "0.3.36") / "bin"
DOC = ("Summarise the rules: 1. Preheat the oven to 200 degrees. 2. Mix the flour, the sugar and the butter. "
       "3. Add two eggs and stir well. 4. Bake for 30 minutes. ") * 6


def run(env_extra: dict, draft: str, tokens: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECGGUF_AMX", "LLAMA_CPP_LIB_PATH")}
    env.update(env_extra)
    cmd = [sys.executable, "-m", "specgguf", "generate", "-p", DOC, "-n", str(tokens), "--json", "--draft", draft,
           "--draft-max", "auto", "--compare"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{env_extra}: exit {out.returncode}: {out.stderr.strip()[-400:]}")
    r = json.loads(out.stdout)
    s, p = r["stats"], r["plain"]["stats"]
    return {"plain_tps": p["tokens_per_second"], "ngram_tps": s["tokens_per_second"],
            "prefill_tps": p["prompt_tokens"] / p["prefill_s"] if p["prefill_s"] else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default="bench/amx_fallback.json")
    args = ap.parse_args()
    rows = {"installed build, its verdict": {}}
    if (TOOLS / "libllama.so").is_file():
        rows["no-AMX build, default buffers"] = {"LLAMA_CPP_LIB_PATH": str(TOOLS), "SPECGGUF_AMX": "on"}
        rows["no-AMX build, fallback forced"] = {"LLAMA_CPP_LIB_PATH": str(TOOLS), "SPECGGUF_AMX": "off"}
    else:
        print(f"no C++ tools build in {TOOLS}: run scripts/build_llama_cpp_tools.sh for the no-AMX rows", file=sys.stderr)
    best: dict[str, dict] = {name: {} for name in rows}
    for _ in range(args.repeat):
        for name, env in rows.items():
            r = run(env, "ngram", args.tokens)
            for k, v in r.items():
                best[name][k] = max(best[name].get(k, 0.0), v)
    base = best["installed build, its verdict"]
    print(f"{'row':34} {'plain tok/s':>12} {'ngram tok/s':>12} {'prefill tok/s':>14}")
    for name, r in best.items():
        print(f"{name:34} {r['plain_tps']:12.1f} {r['ngram_tps']:12.1f} {r['prefill_tps']:14.1f}"
              + ("" if r is base else f"   (plain {r['plain_tps'] / base['plain_tps']:.2f}x the first row)"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"repeat": args.repeat, "tokens": args.tokens, "rows": best}, indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
