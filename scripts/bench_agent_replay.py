#!/usr/bin/env python3
"""An agent's traffic replayed: a 5-turn tool-calling conversation behind a 16k-token system
prompt and tool list, each turn resending everything before it, as coding agents do. Time to
first token and the prompt tokens each engine did not read again, per turn, for `specgguf serve`
with a drafter, llama-server (same GGUF, its prompt cache on: `cache_prompt`, its default) and
`llama_cpp.Llama` (which reuses the longest common prefix of its last prompt).

The conversation is replayed, not generated: every engine gets the same bytes each turn (the
system prompt, a JSON tool list, then per turn the scripted tool call, its result and the next
request), through /v1/completions with stream on (Llama: create_completion(stream=True)), so
that what is compared is how much of a resent prefix each engine reads again. Greedy,
--max-tokens per turn (16). Prints a table, saves JSON.

    python scripts/bench_agent_replay.py [--model GGUF] [--draft ngram] [--llama-server PATH]
        [--system-tokens 16000] [--turns 5] [--threads 2] [--out bench/agent_replay.json]

llama-server: SPECGGUF_CPP_TARGETS=llama-server scripts/build_llama_cpp_tools.sh builds it from the
pinned llama.cpp (the last line printed is its path).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))


def tool(i: int) -> dict:
    """One of the agent's tools, with a schema of the size real agents send."""
    return {"name": f"tool_{i:02d}_{['read', 'write', 'search', 'run', 'list'][i % 5]}",
            "description": f"Tool {i}: operates on the workspace. " + "It takes a path and options and returns a "
                           "result the agent reads before its next step. " * 3,
            "input_schema": {"type": "object", "required": ["path"], "properties": {
                "path": {"type": "string", "description": "A path inside the workspace."},
                "limit": {"type": "integer", "description": "At most this many results."},
                "pattern": {"type": "string", "description": "A glob or a regular expression."},
                "recursive": {"type": "boolean", "description": "Descend into folders."}}}}


def system_prompt(n_tokens: int, count) -> str:
    """Instructions and a tool list, grown until `count(text)` reaches n_tokens."""
    rules = [f"{i}. When a task mentions files, read them before changing them, and say what you changed."
             for i in range(1, 400)]
    text, n_tools, n_rules = "", 8, 40
    while True:
        tools = json.dumps([tool(i) for i in range(n_tools)], indent=1)
        text = ("You are a coding agent working in a repository. Rules:\n" + "\n".join(rules[:n_rules]) +
                f"\n\nTools (call one as <call>{{\"name\": ..., \"input\": {{...}}}}</call>):\n{tools}\n")
        if count(text) >= n_tokens or n_rules >= len(rules):
            return text
        n_tools, n_rules = n_tools + 8, min(n_rules + 40, len(rules))


def turns(n: int) -> list[str]:
    """What each turn adds after the previous prompt: the scripted tool call and its result, then
    the request (turn 1: the task)."""
    out = ["\nUser: Rename the function load to read_config everywhere and run the tests.\nAssistant:"]
    for t in range(1, n):
        result = "\n".join(f"src/module_{t}_{j}.py:{10 * j}: def load(path): return open(path).read()"
                           for j in range(12))
        out.append(f" <call>{{\"name\": \"tool_0{t % 5}_search\", \"input\": {{\"path\": \"src\", \"pattern\": "
                   f"\"load\"}}}}</call>\nTool result:\n{result}\nUser: Go on.\nAssistant:")
    return out


def stream_http(base: str, prompt: str, max_tokens: int) -> tuple[float, dict]:
    """(seconds to the first text, the last event) of one streamed /v1/completions request."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "cache_prompt": True}).encode()
    req = urllib.request.Request(base + "/completions", body, {"Content-Type": "application/json"})
    t0, first, last = time.perf_counter(), None, {}
    with urllib.request.urlopen(req, timeout=900) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if first is None and any(c.get("text") for c in event.get("choices") or []):
                first = time.perf_counter() - t0
            last = event
    return (first if first is not None else time.perf_counter() - t0), last


def replay_server(base: str, prompts: list[str], max_tokens: int, cached_of) -> list[dict]:
    rows = []
    for prompt in prompts:
        ttft, last = stream_http(base, prompt, max_tokens)
        rows.append({"ttft_s": round(ttft, 3), "cached_tokens": cached_of(last)})
    return rows


def replay_llama(model: str, prompts: list[str], max_tokens: int, n_ctx: int, threads: int) -> list[dict]:
    from llama_cpp import Llama

    from specgguf.runtime import native

    native.guard_llama_cpp_python()  # on a build whose AMX kernels crash here, load as specgguf does
    llm = Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    rows = []
    try:
        for prompt in prompts:
            t0, first = time.perf_counter(), None
            for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0, stream=True):
                if first is None and chunk["choices"][0]["text"]:
                    first = time.perf_counter() - t0
            rows.append({"ttft_s": round(first if first is not None else time.perf_counter() - t0, 3),
                         "cached_tokens": None})
    finally:
        llm.close()
    return rows


def main() -> int:
    from serverproc import start_server
    from specgguf.api import SpecGGUF
    from specgguf.runtime.defaults import default_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded Gemma 3 270M, 32k context)")
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--llama-server", default=None, help="a llama-server binary for its row")
    ap.add_argument("--system-tokens", type=int, default=16000)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/agent_replay.json")
    args = ap.parse_args()
    model = args.model or str(default_target())
    with SpecGGUF(model, n_ctx=512) as counter:
        def count(text):
            return len(counter.tokenize(text.encode()))

        system = system_prompt(args.system_tokens, count)
        prompts, text = [], system
        for added in turns(args.turns):
            text += added
            prompts.append(text)
        sizes = [count(p) for p in prompts]
    n_ctx = sizes[-1] + 2 * args.max_tokens + 64
    results = {}
    print(f"system prompt {sizes[0]} tokens, last turn {sizes[-1]}", file=sys.stderr)
    with start_server(model, "--draft", args.draft, "--ctx", n_ctx, "--threads", args.threads,
                      timeout=900) as server:
        results[f"specgguf serve --draft {args.draft}"] = replay_server(
            server.base_url, prompts, args.max_tokens,
            lambda last: (last.get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens"))
    if args.llama_server:
        from bench_parallel import LlamaServer

        server = LlamaServer(args.llama_server, model, 1, n_ctx, args.threads, [])
        try:
            results["llama-server (cache_prompt)"] = replay_server(
                server.base_url, prompts, args.max_tokens,
                lambda last: (last.get("timings") or {}).get("cache_n"))
        finally:
            server.close()
    results["llama_cpp.Llama"] = replay_llama(model, prompts, args.max_tokens, n_ctx, args.threads)
    print(f"\nAgent replay, {Path(model).name}, {args.turns} turns, greedy, {args.threads} threads; "
          f"time to first token in s (prompt tokens not read again)\n")
    print("| engine | " + " | ".join(f"turn {t + 1} ({sizes[t]} tok)" for t in range(args.turns)) + " |")
    print("| --- |" + " --- |" * args.turns)
    for name, rows in results.items():
        cells = [f"{r['ttft_s']:.2f}" + (f" ({r['cached_tokens']})" if r["cached_tokens"] is not None else "")
                 for r in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": Path(model).name, "prompt_tokens": sizes, "threads": args.threads,
                               "max_tokens": args.max_tokens, "results": results}, indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
