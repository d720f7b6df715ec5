#!/usr/bin/env python3
"""Time to first token with and without the prompt cache, specgguf beside llama_cpp.Llama on the
same GGUF (docs/loop.md §7).

Two sessions, each run by five engines (specgguf and Llama, cache on and off, and `specgguf serve`
through the real openai client):
- chat: a system prompt holding a long document, then 5 user turns; every request sends the
  whole conversation (as an OpenAI client does), answers are kept in it;
- alternating: two long documents, asked about in turn (A, B, A, B): the live context holds
  the other one, so only saved states (specgguf `prompt_cache_bytes`, Llama `LlamaRAMCache`)
  keep both.
"cache off" calls reset() before every request (every prompt is read whole).
Greedy, n-gram drafting for specgguf, 2 threads unless --threads. Prints a table, saves JSON.

    python scripts/bench_prompt_cache.py [--model PATH] [--turns 5] [--max-tokens 32] [--out bench/prompt_cache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTIONS = ["Which entry mentions the red valve?", "What is the value of entry 12?", "Summarise entry 30.",
             "Which entries are marked urgent?", "What came after entry 40?", "How many entries are there?"]


def document(seed: int, n: int = 75) -> str:
    colours = ["red", "blue", "green", "amber", "grey"]
    lines = [f"Entry {i}: the {colours[(i * seed) % 5]} valve reads {(i * 37 + seed) % 101} units"
             f"{' (urgent)' if (i + seed) % 9 == 0 else ''}." for i in range(1, n + 1)]
    return f"Maintenance log {seed}.\n" + "\n".join(lines)


class ServerClient:
    """`specgguf serve` on loopback through the real openai client (the server's own cache)."""

    def __init__(self, model: str, threads: int, ctx: int):
        sys.path.insert(0, str(ROOT / "tests"))
        from serverproc import start_server

        self._cm = start_server(model, "--draft", "ngram", "--threads", threads, "--ctx", ctx)
        server = self._cm.__enter__()
        import openai

        self.client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=600)

    def create_chat_completion(self, messages, max_tokens, temperature, stream):
        for chunk in self.client.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens,
                                                          temperature=temperature, stream=True,
                                                          stream_options={"include_usage": True}):
            d = chunk.model_dump()
            d.update(chunk.model_extra or {})
            yield d

    def reset(self):
        raise RuntimeError("the server row runs with its cache on")

    def close(self):
        self._cm.__exit__(None, None, None)


