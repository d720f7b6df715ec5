#!/usr/bin/env python3
"""Benchmark: specgguf's model-free drafts side by side with their peers, one machine, one run.

Rows (greedy, the same libllama for everyone: LLAMA_CPP_LIB_PATH points at the C++ tool's
folder before llama_cpp is imported, as in bench_vs_cpp.py):
  cpp ngram-simple / ngram-mod     llama-speculative-simple --spec-type ..., its defaults
                                   (pinned build: ngram-simple size-n 12, size-m 48; ngram-mod
                                   n-match 24, n-min 48, n-max 64)
  cpp ... m=M                      the same at its best draft length, swept first:
                                   --spec-ngram-simple-size-m M, or --spec-ngram-mod-n-max M
  llama-cpp-python lookup          Llama(draft_model=LlamaPromptLookupDecoding()), its defaults
  specgguf plain / ngram / suffix  --draft-max auto, warm cost profile (`ngram` is the README's
                                   demo command, the default a user is shown)
  specgguf ngram first run         the same with an empty profile cache (a new user's first run)
Every run of a specgguf row opens a new SpecGGUF (no suffix store carried from the run
before; the agentic loop below is where it is meant to carry). The C++ tool stops after the
round that passes -n, so it decodes up to one draft more than asked: every other row decodes
as many tokens as the C++ runs of that prompt did (their median), so all rows do the same work.

Single prompts: copy a list (the README demo), copy a function, edit a function, reformat a
JSON document, open-ended prose. Rows run interleaved, --repeat times, and the fastest run of
each counts (the machine is shared). Decode tokens/s, prompt excluded, for everyone:
C++ prints its decode time; llama-cpp-python is timed from its first streamed token; specgguf
reports its own. py us/round: specgguf's time per round outside llama_process (the Python
loop's own cost), beside the C++ tool's whole round (ms).

Agentic loop: --turns requests through one SpecGGUF (the Python API, as an app embeds it),
each a fresh prompt in which an editing agent re-reads the file its previous turn wrote and
asks for the next version: the suffix store carries what the earlier turns wrote. Reported:
tokens/s over all turns, beside the lookup ceiling: what a drafter would reach if every round
drafted 64 tokens and all were accepted, from a 65-token verify pass timed in the same run. On
a CPU a verify pass costs about a third of a plain pass per position (the output layer is
computed for every row), so no lookup gets past about three times plain there.

Instruct (--instruct, run instead of the above): what a chat app sees, on the real instruct
model SmolLM2-135M-Instruct (the default chat target) through its chat template
(create_chat_completion, greedy). Three kinds of request, a few items each, every one a fresh
prompt on a new SpecGGUF (no earlier output carried): document QA (a manual or a log, and a
question whose answer quotes it), JSON rewrite (a 12-field record, one field changed or
renamed, the whole record back) and bug fix (a ~25-line function, its bug described, the whole
fixed function back). Rows: specgguf plain / ngram (default) / suffix, all asked for the same
--max-tokens (an answer may end sooner at end-of-generation: its tokens are reported), and the
lookup ceiling of each kind (as above, after the kind's first chat prompt). Per kind: decode
tokens/s over its items (the fastest run of each item), the speedup over plain, the share of
drafts accepted, the mean draft length (drafted tokens per round) and whether every answer is
plain's text. No C++ row (the C++ tool has no chat template), so the C++ tool is not needed:
without it llama_cpp's own libllama runs the rows.

    python scripts/bench_side_by_side.py [--max-tokens 128] [--repeat 3] [--turns 6]
                                         [--threads N] [--out bench/side_by_side.json]
    python scripts/bench_side_by_side.py --instruct [--max-tokens 256] [--repeat 3]
                                         [--out bench/side_by_side_instruct.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import cpp_baseline  # noqa: E402  (the tool's location, shared with the tests)

# every row runs the C++ tool's libllama when it is built; without it only --instruct (no C++
# row) can run, on llama_cpp's own library: main() refuses the rest
CPP_TOOL = cpp_baseline.find_tool()
if CPP_TOOL is not None:
    os.environ["LLAMA_CPP_LIB_PATH"] = str(cpp_baseline.lib_dir())  # before llama_cpp is imported

from specgguf.runtime import native  # noqa: E402
from specgguf.api import SpecGGUF  # noqa: E402
from specgguf.runtime.defaults import default_chat_target, default_target  # noqa: E402

from bench_prompts import COPY_PROMPTS, FUNCTION, INSTRUCT, PROMPTS, TASKS  # noqa: E402


# -- peers ---------------------------------------------------------------------------------

def cpp_run(target, prompt, spec_type, size_m, max_tokens, threads, n_ctx=4096) -> dict:
    """One greedy run of llama-speculative-simple with a model-free --spec-type at its defaults
    (size_m None) or with drafts of size_m tokens."""
    exe = cpp_baseline.find_tool()
    with tempfile.TemporaryDirectory() as d:
        pfile = cpp_baseline.write_prompt_file(Path(d) / "prompt.txt", prompt)
        args = [str(exe), "-m", str(target), "-f", str(pfile), "-n", str(max_tokens), "-c", str(n_ctx),
                "-fit", "off", "-fa", "off", "-ngl", "0", "--temp", "0", "--top-k", "1", "-s", "42",
                "-t", str(threads), "-tb", str(threads), "--spec-type", spec_type]
        if size_m is not None and spec_type == "ngram-simple":
            args += ["--spec-ngram-simple-size-m", str(size_m)]
        elif size_m is not None:  # ngram-mod's draft length: n-max (its n-min may not exceed it)
            args += ["--spec-ngram-mod-n-max", str(size_m), "--spec-ngram-mod-n-min", str(min(size_m, 48))]
        proc = subprocess.run(args, capture_output=True, timeout=600)
    err = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {err[-2000:]}")
    run = cpp_baseline.parse(proc.stdout.decode("utf-8", "replace"), err, max_tokens, args)
    rounds = run.n_predict - run.n_accept  # every round commits its accepted drafts plus one token
    return {"tok_s": run.tokens_per_second, "tokens": run.n_predict, "rounds": rounds,
            "accepted": run.n_accept, "drafted": run.n_drafted,
            "round_ms": 1e3 * run.decode_s / max(rounds, 1)}


class LcpLookup:
    """llama-cpp-python's own prompt lookup (LlamaPromptLookupDecoding, its defaults)."""

    def __init__(self, target, threads, n_ctx=4096):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.llm = Llama(model_path=str(target), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         draft_model=LlamaPromptLookupDecoding(), verbose=False, logits_all=False)

    def run(self, prompt, max_tokens) -> dict:
        self.llm.reset()
        t0 = time.perf_counter()
        first, chunks, reason = None, 0, None
        for chunk in self.llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1,
                                                stream=True):
            chunks += 1  # one per token, but for a character split across tokens
            first = first or time.perf_counter()
            reason = chunk["choices"][0].get("finish_reason") or reason
        end = time.perf_counter()
        toks = max_tokens if reason == "length" else chunks
        tok_s = (toks - 1) / (end - first) if first and end > first and toks > 1 else 0.0
        return {"tok_s": tok_s, "tokens": toks, "wall_s": end - t0}


