#!/usr/bin/env python3
"""The measuring half of scripts/gpu_check.sh (run it through that script, which builds the
libraries and sets LLAMA_CPP_LIB_PATH): real-shaped synthetic models, then one table and JSON.

Models (random weights, written straight in their quantised block formats, so an 8B-shaped
file takes seconds, not a quantisation run): a Qwen3-8B-shaped target (36 layers, width
4096, 32/8 heads of 128, FFN 12288, Q4_K blocks with a Q6_K output head like Q4_K_M) with
the real vocabulary size, 151936 tokens, and a DeepSpec-shaped DSpark draft for it (5 layers,
reads target layers 2,10,18,26,34, block 7, Markov rank 256, confidence head, Q8_0, the
target's embeddings and head shared). --small shrinks the widths and depths, never the
vocabulary. Random weights measure costs; acceptance is whatever such models give, identical
on both sides of each comparison.

Also written, at the same shapes and Q8_0: a DFlash draft (the DSpark layout without the Markov
and confidence heads) and a 3-layer EAGLE-3 draft sharing the target's embeddings and head.

Measured, greedy, both sides on the same libllama:
  plain      specgguf tokens/s without a draft
  verify     ms per target batch of width 1..64 (the verify-cost curve)
  ngram      specgguf prompt lookup (n-grams of exactly NGRAM_N tokens) vs llama-speculative-simple
             --spec-type ngram-simple --spec-ngram-simple-size-n NGRAM_N: equal work (its default
             size_n = 12 drafts nothing on this prompt); drafted tokens of both sides are shown
  suffix     specgguf's suffix lookup (no C++ counterpart)
  dspark     vs --spec-type draft-dspark, same draft file
  dflash     vs --spec-type draft-dflash, same draft file
  eagle3     vs --spec-type draft-eagle3, same draft file
  hybrid     suffix + the dspark draft (no C++ counterpart)
  mtp        Gemma 4's assistant (gemma4-assistant, width 128) on a gemma4 target of the small
             widths in both modes, F32, its vocabulary padded to 151936 tokens, vs --spec-type
             draft-mtp on the same files
per fixed draft length: tokens/s of each side, their ratio, acceptance, and the Python time
per round (time outside llama_process per round, in microseconds). --trace adds the Python
time per round by phase (specgguf.decoding.trace: wall and thread CPU time, llama_process
excluded) to every row, printed as a second table and saved in the JSON as `trace`. Last,
scripts/probe_backend_sampling.py asks whether an arg-max in the target's graph (llama.cpp's
backend sampling) gives the logits' tokens on this build, and what it costs
(`backend_sampling` in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import cpp_baseline  # noqa: E402  (runs and parses llama-speculative-simple)

from specgguf.runtime import native  # noqa: E402
from specgguf.drafters import make_drafter  # noqa: E402
from specgguf.decoding.engine import Engine  # noqa: E402
from specgguf.synthetic.gemma4 import Gemma4Shape, write_gemma4, write_gemma4_assistant  # noqa: E402
from specgguf.synthetic.qwen3 import SPECIALS, finish_gguf, train_bpe  # noqa: E402
from specgguf.runtime.target import Target  # noqa: E402
from specgguf.decoding import trace as round_trace  # noqa: E402

N_VOCAB = 151936  # Qwen3's
GEMMA_VOCAB = 262144  # the embedded Gemma 3 270M's (--gemma)
FULL = dict(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=12288,
            draft_layers=5, target_layers=(2, 10, 18, 26, 34), markov_rank=256, eagle3_layers=(2, 18, 33))
SMALL = dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
             draft_layers=1, target_layers=(1, 2, 3), markov_rank=32, eagle3_layers=(1, 2, 3))
KINDS = ("ngram", "suffix", "dspark", "dflash", "eagle3", "hybrid", "mtp")
NGRAM_N = 3  # n-gram length of both sides' lookups (ours: ngram_min = ngram_max)
WIDTHS = (1, 2, 4, 8, 16, 32, 64)
# The mtp row's gemma4 target (an assistant reads a gemma4 target's cache): the small widths in
# both modes, since its Python per round follows the vocabulary, not the width; F32; the
# vocabulary padded to the Qwen3 rows' N_VOCAB, so that every row is costed at one width.
GEMMA4 = Gemma4Shape(n_layer=4, swa_pattern=(True, True, True, False), n_embd=256, n_head=4, n_head_kv=2,
                     n_head_kv_full=1, head_dim=64, head_dim_swa=32, n_ff=512, sliding_window=512,
                     n_vocab=N_VOCAB)
GEMMA4_ASSISTANT_WIDTH = 128
PROMPT = ("Copy the list exactly.\n1. red green blue\n2. one two three\n3. alpha beta gamma\n"
          "1. red green blue\n2. one two three\n3. alpha beta gamma\n1. red green blue\n2. one")


# -- model files --------------------------------------------------------------------------

def _blocks(kind: str, rng, rows: int, cols: int, block: int, nbytes: int, d_at: int, d: float, dmin_at=None,
            dmin=0.0):
    """`rows` x `cols` weights as random quantised blocks of GGML type `kind` (`nbytes` bytes per
    `block` values) with the block scale(s) set to `d` (and `dmin`): a page of random blocks,
    repeated. Returns (bytes as uint8 rows, kind)."""
    n = rows * cols // block
    page = rng.integers(0, 256, size=(min(n, 8192), nbytes), dtype=np.uint8)
    page[:, d_at:d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    if dmin_at is not None:
        page[:, dmin_at:dmin_at + 2] = np.frombuffer(np.float16(dmin).tobytes(), np.uint8)
    return np.resize(page, (n, nbytes)).reshape(rows, cols // block * nbytes), kind


def _q4_k(rng, rows, cols, std):  # d*sc*q - dmin*m, sc, m < 64, q < 16: centred, std ~ 250 d
    d = std / 250
    return _blocks("Q4_K", rng, rows, cols, 256, 144, 0, d, 2, 7.5 * d)


def _q6_k(rng, rows, cols, std):  # d*sc*(q-32), int8 sc: std ~ 1300 d
    return _blocks("Q6_K", rng, rows, cols, 256, 210, 208, std / 1300)


def _q8_0(rng, rows, cols, std):  # d*q, int8 q: std ~ 74 d
    return _blocks("Q8_0", rng, rows, cols, 32, 34, 0, std / 74)


def _tokenizer(w) -> None:
    """A byte-level BPE (synthetic.train_bpe) padded to the real 151936 tokens with tokens no
    merge produces; their texts use the byte alphabet, so any of them detokenizes."""
    base, merges = train_bpe(250)
    n_fill = N_VOCAB - len(base) - len(SPECIALS)
    tokens = base + [f"\u0120\u0120{i}" for i in range(n_fill)] + SPECIALS
    assert len(set(tokens)) == N_VOCAB
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (N_VOCAB - len(SPECIALS)) + [3] * len(SPECIALS))
    w.add_token_merges(merges)
    eos = tokens.index("<|endoftext|>")
    w.add_eos_token_id(eos)
    w.add_bos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_mask_token_id(tokens.index("<|mask|>"))


def _common_keys(w, s: dict, n_layer: int) -> None:
    w.add_context_length(40960)
    w.add_embedding_length(s["n_embd"])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)
    _tokenizer(w)


def _layers(t: dict, rng, s: dict, n_layer: int, quant) -> None:
    H, hd, I = s["n_embd"], s["head_dim"], s["n_ff"]
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"], t[p + "ffn_norm.weight"] = ones(H), ones(H)
        t[p + "attn_q_norm.weight"], t[p + "attn_k_norm.weight"] = ones(hd), ones(hd)
        t[p + "attn_q.weight"] = quant(rng, s["n_head"] * hd, H, H ** -0.5)
        t[p + "attn_k.weight"] = quant(rng, s["n_head_kv"] * hd, H, H ** -0.5)
        t[p + "attn_v.weight"] = quant(rng, s["n_head_kv"] * hd, H, H ** -0.5)
        t[p + "attn_output.weight"] = quant(rng, H, s["n_head"] * hd, (s["n_head"] * hd) ** -0.5)
        t[p + "ffn_gate.weight"] = quant(rng, I, H, H ** -0.5)
        t[p + "ffn_up.weight"] = quant(rng, I, H, H ** -0.5)
        t[p + "ffn_down.weight"] = quant(rng, H, I, I ** -0.5)



def write_target(path: Path, s: dict, seed: int = 0) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name("synthetic-qwen3-8b-shape")
    _common_keys(w, s, s["n_layer"])
    w.add_file_type(15)  # MOSTLY_Q4_K_M
    H = s["n_embd"]
    t = {"token_embd.weight": _q4_k(rng, N_VOCAB, H, 1.0), "output_norm.weight": np.ones(H, np.float32),
         "output.weight": _q6_k(rng, N_VOCAB, H, H ** -0.5)}
    _layers(t, rng, s, s["n_layer"], _q4_k)
    return finish_gguf(w, t, path)


def write_dspark(path: Path, s: dict, seed: int = 1, markov: bool = True, block: int = 16) -> Path:
    """DeepSpec's DSpark layout as `specgguf convert --head shared` writes it (docs/gguf-formats.md);
    markov=False: its DFlash sibling (no Markov or confidence head). The block is 16 slots (DeepSpec
    trains 7): draft lengths up to 16 are measured."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name(f"synthetic-{'dspark' if markov else 'dflash'}-8b-shape")
    _common_keys(w, s, s["draft_layers"])
    w.add_file_type(7)  # MOSTLY_Q8_0
    w.add_array("dflash.target_layers", list(s["target_layers"]))
    w.add_uint32("dflash.block_size", block)
    w.add_bool("dflash.sample_from_anchor", True)
    H, R, K = s["n_embd"], s["markov_rank"], len(s["target_layers"])
    t = {"fc.weight": _q8_0(rng, H, K * H, (K * H) ** -0.5), "enc.output_norm.weight": np.ones(H, np.float32),
         "output_norm.weight": np.ones(H, np.float32)}
    if markov:
        w.add_bool("dflash.has_confidence_head", True)
        t.update({"markov_w1.weight": rng.standard_normal((N_VOCAB, R)).astype(np.float16),
                  "markov_w2.weight": (rng.standard_normal((N_VOCAB, R)) * R ** -0.5).astype(np.float16),
                  "conf_proj.weight": (rng.standard_normal((1, H + R)) * (H + R) ** -0.5).astype(np.float32),
                  "conf_proj.bias": np.array([0.5], np.float32)})
    _layers(t, rng, s, s["draft_layers"], _q8_0)
    return finish_gguf(w, t, path)