class Engine:
    """One of the rows: create_chat_completion with a stream, timed to the first text."""

    def __init__(self, name: str, llm, cache: bool):
        self.name, self.llm, self.cache = name, llm, cache
        self.prefill: list[float] = []  # specgguf rows: prefill seconds per request

    def ask(self, messages: list[dict], max_tokens: int) -> tuple[float, str, int]:
        if not self.cache:
            self.llm.reset()
        t0 = time.perf_counter()
        ttft, text = None, []
        for chunk in self.llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0,
                                                     stream=True):
            delta = chunk["choices"][0].get("delta", {}) if chunk["choices"] else {}
            if delta.get("content"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(delta["content"])
            if chunk.get("specgguf"):  # specgguf's stats: the prompt's own reading time
                self.prefill.append(chunk["specgguf"]["prefill_s"])
        return (ttft if ttft is not None else time.perf_counter() - t0), "".join(text)


def chat_session(engine: Engine, turns: int, max_tokens: int) -> list[float]:
    messages = [{"role": "system", "content": "Answer from this log.\n" + document(3)}]
    out = []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        ttft, answer = engine.ask(messages, max_tokens)
        messages.append({"role": "assistant", "content": answer})
        out.append(ttft)
    return out


def alternating_session(engine: Engine, max_tokens: int) -> list[float]:
    docs = [document(5), document(7)]
    out = []
    for i, q in enumerate(QUESTIONS[:4]):
        messages = [{"role": "system", "content": "Answer from this log.\n" + docs[i % 2]},
                    {"role": "user", "content": q}]
        out.append(engine.ask(messages, max_tokens)[0])
    return out


def default_model() -> str:
    try:
        from specgguf.runtime.defaults import default_chat_target

        return str(default_chat_target())
    except Exception:  # noqa: BLE001 - the instruct model is optional here
        from specgguf.runtime.defaults import default_target

        return str(default_target())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded instruct model, else the Gemma)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--out", default="bench/prompt_cache.json")
    args = ap.parse_args()

    from llama_cpp import Llama, LlamaRAMCache

    from specgguf.api import SpecGGUF
    from specgguf.runtime import native

    native.guard_llama_cpp_python()
    model = args.model or default_model()
    common = dict(n_ctx=args.ctx, n_threads=args.threads, verbose=False)
    rows: dict[str, dict] = {}
    for name, make in (
        ("specgguf, cache on", lambda: Engine("specgguf", SpecGGUF(model, draft="ngram", prompt_cache_bytes=2 << 30,
                                                                     **common), True)),
        ("specgguf, cache off", lambda: Engine("specgguf", SpecGGUF(model, draft="ngram", **common), False)),
        ("specgguf serve (openai client)", lambda: Engine("server", ServerClient(model, args.threads, args.ctx),
                                                           True)),
        ("llama_cpp.Llama, cache on", lambda: _llama(Llama, LlamaRAMCache, model, common, True)),
        ("llama_cpp.Llama, cache off", lambda: _llama(Llama, LlamaRAMCache, model, common, False)),
    ):
        engine = make()
        try:
            engine.ask([{"role": "user", "content": "Hello"}], 4)  # load and warm up, not timed
            engine.prefill.clear()
            rows[name] = {"chat": chat_session(engine, args.turns, args.max_tokens)}
            chat_prefill = list(engine.prefill)
            rows[name]["alternating"] = alternating_session(engine, args.max_tokens)
            if chat_prefill:
                rows[name]["chat_prefill_s"] = chat_prefill
                rows[name]["alternating_prefill_s"] = engine.prefill[len(chat_prefill):]
        finally:
            close = getattr(engine.llm, "close", None)
            if close:
                close()
        print(f"  {name}: done", file=sys.stderr)

    head = " ".join(f"{'turn ' + str(i + 1):>8}" for i in range(args.turns))
    alt = " ".join(f"{x:>8}" for x in ("A", "B", "A", "B"))
    print(f"time to first token, seconds ({Path(model).name}, {args.threads} threads, {os.cpu_count()} CPUs)")
    print(f"{'engine':32} | chat {head} | alternating {alt}")
    for name, r in rows.items():
        print(f"{name:32} |      " + " ".join(f"{t:8.3f}" for t in r["chat"]) + " |             "
              + " ".join(f"{t:8.3f}" for t in r["alternating"]))
    print("specgguf's own prefill seconds (stats.prefill_s) per request:")
    for name, r in rows.items():
        if "chat_prefill_s" in r:
            first = r["chat_prefill_s"][0]
            share = " ".join(f"{100 * t / first:5.1f}%" for t in r["chat_prefill_s"][1:])
            print(f"  {name:30} chat " + " ".join(f"{t:.3f}" for t in r["chat_prefill_s"])
                  + f" (turns 2.. as a share of turn 1: {share}); alternating "
                  + " ".join(f"{t:.3f}" for t in r["alternating_prefill_s"]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": Path(model).name, "threads": args.threads, "max_tokens": args.max_tokens,
                               "rows": rows}, indent=2))
    print(f"saved {out}")
    return 0


def _llama(Llama, LlamaRAMCache, model, common, cache: bool) -> Engine:
    llm = Llama(model_path=model, **common)
    if cache:
        llm.set_cache(LlamaRAMCache(capacity_bytes=2 << 30))
    return Engine("llama", llm, cache)


if __name__ == "__main__":
    raise SystemExit(main())