# -- specgguf --------------------------------------------------------------------------------

class DecodeTimer:
    """Wall time inside llama_process on every context (the rest of a round is Python)."""

    def __init__(self):
        self.seconds = 0.0
        self._orig = native.Context.decode

    def __enter__(self):
        orig, timer, clock = self._orig, self, time.perf_counter

        def timed(ctx, batch):
            t0 = clock()
            try:
                return orig(ctx, batch)
            finally:
                timer.seconds += clock() - t0

        native.Context.decode = timed
        return self

    def __exit__(self, *exc):
        native.Context.decode = self._orig


def spec_run(target, draft, prompt, max_tokens, threads, cache_dir) -> dict:
    os.environ["SPECGGUF_CACHE"] = str(cache_dir)
    with SpecGGUF(target, draft=draft, n_ctx=4096, n_threads=threads) as llm:
        toks = llm.tokenize(prompt)
        with DecodeTimer() as timer:
            gen, text = llm.stream_tokens(toks, max_tokens)
            for _ in text:
                pass
        s = gen.stats
        in_llama = timer.seconds - s.prefill_s  # the prefill's decodes are not rounds
    return {"tok_s": s.generated_tokens / s.decode_s if s.decode_s else 0.0, "tokens": s.generated_tokens,
            "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
            "py_us_round": 1e6 * max(s.decode_s - in_llama, 0.0) / max(s.rounds, 1),
            "mean_draft": s.drafted / max(s.rounds, 1)}