def write_eagle3(path: Path, s: dict, seed: int = 2) -> Path:
    """A classic 3-layer EAGLE-3 head (llama.cpp's `eagle3` arch, stock loader) of the target's width,
    one decoder layer, Q8_0, the target's embeddings and head borrowed through ctx_other."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "eagle3")
    w.add_name("synthetic-eagle3-8b-shape")
    _common_keys(w, s, 1)
    w.add_file_type(7)
    w.add_rope_dimension_count(s["head_dim"])
    layers = list(s["eagle3_layers"])
    H, hd, I = s["n_embd"], s["head_dim"], s["n_ff"]
    w.add_array("eagle3.target_layers", layers)
    w.add_uint32("eagle3.target_hidden_size", H)
    w.add_bool("eagle3.norm_before_residual", False)
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    t = {"fc.weight": _q8_0(rng, H, len(layers) * H, (len(layers) * H) ** -0.5), "output_norm.weight": ones(H),
         "blk.0.attn_norm.weight": ones(H), "blk.0.attn_norm_2.weight": ones(H), "blk.0.ffn_norm.weight": ones(H),
         "blk.0.attn_q.weight": _q8_0(rng, s["n_head"] * hd, 2 * H, (2 * H) ** -0.5),
         "blk.0.attn_k.weight": _q8_0(rng, s["n_head_kv"] * hd, 2 * H, (2 * H) ** -0.5),
         "blk.0.attn_v.weight": _q8_0(rng, s["n_head_kv"] * hd, 2 * H, (2 * H) ** -0.5),
         "blk.0.attn_output.weight": _q8_0(rng, H, s["n_head"] * hd, (s["n_head"] * hd) ** -0.5),
         "blk.0.ffn_gate.weight": _q8_0(rng, I, H, H ** -0.5), "blk.0.ffn_up.weight": _q8_0(rng, I, H, H ** -0.5),
         "blk.0.ffn_down.weight": _q8_0(rng, H, I, I ** -0.5)}
    return finish_gguf(w, t, path)


# -- measurements -------------------------------------------------------------------------

class DecodeTimer:
    """Wall time inside llama_process (Context.decode), on every context."""

    def __init__(self):
        self.seconds, self._orig = 0.0, native.Context.decode

    def __enter__(self):
        orig, timer = self._orig, self

        def timed(ctx, batch):
            t0 = time.perf_counter()
            try:
                return orig(ctx, batch)
            finally:
                timer.seconds += time.perf_counter() - t0

        native.Context.decode = timed
        return self

    def __exit__(self, *exc):
        native.Context.decode = self._orig


def run_ours(target, drafter, n: int, tokens, max_tokens: int, trace: bool = False) -> dict:
    """One greedy generation; trace=True adds the per-phase breakdown (`trace`), which costs
    the clocks' reads (a few us a round), so timed rows run without it."""
    tr = round_trace.RoundTrace() if trace else None
    with DecodeTimer() as timer:
        gen = Engine(target, drafter, n).generate(tokens, max_tokens, trace=tr)
        if tr is None:
            for _ in gen:
                pass
        else:
            with round_trace.timing_process(native.Context, tr):
                for _ in gen:
                    pass
    s = gen.stats
    rounds = max(s.rounds, 1)
    out = {"tokens": s.generated_tokens, "rounds": s.rounds, "decode_s": s.decode_s, "drafted": s.drafted,
           "tokens_per_second": s.generated_tokens / s.decode_s if s.decode_s > 0 else 0.0,
           "accept": s.accepted / s.drafted if s.drafted else 0.0,
           "python_us_per_round": 1e6 * max(s.decode_s - (timer.seconds - s.prefill_s), 0.0) / rounds}
    if tr is not None:
        out["trace"] = tr.per_round_us()
    return out


