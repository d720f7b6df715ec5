#!/usr/bin/env python3
"""Predicted Outputs on edit requests: the same request with and without `prediction`, on a plain
`specgguf serve` and with `--draft ngram` / `--draft suffix` (docs/loop.md §4.8).

Each request edits a Python file of 20-200 lines (the start of one of this repository's
modules): the prompt shows the file and asks for it again with one change (a function renamed,
a comment added, a function removed); the prediction is the original file, as an editor sends
it. The default model is the embedded
Gemma 3 270M (a base model: /v1/completions with a "Before / After" prompt, which it continues
by copying); `--chat` uses the embedded SmolLM2-135M-Instruct through /v1/chat/completions.
Greedy. tokens/s is the server's decode rate (`specgguf.tokens_per_second`: completion tokens
over the generation loop's wall time, the prompt read excluded); each cell is the median of
`--repeat` runs, requests interleaved so that drift hits every configuration alike.
`--batch-invariant` serves in the batch-invariant mode, where the text must be the same token
for token with and without the prediction (otherwise a quantised target may part at a near-tie:
verify batches of other widths round differently, docs/machines.md). Prints a table, saves JSON.

    python scripts/bench_predicted_outputs.py [--chat] [--drafts plain,ngram,suffix] [--lines 20,60,120,200]
        [--repeat 3] [--batch-invariant] [--out bench/predicted_outputs.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

EDITS = ["rename", "comment", "remove"]
# one worked edit before the real one: a base model then answers with the file, edited
EXAMPLE = ("Rename the function total to add_all.\nBefore:\n```python\ndef area(w, h):\n    return w * h\n\n\n"
           "def total(xs):\n    return sum(xs)\n```\nAfter:\n```python\ndef area(w, h):\n    return w * h\n\n\n"
           "def add_all(xs):\n    return sum(xs)\n```\n\n")


# real code to edit: the repository's own modules, cut to the size asked for (the file's start)
SOURCES = ["specgguf/drafters/ngram.py", "specgguf/decoding/stats.py", "specgguf/drafters/suffix.py",
           "specgguf/decoding/engine.py"]


def source_file(n_lines: int, index: int = 0) -> str:
    """~n_lines lines of one of the repository's modules, from its first top-level definition to
    a blank line."""
    lines = (ROOT / SOURCES[index % len(SOURCES)]).read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if re.match(r"(def|class|[A-Z_]+ =) ", line))
    lines = lines[first:]
    cut = n_lines
    while cut < len(lines) and lines[cut - 1].strip():
        cut += 1
    return "".join(lines[:cut])


def edited(text: str, edit: str) -> tuple[str, str]:
    """(the instruction, the file after it) for one kind of edit."""
    names = re.findall(r"^(?:def|class) (\w+)", text, re.M)
    first = names[0] if names else "x"
    if edit == "rename":
        return f"Rename {first} to {first}_v2.", re.sub(rf"\b{first}\b", f"{first}_v2", text)
    lines = text.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if re.match(r"(def|class) ", line)), 0)
    if edit == "comment":
        lines.insert(at, f"# {first}: see docs/loop.md\n")
        return f"Add a comment line above {first}.", "".join(lines)
    # remove: the last function or method, to the next line indented no deeper than its def
    start = max(i for i, line in enumerate(lines) if re.match(r"\s*def ", line))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next((i for i in range(start + 1, len(lines)) if lines[i].strip()
                and len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
    name = re.match(r"\s*def (\w+)", lines[start]).group(1)
    return f"Remove the function {name}.", "".join(lines[:start] + lines[end:])


def request(base: str, chat: bool, text: str, edit: str, prediction: bool, max_tokens: int) -> dict:
    instruction, _ = edited(text, edit)
    if chat:
        path = "/chat/completions"
        body = {"messages": [{"role": "system", "content": "Reply with the whole edited file in a python "
                              "code block and nothing else."},
                             {"role": "user", "content": f"{instruction}\n```python\n{text}```"}]}
    else:
        path = "/completions"
        body = {"prompt": f"{EXAMPLE}{instruction}\nBefore:\n```python\n{text}```\nAfter:\n```python\n",
                "stop": ["```"]}
    body.update(model="m", max_tokens=max_tokens, temperature=0)
    if prediction:
        body["prediction"] = {"type": "content", "content": text}
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        out = json.loads(resp.read())
    choice = out["choices"][0]
    details = out["usage"].get("completion_tokens_details") or {}
    stats = out["specgguf"]
    return {"text": choice["message"]["content"] if chat else choice["text"],
            "completion_tokens": out["usage"]["completion_tokens"], "tokens_per_second": stats["tokens_per_second"],
            "decode_s": stats["decode_s"], "rounds": stats["rounds"],
            "accepted_prediction_tokens": details.get("accepted_prediction_tokens", 0),
            "rejected_prediction_tokens": details.get("rejected_prediction_tokens", 0)}


def main() -> int:
    from serverproc import start_server
    from specgguf.runtime.defaults import default_chat_target, default_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded Gemma, or SmolLM2 with --chat)")
    ap.add_argument("--chat", action="store_true", help="an instruct model through /v1/chat/completions")
    ap.add_argument("--drafts", default="plain,ngram,suffix")
    ap.add_argument("--lines", default="20,60,120,200")
    ap.add_argument("--edits", default=",".join(EDITS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--out", default="bench/predicted_outputs.json")
    args = ap.parse_args()
    model = args.model or str(default_chat_target() if args.chat else default_target())
    sizes = [int(n) for n in args.lines.split(",")]
    edits = args.edits.split(",")
    rows = []
    for draft in args.drafts.split(","):
        flags = [] if draft == "plain" else ["--draft", draft]
        flags += ["--batch-invariant"] if args.batch_invariant else []
        with start_server(model, *flags, "--ctx", args.ctx, "--threads", args.threads, timeout=900) as server:
            for k, n in enumerate(sizes):
                text = source_file(n, k)
                max_tokens = min(args.ctx // 2, 4 * len(text) // 3 + 64)  # room for the whole file
                for edit in edits:
                    runs = {False: [], True: []}
                    request(server.base_url, args.chat, text, edit, False, 8)  # warm: the prompt is cached alike
                    for _ in range(args.repeat):
                        for pred in (False, True):
                            runs[pred].append(request(server.base_url, args.chat, text, edit, pred, max_tokens))
                    base, with_p = runs[False], runs[True]
                    tps = statistics.median(r["tokens_per_second"] for r in base)
                    tps_p = statistics.median(r["tokens_per_second"] for r in with_p)
                    rows.append({"draft": draft, "lines": n, "edit": edit,
                                 "tokens": with_p[0]["completion_tokens"],
                                 "tokens_per_second": tps, "tokens_per_second_prediction": tps_p,
                                 "speedup": round(tps_p / tps, 3) if tps else None,
                                 "accepted_prediction_tokens": with_p[0]["accepted_prediction_tokens"],
                                 "rejected_prediction_tokens": with_p[0]["rejected_prediction_tokens"],
                                 "same_text": all(r["text"] == base[0]["text"] for r in base + with_p),
                                 "runs": {"without": base, "with": with_p}})
                    r = rows[-1]
                    print(f"  {draft:6} {n:4} lines {edit:9} {r['tokens_per_second']:7.1f} -> "
                          f"{r['tokens_per_second_prediction']:7.1f} tok/s", file=sys.stderr, flush=True)
    print(f"\nPredicted Outputs, {Path(model).name}, greedy, {args.threads} threads, median of {args.repeat}"
          f"{', batch-invariant' if args.batch_invariant else ''}\n")
    print("| server | lines | edit | tokens | tok/s | tok/s with prediction | x | accepted / rejected | same text |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['draft']} | {r['lines']} | {r['edit']} | {r['tokens']} | {r['tokens_per_second']:.1f} | "
              f"{r['tokens_per_second_prediction']:.1f} | {r['speedup']:.2f} | {r['accepted_prediction_tokens']} / "
              f"{r['rejected_prediction_tokens']} | {'yes' if r['same_text'] else 'no'} |")
    by_draft = {}
    for r in rows:
        by_draft.setdefault(r["draft"], []).append(r["speedup"])
    for draft, xs in by_draft.items():
        print(f"\n{draft}: median speedup {statistics.median(xs):.2f}x over {len(xs)} requests", end="")
    print()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": Path(model).name, "chat": args.chat, "threads": args.threads,
                               "repeat": args.repeat, "batch_invariant": args.batch_invariant, "rows": rows},
                              indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