def agentic(target, draft, turns, max_tokens, threads, cache_dir) -> dict:
    """`turns` requests through one SpecGGUF, as an editing agent sends them: each re-reads the
    file from its editor tool (the previous turn's answer), passes one change request and
    lets the model write the file's next version (up to the next command line). The embedded
    base model mostly rewrites the file as it was: a copy-and-revise loop."""
    os.environ["SPECGGUF_CACHE"] = str(cache_dir)
    current, tokens, seconds = FUNCTION, 0, 0.0
    with SpecGGUF(target, draft=draft, n_ctx=4096, n_threads=threads) as llm:
        for t in range(turns):
            prompt = (f"$ editor read moving_average.py  # version {t + 1}\n{current}\n"
                      f"$ editor request  # {TASKS[t % len(TASKS)]}\n"
                      f"$ editor write moving_average.py  # version {t + 2}\n")
            r = llm.generate(prompt, max_tokens=max_tokens, stop=["\n$ "])
            tokens, seconds = tokens + r.stats.generated_tokens, seconds + r.stats.decode_s
            current = r.text.strip() + "\n" if r.text.strip() else current
    return {"tok_s": tokens / seconds if seconds else 0.0, "tokens": tokens}


def chat_run(target, draft, messages, max_tokens, threads, cache_dir) -> dict:
    """One greedy request through create_chat_completion (the chat template, as an app sends
    it), on a new SpecGGUF: no suffix store or prompt cache carried from another request."""
    os.environ["SPECGGUF_CACHE"] = str(cache_dir)
    with SpecGGUF(target, draft=draft, n_ctx=4096, n_threads=threads) as llm:
        r = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0.0)
    s, choice = r["specgguf"], r["choices"][0]  # specgguf: GenerationStats.to_dict()
    return {"tok_s": s["generated_tokens"] / s["decode_s"] if s["decode_s"] else 0.0,
            "tokens": s["generated_tokens"], "decode_s": s["decode_s"], "rounds": s["rounds"],
            "drafted": s["drafted"], "accepted": s["accepted"], "mean_draft": s["drafted"] / max(s["rounds"], 1),
            "finish_reason": choice["finish_reason"], "text": choice["message"]["content"]}