def kind_rows(args, target, tpath, tokens, kind: str, spec, cpp_type, cpp_draft, lengths, work,
              on_row=None) -> list[dict]:
    """One row per draft length for `kind`: specgguf (best of --repeat), the C++ loop on the same
    files where `cpp_type` names its --spec-type, and with --trace the breakdown by phase;
    `on_row(rows)` after each row."""
    gpu = ["-ngl", str(args.gpu_layers), "-ngld", str(args.gpu_layers), "-b", str(args.batch), "-ub", str(args.batch)]
    rows = []
    if args.no_cpp:
        cpp_type = None
    options = dict(ngram_min=NGRAM_N, ngram_max=NGRAM_N) if kind == "ngram" else {}
    for n in lengths:
        # a drafter per length: a block drafter's block is its --draft-max, as in the C++ loop
        drafter = make_drafter(str(spec), target, draft_max=n, n_threads=args.threads, **options)
        try:
            extra = gpu + (["--spec-ngram-simple-size-n", str(NGRAM_N), "--spec-ngram-simple-size-m", str(n)]
                           if kind == "ngram" else [])
            best_cpp = best_ours = cpp_error = None
            traces = []
            for _ in range(args.repeat):
                if cpp_type is not None and cpp_error is None:
                    try:
                        cpp = cpp_baseline.run_speculative_simple(
                            tpath, cpp_draft, PROMPT, n_predict=args.tokens, n_ctx=args.ctx, draft_max=n,
                            threads=args.threads, spec_type=cpp_type, verbose=False, workdir=work,
                            extra_args=extra)
                    except RuntimeError as exc:  # the C++ loop aborted on this backend: a row note, not the end
                        cpp_error = _cpp_failure(str(exc))
                        print(f"  {kind} n={n}: C++ failed: {cpp_error}", file=sys.stderr, flush=True)
                    else:
                        if best_cpp is None or cpp.tokens_per_second > best_cpp.tokens_per_second:
                            best_cpp = cpp
                ours = run_ours(target, drafter, n, tokens, args.tokens)
                if best_ours is None or ours["tokens_per_second"] > best_ours["tokens_per_second"]:
                    best_ours = ours
                if args.trace:
                    traces.append(run_ours(target, drafter, n, tokens, args.tokens, trace=True))
            cpp_tps = best_cpp.tokens_per_second if best_cpp is not None else None
            row = {"kind": kind, "draft_max": n, "ours_tokens_per_second": best_ours["tokens_per_second"],
                   "cpp_tokens_per_second": cpp_tps,
                   "ratio": best_ours["tokens_per_second"] / cpp_tps if cpp_tps else None,
                   "ours_accept": best_ours["accept"],
                   "cpp_accept": (best_cpp.n_accept / best_cpp.n_drafted if best_cpp is not None
                                  and best_cpp.n_drafted else 0.0),
                   "ours_drafted": best_ours["drafted"],
                   "cpp_drafted": best_cpp.n_drafted if best_cpp is not None else None,
                   "ours_rounds": best_ours["rounds"],
                   "cpp_rounds": best_cpp.n_predict - best_cpp.n_accept if best_cpp is not None else None,
                   "python_us_per_round": best_ours["python_us_per_round"]}
            if cpp_error is not None:
                row["cpp_error"] = cpp_error
            if traces:
                row["trace"] = best_trace(traces)
            rows.append(row)
            if on_row is not None:
                on_row(rows)
            print(f"  {kind} n={n}: ours {row['ours_tokens_per_second']:.1f} tok/s"
                  + (f", C++ {cpp_tps:.1f} tok/s" if cpp_tps else ""), file=sys.stderr, flush=True)
        finally:
            drafter.close()
    return rows


