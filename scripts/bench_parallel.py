#!/usr/bin/env python3
"""Benchmark: concurrent chat clients against `specgguf serve --parallel N` and against the
one-at-a-time server (--parallel 1), on one machine (issue 28; decoding/sharedctx.py, decoding/slots.py).

Each of C clients (C in --clients, default 1,2,4,8) sends --requests chat requests one after
another (greedy, up to --max-tokens tokens; the instruct requests of scripts/bench_prompts.py,
a different one per client and request) to a server on loopback. Rows:
  specgguf one-at-a-time      serve --parallel 1 (requests queue and run one by one)
  specgguf --parallel N       serve --parallel N (--slots, default 4: a server is started with
                              one setting, whoever comes): one target pass per round for all
                              running requests; more clients than slots wait in the queue
each with --draft (default ngram: a draft GGUF works too) and with no draft. Reported per row and client count:
aggregate tokens/s (all completion tokens over the wall time of the whole run) and per-client
tokens/s (a client's tokens over the time its requests took, the mean over clients). The
servers are warmed with three short requests first (cost profiles, in a private cache). A llama-server binary, when given
(--llama-server PATH, built from the same llama.cpp: SPECGGUF_CPP_TARGETS=llama-server
scripts/build_llama_cpp_tools.sh), adds its rows: -np N without speculation and with each of
its n-gram settings in --llama-server-specs, and a row with the best of those per client count.

    python scripts/bench_parallel.py [--clients 1,2,4,8] [--slots 4] [--requests 3] [--repeat 1] [--max-tokens 96]
                                     [--prompts chat|short] [--draft ngram] [--target GGUF]
                                     [--llama-server PATH] [--llama-server-specs plain,ngram-simple,...]
                                     [--out bench/parallel.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from bench_prompts import INSTRUCT  # noqa: E402
from serverproc import start_server  # noqa: E402

CHATS = [[{"role": "user", "content": text}] for items in INSTRUCT.values() for text in items.values()]
# short requests: decoding dominates (the chat requests above spend about 40% of the time reading
# their 300-600-token prompts, which batching does not make cheaper)
SHORT = [[{"role": "user", "content": text}] for text in (
    "Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
    "List ten fruits and their colours.", "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about your holiday.", "Explain why the sky is blue.",
    "Describe your favourite meal and how to cook it.", "Write a poem about the sea.")]
MESSAGES = CHATS


def _client(base_url: str):
    import openai

    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=900)


def run_clients(base_url: str, clients: int, requests: int, max_tokens: int) -> dict:
    """C clients at once, each `requests` requests in a row; their tokens and times."""
    c = _client(base_url)
    model = c.models.list().data[0].id
    for messages in MESSAGES[-3:]:  # warm: the cost profile of this server's setting
        c.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    per_client: list[dict] = [dict(tokens=0, seconds=0.0) for _ in range(clients)]
    errors: list[str] = []
    start = threading.Barrier(clients)

    def one(i):
        cl = _client(base_url)
        try:
            start.wait()
            for r in range(requests):
                messages = MESSAGES[(i * requests + r) % len(MESSAGES)]
                t0 = time.monotonic()
                out = cl.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
                per_client[i]["seconds"] += time.monotonic() - t0
                per_client[i]["tokens"] += out.usage.completion_tokens
        except Exception as exc:  # reported in the table's JSON
            errors.append(f"client {i}: {exc}")

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    tokens = sum(p["tokens"] for p in per_client)
    return {"clients": clients, "tokens": tokens, "wall_s": wall, "aggregate_tok_s": tokens / wall if wall else 0.0,
            "per_client_tok_s": statistics.mean(p["tokens"] / p["seconds"] if p["seconds"] else 0.0
                                                for p in per_client),
            "errors": errors}


# llama-server's speculation settings (flags of the pinned build's common/arg.cpp); its n-gram
# drafts share one state across slots and never turn off under load (llama.cpp PR 22838)
LLAMA_SERVER_SPECS = {
    "plain": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],  # its defaults: 12-token lookups
    "ngram-simple-n3": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
}


class LlamaServer:
    """llama-server on a free loopback port (its own OpenAI-compatible API)."""

    def __init__(self, exe, target, parallel, n_ctx, threads, spec_args: list[str]):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = [str(exe), "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port), "-np", str(parallel),
                "-c", str(n_ctx * parallel), "-t", str(threads), "-tb", str(threads), "-ngl", "0", "-fa", "off",
                "--no-webui", *spec_args]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        import urllib.request

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not start")

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="runs of every cell (the whole sweep again); the best counts")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--slots", type=int, default=4, help="the --parallel of the parallel rows")
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--target", default=None, help="a GGUF (default: the embedded Gemma 3 270M Q4_K_M)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llama-server", default=None, help="a llama-server binary for its rows")
    ap.add_argument("--llama-server-specs", default=",".join(LLAMA_SERVER_SPECS),
                    help=f"llama-server settings to run (of {','.join(LLAMA_SERVER_SPECS)})")
    ap.add_argument("--prompts", choices=("chat", "short"), default="chat",
                    help="chat: the instruct requests (documents, JSON, code); short: one-line requests")
    ap.add_argument("--out", default=str(ROOT / "bench" / "parallel.json"))
    a = ap.parse_args()
    global MESSAGES
    MESSAGES = CHATS if a.prompts == "chat" else SHORT
    counts = [int(x) for x in a.clients.split(",") if x]
    if not counts or min(counts) < 1 or min(a.requests, a.max_tokens, a.repeat) < 1 or not 1 <= a.slots <= 64:
        sys.exit("error: --clients are whole numbers >= 1; --requests, --max-tokens and --repeat >= 1; "
                 "--slots in 1..64")
    specs = [x for x in a.llama_server_specs.split(",") if x]
    if set(specs) - set(LLAMA_SERVER_SPECS):
        sys.exit(f"error: --llama-server-specs takes some of {','.join(LLAMA_SERVER_SPECS)}")
    if a.llama_server and not os.access(a.llama_server, os.X_OK):
        sys.exit(f"error: --llama-server {a.llama_server} is not an executable")
    from specgguf.runtime.defaults import default_target

    target = a.target or default_target()
    # the servers' cost profiles in a private cache, learned by the warm-up requests (the one-at-a-time
    # rows run first: a parallel server starts from their one-sequence profile, as a user's would)
    import tempfile

    os.environ["SPECGGUF_CACHE"] = tempfile.mkdtemp(prefix="specgguf-bench-")
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load[0]:.2f}; {Path(str(target)).name}, "
          f"{a.prompts} requests, greedy, up to {a.max_tokens} tokens, {a.requests} per client")
    rows: dict = {}
    runs: dict = {}
    for rep in range(a.repeat):  # the whole sweep again: a slow moment of the machine hits one run of a cell
        for draft in (a.draft, None):
            name = Path(draft).name if draft else "plain"  # a file by its name: no machine paths in tables
            for label, slots in ((f"specgguf one-at-a-time ({name})", 1),
                                 (f"specgguf --parallel {a.slots} ({name})", a.slots)):
                for c in counts:
                    args = [target, "--ctx", a.ctx, "--parallel", slots, "--threads", a.threads,
                            "--max-queue", 64] + (["--draft", draft] if draft else [])
                    with start_server(*args) as server:
                        r = run_clients(server.base_url, c, a.requests, a.max_tokens)
                    runs.setdefault(label, {}).setdefault(c, []).append(r)
                    print(f"  {label}, {c} clients: {r['aggregate_tok_s']:.1f} tok/s aggregate")
        if a.llama_server:
            for spec in specs:
                label = f"llama-server -np {a.slots} ({spec})"
                for c in counts:
                    server = LlamaServer(a.llama_server, target, a.slots, a.ctx, a.threads, LLAMA_SERVER_SPECS[spec])
                    try:
                        r = run_clients(server.base_url, c, a.requests, a.max_tokens)
                    finally:
                        server.close()
                    r["setting"] = spec
                    runs.setdefault(label, {}).setdefault(c, []).append(r)
                    print(f"  {label}, {c} clients: {r['aggregate_tok_s']:.1f} tok/s aggregate")
    for label, by_c in runs.items():
        rows[label] = {c: max(rs, key=lambda r: r["aggregate_tok_s"]) for c, rs in by_c.items()}
    speculating = [label for label in rows if label.startswith("llama-server") and not label.endswith("(plain)")]
    if speculating:  # its best setting at each client count (the setting is in the JSON)
        rows[f"llama-server -np {a.slots} (best speculation)"] = {
            c: max((rows[label][c] for label in speculating), key=lambda r: r["aggregate_tok_s"]) for c in counts}
    md = ["| row | " + " | ".join(f"{c} client{'s' if c > 1 else ''}" for c in counts) + " |",
          "| --- |" + " ---: |" * len(counts)]
    for label, by_c in rows.items():
        md.append(f"| {label} | " + " | ".join(f"{by_c[c]['aggregate_tok_s']:.1f} ({by_c[c]['per_client_tok_s']:.1f})"
                                              for c in counts) + " |")
    print(f"\naggregate tokens/s (mean per-client tokens/s), best of {a.repeat}:\n")
    print("\n".join(md))
    errors = [e for by_c in rows.values() for r in by_c.values() for e in r["errors"]]
    if errors:
        print(f"\n{len(errors)} client errors, e.g. {errors[0]}")
    load_end = os.getloadavg()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"arch": platform.machine(), "cores": os.cpu_count(), "load_start": load,
                                           "load_end": load_end},
                               "target": str(target), "requests": a.requests, "max_tokens": a.max_tokens,
                               "slots": a.slots, "prompts": a.prompts, "repeat": a.repeat, "rows": rows,
                               "runs": runs, "markdown": "\n".join(md)}, indent=1))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