def lookup_ceiling(target, prompt, width, threads, reps=5) -> dict:
    """The most any lookup drafter can reach on this machine: every round a `width`-token draft
    that is wholly accepted (width + 1 tokens per verify pass), beside one token per plain pass.
    Both passes timed on one warm context, fastest of `reps` (the wide one once first, untimed,
    so that its cold first pass does not count). A drafter's rate over this ceiling says how
    much of the speed on offer it takes; the rest is the target's own cost per position.
    prompt: text, or chat messages (a list), rendered by the model's chat template."""
    with SpecGGUF(target, n_ctx=4096, n_threads=threads) as llm:
        ctx, batch = llm.target.ctx, llm.target.batch
        toks = llm.chat_prompt(prompt) if isinstance(prompt, list) else llm.tokenize(prompt)
        batch.clear().add_tokens(toks, 0, "last")
        ctx.decode(batch)
        pos = len(toks)
        rows = (toks * (width // len(toks) + 2))[:width + 1]

        def pass_s(n):
            batch.clear().add_tokens(rows[:n], pos, "all")
            t0 = time.perf_counter()
            ctx.decode(batch)
            dt = time.perf_counter() - t0
            ctx.seq_rm(pos)
            return dt

        pass_s(width + 1)
        wide = min(pass_s(width + 1) for _ in range(reps))
        one = min(pass_s(1) for _ in range(reps))
    return {"width": width, "verify_ms": wide * 1e3, "plain_ms": one * 1e3,
            "tok_s": (width + 1) / wide, "plain_tok_s": 1 / one}


# -- the benchmark ---------------------------------------------------------------------------

def best(runs: list[dict]) -> dict:
    return max(runs, key=lambda r: r["tok_s"])


INSTRUCT_ROWS = {"specgguf plain": None, "specgguf ngram (default)": "ngram", "specgguf suffix": "suffix"}


def instruct(a) -> int:
    """--instruct: the chat rows of every kind of request, their table and their JSON."""
    target = default_chat_target()
    warm_cache = Path(tempfile.mkdtemp(prefix="specgguf-bench-")) / "warm"
    lib = str(cpp_baseline.lib_dir()) if CPP_TOOL is not None else "llama_cpp's own"
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{a.threads} threads; SmolLM2-135M-Instruct Q4_1, chat template; up to {a.max_tokens} tokens, "
          f"greedy, best of {a.repeat}; libllama: {lib}")
    messages = {kind: {item: [{"role": "user", "content": text}] for item, text in items.items()}
                for kind, items in INSTRUCT.items()}
    # warm the specgguf profiles of this model (a user's second run), outside the measured runs
    first = next(iter(messages["document QA"].values()))
    for draft in ("ngram", "suffix"):
        chat_run(target, draft, first, a.max_tokens, a.threads, warm_cache)
    runs: dict = {row: {item: [] for items in messages.values() for item in items} for row in INSTRUCT_ROWS}
    for rep in range(a.repeat):  # interleaved: every row of an item before the next item
        for items in messages.values():
            for item, m in items.items():
                for row, draft in INSTRUCT_ROWS.items():
                    runs[row][item].append(chat_run(target, draft, m, a.max_tokens, a.threads, warm_cache))
        print(f"  repeat {rep + 1}/{a.repeat} done")
    # the ceiling after each kind's first prompt: a verify pass costs more the longer the context
    ceiling = {kind: lookup_ceiling(target, next(iter(items.values())), 64, a.threads)
               for kind, items in messages.items()}

    # per kind: the fastest run of each item, added up (tokens over decode seconds); the text
    # counts as plain's only when every run of every item of the kind is plain's fastest run's
    plain_text = {item: best(r)["text"] for item, r in runs["specgguf plain"].items()}
    table: dict = {}
    for kind, items in messages.items():
        table[kind] = {}
        for row in INSTRUCT_ROWS:
            fastest = [best(runs[row][item]) for item in items]
            n = {k: sum(r[k] for r in fastest) for k in ("tokens", "decode_s", "rounds", "drafted", "accepted")}
            table[kind][row] = dict(
                n, tok_s=n["tokens"] / n["decode_s"] if n["decode_s"] else 0.0,
                item_tokens=[r["tokens"] for r in fastest], finish=[r["finish_reason"] for r in fastest],
                acceptance=n["accepted"] / n["drafted"] if n["drafted"] else 0.0,
                mean_draft=n["drafted"] / max(n["rounds"], 1),
                same_as_plain=sum(all(r["text"] == plain_text[item] for r in runs[row][item]) for item in items))
        c = ceiling[kind]
        table[kind]["lookup ceiling"] = {"tok_s": c["tok_s"], "mean_draft": c["width"], "acceptance": 1.0}
        for r in table[kind].values():
            r["vs_plain"] = r["tok_s"] / table[kind]["specgguf plain"]["tok_s"]

    print("\nplain's answers (first line; tokens, finish):")
    for kind, items in messages.items():
        for item in items:
            r = best(runs["specgguf plain"][item])
            line = r["text"].strip().splitlines()[0] if r["text"].strip() else ""
            print(f"  {item:<16} {r['tokens']:>4} {r['finish_reason']:<7} {line[:70]!r}")
    md = ["| kind | row | tokens (per item) | tok/s | vs plain | accepted | mean draft | text = plain's |",
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for kind, rows in table.items():
        for row, r in rows.items():
            if row == "lookup ceiling":
                cells = [f"{ceiling[kind]['width'] + 1} per pass", f"{r['tok_s']:.1f}", f"{r['vs_plain']:.2f}",
                         "all", str(r["mean_draft"]), "-"]
            else:
                drafts = row != "specgguf plain"
                cells = ["+".join(map(str, r["item_tokens"])), f"{r['tok_s']:.1f}", f"{r['vs_plain']:.2f}",
                         f"{100 * r['acceptance']:.0f}%" if drafts else "-",
                         f"{r['mean_draft']:.1f}" if drafts else "-",
                         f"{r['same_as_plain']}/{len(messages[kind])}" if drafts else "-"]
            md.append(f"| {kind} | {row} | " + " | ".join(cells) + " |")
    print(f"\ninstruct requests, decode tokens/s per kind (best of {a.repeat} per item; up to {a.max_tokens} "
          "tokens, fewer where the answer ended):\n")
    print("\n".join(md))
    out = save(a, load, "side_by_side_instruct.json", {
        "model": "SmolLM2-135M-Instruct Q4_1 (default chat target)", "libllama": lib,
        "max_tokens": a.max_tokens, "repeat": a.repeat,
        "instruct": {"requests": INSTRUCT, "runs": runs, "best": table, "ceiling": ceiling,
                     "markdown": "\n".join(md)},
    })
    print(f"saved {out}")
    return 0


def save(a, load, default_name: str, fields: dict) -> Path:
    """Print the load at the end and write the JSON (the machine's state, then `fields`) to
    --out, or bench/`default_name`."""
    load_end = os.getloadavg()
    print(f"load at the end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    out = Path(a.out or ROOT / "bench" / default_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"arch": platform.machine(), "cores": os.cpu_count(), "threads": a.threads,
                                           "load_start": load, "load_end": load_end}, **fields}, indent=1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=None, help="default 128; 256 with --instruct (whole answers)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--threads", type=int, default=native.default_threads())
    ap.add_argument("--sizes", default="8,16,32,48,64", help="draft lengths swept for the C++ rows")
    ap.add_argument("--prompts", default=",".join(PROMPTS))
    ap.add_argument("--instruct", action="store_true",
                    help="run the instruct section instead: chat requests on SmolLM2-135M-Instruct "
                         "(no C++ tool needed)")
    ap.add_argument("--out", default=None,
                    help="default bench/side_by_side.json (--instruct: bench/side_by_side_instruct.json)")
    a = ap.parse_args()
    a.max_tokens = a.max_tokens if a.max_tokens is not None else 256 if a.instruct else 128
    if a.max_tokens < 1 or a.repeat < 1 or a.turns < 5:
        sys.exit("error: --max-tokens and --repeat must be >= 1, --turns >= 5")
    if a.instruct:
        return instruct(a)
    if CPP_TOOL is None:
        sys.exit(f"error: {cpp_baseline.TOOL} is not built; run scripts/build_llama_cpp_tools.sh first")
    prompts = [p for p in a.prompts.split(",") if p]
    unknown = [p for p in prompts if p not in PROMPTS]
    if unknown:
        sys.exit(f"error: unknown prompt(s) {', '.join(unknown)}; choose from {', '.join(PROMPTS)}")
    target = default_target()
    work = Path(tempfile.mkdtemp(prefix="specgguf-bench-"))
    warm_cache = work / "warm"
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"{a.threads} threads; Gemma 3 270M Q4_K_M; {a.max_tokens} tokens, greedy, best of {a.repeat}")

    # the C++ best --spec-ngram-size-m: swept once over the copy prompts (sum of tokens/s)
    best_m = {}
    for spec_type in ("ngram-simple", "ngram-mod"):
        score = {}
        for m in [int(x) for x in a.sizes.split(",")]:
            try:
                score[m] = sum(cpp_run(target, PROMPTS[p], spec_type, m, a.max_tokens, a.threads)["tok_s"]
                               for p in prompts if p in COPY_PROMPTS)
            except RuntimeError as exc:
                print(f"  {spec_type} m={m}: {str(exc).splitlines()[-1]}")
        best_m[spec_type] = max(score, key=score.get) if score else None
        print(f"  {spec_type}: best draft length {best_m[spec_type]} "
              f"({', '.join(f'{m}: {v:.0f}' for m, v in score.items())})")

    # warm the specgguf profiles (a user's second run), outside the measured runs
    for draft in ("ngram", "suffix"):
        spec_run(target, draft, PROMPTS[prompts[0]], a.max_tokens, a.threads, warm_cache)

    lcp = LcpLookup(target, a.threads)
    # every row is fn(prompt, tokens); C++ rows run first and overshoot -n by up to one draft
    # (they stop after the round that passes it); the other rows then decode as many tokens
    # as the C++ runs of that prompt did (their median), so that all rows do the same work
    rows = {"cpp ngram-simple": lambda p, n: cpp_run(target, p, "ngram-simple", None, n, a.threads),
            "cpp ngram-mod": lambda p, n: cpp_run(target, p, "ngram-mod", None, n, a.threads)}
    for spec_type, m in best_m.items():
        if m is not None:
            rows[f"cpp {spec_type} m={m}"] = (lambda st, mm: lambda p, n: cpp_run(target, p, st, mm, n,
                                                                                    a.threads))(spec_type, m)
    rows["llama-cpp-python lookup"] = lambda p, n: lcp.run(p, n)
    rows["specgguf plain"] = lambda p, n: spec_run(target, None, p, n, a.threads, warm_cache)
    rows["specgguf ngram (default)"] = lambda p, n: spec_run(target, "ngram", p, n, a.threads, warm_cache)
    rows["specgguf suffix"] = lambda p, n: spec_run(target, "suffix", p, n, a.threads, warm_cache)
    first_runs = iter(range(10 ** 6))
    rows["specgguf ngram first run"] = lambda p, n: spec_run(target, "ngram", p, n, a.threads,
                                                             work / f"empty-{next(first_runs)}")
    results: dict = {name: {p: [] for p in prompts} for name in rows}
    budget: dict = {}
    for rep in range(a.repeat):
        for p in prompts:
            for name, fn in rows.items():
                if not name.startswith("cpp ") and p not in budget:
                    made = sorted(results[n][p][-1]["tokens"] for n in rows if n.startswith("cpp "))
                    budget[p] = made[len(made) // 2] if made else a.max_tokens
                results[name][p].append(fn(PROMPTS[p], a.max_tokens if name.startswith("cpp ") else budget[p]))
        print(f"  repeat {rep + 1}/{a.repeat} done")
    agent = {d or "plain": [] for d in (None, "ngram", "suffix")}
    for rep in range(a.repeat):
        for d in (None, "ngram", "suffix"):
            agent[d or "plain"].append(agentic(target, d, a.turns, a.max_tokens * 2, a.threads, warm_cache))

    ceiling = lookup_ceiling(target, PROMPTS["edit-function"], 64, a.threads)

    table = {name: {p: best(runs) for p, runs in by_p.items()} for name, by_p in results.items()}
    head = f"{'row':<28}" + "".join(f"{p:>15}" for p in prompts)
    print("\ntokens decoded per prompt: C++ -n %d (it overshoots by up to a draft); the other rows: %s"
          % (a.max_tokens, ", ".join(f"{p} {n}" for p, n in budget.items())))
    print("tokens/s (best of %d); [mean draft, py us/round | C++ ms/round]" % a.repeat)
    print(head)
    text_rows, md_rows = [], []
    for name, by_p in table.items():  # one pass, two layouts: the terminal's and the README's
        cells, md = [], []
        for p in prompts:
            r = by_p[p]
            if "py_us_round" in r:
                extra, md_extra = f"{r['mean_draft']:.0f},{r['py_us_round']:.0f}", \
                    f" ({r['mean_draft']:.0f}; {r['py_us_round']:.0f} us)"
            elif "round_ms" in r:
                extra, md_extra = f"{r['round_ms']:.0f}ms", f" ({r['round_ms']:.0f} ms)"
            else:
                extra = md_extra = ""
            cells.append(f"{r['tok_s']:7.1f} {extra:>7}")
            md.append(f"{r['tok_s']:.1f}{md_extra}")
        text_rows.append(f"{name:<28}" + "".join(f"{c:>15}" for c in cells))
        md_rows.append(f"| {name} | " + " | ".join(md) + " |")
    print("\n".join(text_rows))
    print("\nthe same as a Markdown table (the README's):\n")
    print("| row | " + " | ".join(prompts) + " |")
    print("| --- |" + " ---: |" * len(prompts))
    print("\n".join(md_rows))
    agent_best = {k: best(v) for k, v in agent.items()}
    print(f"\nagentic loop, {a.turns} turns through the Python API (tokens/s over all turns, best of {a.repeat}):")
    for k, r in agent_best.items():
        print(f"  {k:<8} {r['tok_s']:7.1f}  ({r['tokens']} tokens)")
    print(f"  ceiling  {ceiling['tok_s']:7.1f}  (every round a {ceiling['width']}-token draft, all accepted: "
          f"{ceiling['width'] + 1} tokens per {ceiling['verify_ms']:.0f} ms verify; a plain pass "
          f"{ceiling['plain_ms']:.1f} ms)")

    ratios = {}
    plain = table["specgguf plain"]
    default = table["specgguf ngram (default)"]
    cpp_rows = [n for n in table if n.startswith("cpp ")]
    for p in prompts:
        best_cpp = max(table[n][p]["tok_s"] for n in cpp_rows)
        ratios[p] = {"default/plain": default[p]["tok_s"] / plain[p]["tok_s"],
                     "suffix/plain": table["specgguf suffix"][p]["tok_s"] / plain[p]["tok_s"],
                     "default/best_cpp": default[p]["tok_s"] / best_cpp,
                     "suffix/best_cpp": table["specgguf suffix"][p]["tok_s"] / best_cpp,
                     "first/warm": table["specgguf ngram first run"][p]["tok_s"] / default[p]["tok_s"]}
    ratios["agentic"] = {"suffix/ngram": agent_best["suffix"]["tok_s"] / agent_best["ngram"]["tok_s"],
                         "suffix/plain": agent_best["suffix"]["tok_s"] / agent_best["plain"]["tok_s"],
                         "ngram/ceiling": agent_best["ngram"]["tok_s"] / ceiling["tok_s"],
                         "suffix/ceiling": agent_best["suffix"]["tok_s"] / ceiling["tok_s"],
                         "ceiling/plain": ceiling["tok_s"] / agent_best["plain"]["tok_s"]}
    print("\nratios:")
    for p, r in ratios.items():
        print(f"  {p:<15} " + "  ".join(f"{k} {v:.2f}" for k, v in r.items()))
    out = save(a, load, "side_by_side.json", {
        "model": "Gemma 3 270M Q4_K_M (embedded default)", "max_tokens": a.max_tokens, "repeat": a.repeat,
        "best_size_m": best_m, "tokens": budget, "runs": results, "best": table, "agentic": agent,
        "ceiling": ceiling, "ratios": ratios,
    })
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