def _cpp_failure(message: str) -> str:
    """The line that says why llama-speculative-simple stopped: a GGML_ASSERT, else its exit code."""
    assertion = re.search(r"GGML_ASSERT\([^\n]*?\) failed", message)
    code = re.search(r"exited with (-?\d+)", message)
    signal = {"-11": " (SIGSEGV)", "-6": " (SIGABRT)"}.get(code.group(1), "") if code else ""
    return (assertion.group(0) + "; " if assertion else "") + (f"exit code {code.group(1)}{signal}" if code else message[:200])


def backend_sampling(tpath: Path, args, work: Path) -> dict:
    """scripts/probe_backend_sampling.py on the target, in a child process (a llama.cpp abort
    there costs only this entry): does an arg-max in the graph give the logits' tokens here,
    and at what cost."""
    out = work / "backend-sampling.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "probe_backend_sampling.py"), str(tpath),
           "--gpu-layers", str(args.gpu_layers), "--threads", str(args.threads), "--out", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 600 s"}
    if proc.returncode != 0 or not out.exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit code {proc.returncode}: {last[:300]}"}
    return json.loads(out.read_text())


def mtp_rows(args, result: dict, lengths, work: Path, on_row=None) -> list[dict]:
    """The mtp rows: Gemma 4's assistant on a gemma4 target (GEMMA4), against llama.cpp's
    --spec-type draft-mtp on the same files."""
    t0 = time.perf_counter()
    tpath = write_gemma4(work / "gemma4-f32.gguf", GEMMA4, seed=0, name="synthetic-gemma4-small")
    apath = write_gemma4_assistant(work / "gemma4-assistant-f32.gguf", GEMMA4, n_embd=GEMMA4_ASSISTANT_WIDTH)
    result["timings_s"]["write_gemma4"] = time.perf_counter() - t0
    result["model_mb"].update({"gemma4": tpath.stat().st_size / 1e6, "mtp": apath.stat().st_size / 1e6})
    result["gemma4_shape"] = {"n_layer": GEMMA4.n_layer, "n_embd": GEMMA4.n_embd, "n_vocab": GEMMA4.n_vocab,
                              "assistant_width": GEMMA4_ASSISTANT_WIDTH}
    target = Target(tpath, n_ctx=args.ctx, n_batch=args.batch, n_threads=args.threads,
                    n_gpu_layers=args.gpu_layers)
    try:
        tokens = target.tokenize(PROMPT)
        run_ours(target, None, 1, tokens, 8)  # warm-up
        return kind_rows(args, target, tpath, tokens, "mtp", apath, "draft-mtp", apath, lengths, work, on_row=on_row)
    finally:
        target.close()


def gemma_rows(args, lengths) -> dict:
    """Plain and ngram rounds, traced, on the embedded Gemma 3 270M (Q4_K_M, 262144 tokens): the
    loop's Python cost at the widest vocabulary specgguf ships with (specgguf's side only)."""
    from specgguf.runtime.defaults import default_target

    path = default_target()
    target = Target(path, n_ctx=args.ctx, n_batch=args.batch, n_threads=args.threads,
                    n_gpu_layers=args.gpu_layers)
    try:
        tokens = target.tokenize(PROMPT)
        out = {"model": path.name, "n_vocab": target.model.n_vocab, "rows": []}
        run_ours(target, None, 1, tokens, 8)  # warm-up
        runs = [run_ours(target, None, 1, tokens, args.tokens, trace=True) for _ in range(args.repeat)]
        out["rows"].append({"kind": "plain", "draft_max": 0, "trace": best_trace(runs),
                            "tokens_per_second": max(r["tokens_per_second"] for r in runs)})
        drafter = make_drafter("ngram", target, draft_max=max(lengths), ngram_min=NGRAM_N, ngram_max=NGRAM_N)
        for n in lengths:
            runs = [run_ours(target, drafter, n, tokens, args.tokens, trace=True) for _ in range(args.repeat)]
            out["rows"].append({"kind": "ngram", "draft_max": n, "trace": best_trace(runs),
                                "tokens_per_second": max(r["tokens_per_second"] for r in runs),
                                "accept": runs[0]["accept"], "drafted": runs[0]["drafted"]})
            print(f"  gemma ngram n={n} traced", file=sys.stderr, flush=True)
        return out
    finally:
        target.close()


def best_trace(runs: list[dict]) -> dict:
    """Per phase, the least of several traced runs (wall and CPU alike): the run least disturbed
    by other processes on a shared machine sets each figure."""
    first = runs[0]["trace"]
    out = dict(first)
    for clock in ("wall", "cpu"):
        out[clock] = {p: min(r["trace"][clock][p] for r in runs) for p in round_trace.PHASES}
        out[clock]["python"] = min(r["trace"][clock]["python"] for r in runs)
    return out


def verify_curve(target, tokens, widths, repeats: int) -> dict:
    """ms per target decode of `w` tokens with logits for all (a verification batch)."""
    ctx, batch = target.ctx, target.batch
    ctx.clear()
    batch.clear().add_tokens(tokens, 0, "last")
    ctx.decode(batch)
    pos, out = len(tokens), {}
    for w in widths:
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            batch.clear().add_tokens([tokens[i % len(tokens)] for i in range(w)], pos, "all")
            t0 = time.perf_counter()
            ctx.decode(batch)
            ctx.logits(w - 1)  # waits for the result
            times.append(time.perf_counter() - t0)
            ctx.seq_rm(pos)
        out[w] = 1e3 * statistics.median(times[1:])
    ctx.clear()
    return out


TARGET_FILE = "target-q4_k_m.gguf"
DRAFT_FILES = {"dspark": "dspark-q8_0.gguf", "dflash": "dflash-q8_0.gguf", "eagle3": "eagle3-q8_0.gguf"}
SIGNALS = {"-11": "SIGSEGV", "-6": "SIGABRT", "-7": "SIGBUS", "-4": "SIGILL", "-8": "SIGFPE", "-9": "SIGKILL"}


def run_part(args, part: str, work: Path, lengths: list[int]) -> int:
    """One part of the check, in this (child) process: "plain" (plain tokens/s, the verify
    curve) or one kind's rows. Its JSON (work/part-PART.json) is rewritten after each row, so
    that a crash inside llama.cpp keeps the rows measured before it."""
    out_path = work / f"part-{part}.json"
    out: dict = {"timings_s": {}, "model_mb": {}, "rows": []}

    def save(rows: list | None = None):
        if rows is not None:
            out["rows"] = rows
        out_path.write_text(json.dumps(out))
        if rows and os.environ.get("SPECGGUF_GPU_CHECK_CRASH") == part:  # tests: a crash after the first row
            os.kill(os.getpid(), signal.SIGSEGV)

    if part == "mtp":
        out["rows"] = mtp_rows(args, out, lengths, work, on_row=save)
        save()
        return 0
    tpath = work / TARGET_FILE
    t0 = time.perf_counter()
    target = Target(tpath, n_ctx=args.ctx, n_batch=args.batch, n_threads=args.threads,
                    n_gpu_layers=args.gpu_layers)
    try:
        out["timings_s"]["load_target"] = time.perf_counter() - t0
        tokens = target.tokenize(PROMPT)
        out["prompt_tokens"] = len(tokens)
        run_ours(target, None, 1, tokens, 8)  # warm-up
        if part == "plain":
            plain = max((run_ours(target, None, 1, tokens, args.tokens) for _ in range(args.repeat)),
                        key=lambda r: r["tokens_per_second"])
            out["plain_tokens_per_second"] = plain["tokens_per_second"]
            out["plain_python_us_per_token"] = plain["python_us_per_round"]
            if args.trace:
                out["plain_trace"] = best_trace([run_ours(target, None, 1, tokens, args.tokens, trace=True)
                                                 for _ in range(args.repeat)])
            save()
            out["verify_ms"] = verify_curve(target, tokens, WIDTHS, args.repeat)
        else:
            drafts = {k: work / f for k, f in DRAFT_FILES.items()}
            # (our spec, C++ --spec-type or None, C++ draft file)
            spec, cpp_type, cpp_draft = {
                "ngram": ("ngram", "ngram-simple", None), "suffix": ("suffix", None, None),
                "dspark": (drafts["dspark"], "draft-dspark", drafts["dspark"]),
                "dflash": (drafts["dflash"], "draft-dflash", drafts["dflash"]),
                "eagle3": (drafts["eagle3"], "draft-eagle3", drafts["eagle3"]),
                "hybrid": (f"suffix+{drafts['dspark']}", None, None)}[part]
            out["rows"] = kind_rows(args, target, tpath, tokens, part, spec, cpp_type, cpp_draft, lengths, work,
                                    on_row=save)
        save()
        return 0
    finally:
        target.close()


def run_isolated(part: str, work: Path) -> dict:
    """run_part in a child process (this script with --part), its stderr passed through. llama.cpp
    can crash inside a pass on a backend (lavapipe did, at varying points: docs/machines.md), so
    a child that dies is run once more, and a part that dies twice becomes a note in the table
    with the rows its further run measured: one crash is not the end of the whole check."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:], "--part", part, "--work", str(work)]
    notes, kept = [], {}
    for attempt in (1, 2):
        (work / f"part-{part}.json").unlink(missing_ok=True)
        tail: list[str] = []
        with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace") as proc:
            for line in proc.stderr:
                sys.stderr.write(line)
                tail = (tail + [line.rstrip()])[-40:]
        got = work / f"part-{part}.json"
        partial = json.loads(got.read_text()) if got.exists() else {}
        if proc.returncode == 0:
            if notes:
                partial["notes"] = notes + [f"{part}: measured on run {attempt}"]
            return partial
        assertion = next((t for t in reversed(tail) if "GGML_ASSERT" in t or "error" in t.lower()), "")
        why = SIGNALS.get(str(proc.returncode), f"exit code {proc.returncode}")
        if len(partial.get("rows", [])) >= len(kept.get("rows", [])):  # the run that got further
            kept = partial
        notes.append(f"{part}: run {attempt} died ({why}{'; ' + assertion.strip()[:200] if assertion else ''})")
        print(f"  {notes[-1]}", file=sys.stderr, flush=True)
    kept["notes"] = notes
    kept.setdefault("failed_parts", []).append(part)
    return kept


def _merge(result: dict, part: dict) -> None:
    for key, value in part.items():
        if key in ("timings_s", "model_mb"):
            result[key].update({k: v for k, v in value.items() if k not in result[key]})
        elif key in ("rows", "notes", "failed_parts"):
            result.setdefault(key, []).extend(value)
        else:
            result.setdefault(key, value)


def batch_size(ap, args) -> int:
    """n_batch = n_ubatch for every context. llama.cpp reserves a logits buffer of n_ubatch rows
    of the vocabulary; on a device whose storage buffers are smaller than that (lavapipe: 128 MiB,
    a 512-row buffer at Qwen3's vocabulary is 297 MiB) later passes crashed inside Mesa, so the
    batch is cut to fit (docs/machines.md). The verify curve needs 65 rows."""
    vocab = max(N_VOCAB, GEMMA_VOCAB if args.gemma else 0)

    def fits(batch: int) -> bool:
        return args.buffer_limit is None or batch * vocab * 4 <= args.buffer_limit

    need = max(WIDTHS) + 1
    if args.batch is not None:
        if args.batch < need:
            ap.error(f"--batch {args.batch} is below {need}, the widest verify pass: pass at least {need}")
        if not fits(args.batch):
            ap.error(f"--batch {args.batch}: its logits ({args.batch} x {vocab} floats) exceed --buffer-limit "
                     f"{args.buffer_limit} bytes: pass a smaller --batch")
        return args.batch
    batch = 512
    while not fits(batch) and batch // 2 >= need:
        batch //= 2
    if not fits(batch):
        ap.error(f"--buffer-limit {args.buffer_limit} bytes cannot hold {need} rows of {vocab} logits, "
                 f"the widest verify pass: this device cannot run the check")
    if batch != 512 and args.part is None:  # once, not again in each part's child
        print(f"batch: {batch} (logits of 512 rows exceed the device's {args.buffer_limit}-byte buffers)",
              file=sys.stderr, flush=True)
    return batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="small widths and depths (the CPU rehearsal)")
    ap.add_argument("--gpu-layers", type=int, default=99)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 2))
    ap.add_argument("--tokens", type=int, default=None, help="tokens per run (default 128; --small: 24)")
    ap.add_argument("--lengths", default=None, help="draft lengths (default 4,8,16; --small: 4,16)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per setting, best counts (default 2; --small: 1)")
    ap.add_argument("--build-seconds", type=float, default=None, help="recorded in the JSON (gpu_check.sh)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=None,
                    help="n_batch and n_ubatch of every context, ours and the C++ loop's (-b/-ub); default 512, "
                         "or the widest power of two under --buffer-limit")
    ap.add_argument("--buffer-limit", type=int, default=None,
                    help="the device's largest storage buffer in bytes (Vulkan's maxStorageBufferRange; "
                         "gpu_check.sh --vulkan reads it with vulkaninfo)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"draft kinds to measure (default {','.join(KINDS)})")
    ap.add_argument("--trace", action="store_true",
                    help="per-round Python time by phase (wall and thread CPU), in the table and the JSON")
    ap.add_argument("--no-cpp", action="store_true", help="skip the C++ loop (specgguf's side only)")
    ap.add_argument("--gemma", action="store_true",
                    help="also trace plain and ngram rounds on the embedded Gemma (262k vocabulary; specgguf only)")
    ap.add_argument("--out", default="bench/gpu_check.json")
    ap.add_argument("--backend", default="cuda", help="label for the table (the build decides)")
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)  # run_isolated's child: plain or a kind
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)  # the child's models and JSON folder
    args = ap.parse_args()
    shape = SMALL if args.small else FULL
    args.tokens = args.tokens or (24 if args.small else 128)
    args.lengths = args.lengths or ("4,16" if args.small else "4,8,16")
    args.repeat = args.repeat or (1 if args.small else 2)
    lengths = [int(x) for x in args.lengths.split(",")]
    args.batch = batch_size(ap, args)
    work = Path(tempfile.mkdtemp(prefix="specgguf-gpucheck-")) if args.part is None else None
    result = {"backend": args.backend, "small": args.small, "shape": {k: list(v) if isinstance(v, tuple) else v
                                                                    for k, v in shape.items()},
              "n_vocab": N_VOCAB, "tokens": args.tokens, "threads": args.threads, "gpu_layers": args.gpu_layers,
              "batch": args.batch,
              "library": native.library_path(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "timings_s": {"build": args.build_seconds}, "rows": []}
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown --kinds {unknown}; use some of {','.join(KINDS)}")
    if args.part is not None:  # a child of the run below: one part, its JSON into the models' folder
        return run_part(args, args.part, Path(args.work), lengths)
    result["kinds"], result["traced"] = kinds, args.trace
    try:
        t0 = time.perf_counter()
        tpath = write_target(work / TARGET_FILE, shape)
        if {"dspark", "hybrid"} & set(kinds):
            write_dspark(work / DRAFT_FILES["dspark"], shape)
        if "dflash" in kinds:
            write_dspark(work / DRAFT_FILES["dflash"], shape, seed=3, markov=False)
        if "eagle3" in kinds:
            write_eagle3(work / DRAFT_FILES["eagle3"], shape)
        result["timings_s"]["write_models"] = time.perf_counter() - t0
        result["model_mb"] = {"target": tpath.stat().st_size / 1e6,
                              **{k: (work / f).stat().st_size / 1e6 for k, f in DRAFT_FILES.items()
                                 if (work / f).exists()}}
        print(f"models: {', '.join(f'{k} {mb:.0f} MB' for k, mb in result['model_mb'].items())} "
              f"in {result['timings_s']['write_models']:.1f} s", file=sys.stderr, flush=True)
        for part in ["plain", *kinds]:
            _merge(result, run_isolated(part, work))
            if part == "plain":  # the probe loads the target alone, before the kinds
                result["backend_sampling"] = backend_sampling(tpath, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.gemma:
        result["gemma"] = gemma_rows(args, lengths)
    _print(result)
    out = Path(args.out) if os.path.isabs(args.out) else ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


def _print(r: dict) -> None:
    s = r["shape"]
    print(f"specgguf gpu_check ({r['backend']}{', small' if r['small'] else ''}): target qwen3 "
          f"{s['n_layer']}x{s['n_embd']} Q4_K_M, vocab {r['n_vocab']}; dspark/dflash {s['draft_layers']} layers, "
          f"eagle3 1 layer, Q8_0{'; mtp: gemma4 4x256 F32 + assistant' if 'gemma4_shape' in r else ''}; "
          f"{r['tokens']} tokens greedy, {r['threads']} threads, {r['gpu_layers']} GPU layers; "
          f"{r['machine']}")
    if "plain_tokens_per_second" in r:
        print(f"plain: {r['plain_tokens_per_second']:.1f} tok/s (Python {r['plain_python_us_per_token']:.0f} us/token)")
    else:
        print("plain: not measured (see the notes below)")
    print("verify ms by width: " + ("  ".join(f"{w}:{ms:.2f}" for w, ms in r["verify_ms"].items())
                                    if "verify_ms" in r else "not measured (see the notes below)"))
    header = (f"{'kind':7} {'n':>2} {'ours tok/s':>10} {'C++ tok/s':>10} {'ratio':>6} {'accept ours/C++':>16} "
              f"{'drafted ours/C++':>17} {'py us/round':>11}")
    print(header)
    print("-" * len(header))
    for row in r["rows"]:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        cpp = (f"{row['cpp_tokens_per_second']:10.1f}" if row["cpp_tokens_per_second"]
               else f"{'failed':>10}" if row.get("cpp_error") else f"{'-':>10}")
        cpp_acc = f"{100 * row['cpp_accept']:3.0f}%" if row["cpp_tokens_per_second"] else "   -"
        cpp_dr = f"{row['cpp_drafted']}" if row.get("cpp_drafted") is not None else "-"
        print(f"{row['kind']:7} {row['draft_max']:>2} {row['ours_tokens_per_second']:10.1f} {cpp} {ratio:>6} "
              f"{100 * row['ours_accept']:7.0f}%/{cpp_acc}    {row['ours_drafted']:>8}/{cpp_dr:<8} "
              f"{row['python_us_per_round']:11.0f}")
    for row in r["rows"]:
        if row.get("cpp_error"):
            print(f"C++ {row['kind']} n={row['draft_max']} failed: {row['cpp_error']}")
    for note in r.get("notes", []):  # a part whose child died inside llama.cpp (run_isolated)
        print(f"specgguf {note}")
    bs = r.get("backend_sampling")
    if bs:
        if "error" in bs:
            print(f"backend sampling probe failed: {bs['error']}")
        else:
            parts = []
            for name, label in (("one_row", "1-row pass"), ("block", "17-row pass")):
                x = bs[name]
                parts.append(f"{label}: refused ({x['error']})" if "error" in x else
                             f"{label}: ids {'equal' if x['equal'] else 'DIFFER'} ({x['mismatches']}/{x['n']} differ), "
                             f"{x['logits_ms']:.2f} ms with numpy's arg-max vs {x['graph_ms']:.2f} in the graph")
            print("backend sampling (greedy chain in the target's graph): " + "; ".join(parts))
    if r.get("traced"):
        _print_trace(r)


def _print_trace(r: dict) -> None:
    """us of Python per round by phase: thread CPU time (wall time in brackets), llama_process
    excluded; the clocks' own cost is in each phase (`overhead` per round, all phases)."""
    phases = round_trace.PHASES
    short = {"bookkeeping": "books"}
    names = [short.get(p, p) for p in phases]
    header = f"{'kind':7} {'n':>2} " + " ".join(f"{p:>11}" for p in names) + f" {'python':>11} {'llama ms':>8}"
    print("Python us per round by phase, thread CPU [wall] (llama_process excluded; "
          "thread CPU time is what the Python costs on a busy machine):")
    print(header)
    print("-" * len(header))
    rows = [("plain", 0, r["plain_trace"])] if r.get("plain_trace") else []
    rows += [(row["kind"], row["draft_max"], row["trace"]) for row in r["rows"] if row.get("trace")]
    if r.get("gemma"):
        rows += [(f"g:{row['kind']}", row["draft_max"], row["trace"]) for row in r["gemma"]["rows"]]
    for kind, n, t in rows:
        cells = " ".join(f"{t['cpu'][p]:5.0f} [{t['wall'][p]:4.0f}]" for p in phases)
        print(f"{kind:7} {n:>2} {cells} {t['cpu']['python']:5.0f} [{t['wall']['python']:4.0f}] "
              f"{t['llama_wall_us'] / 1e3:8.2f}")
    if rows:
        print(f"(clock reads: {rows[0][2]['overhead_us']:.1f} us per round in all"
              + (f"; g: rows are {r['gemma']['model']}, vocabulary {r['gemma']['n_vocab']}" if r.get("gemma") else "")
              + ")")


if __name__ == "__main__":
    sys.exit(main())
