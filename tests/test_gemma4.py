"""Gemma 4 targets: the synthetic gemma4 GGUF, DeepSpec's Gemma-4 DFlash/DSpark drafts converted
against it, and what is refused.

- The target loads in the pinned llama.cpp, tokenizes Gemma-style and counts when asked to.
- Converted drafts compute what the checkpoint means: llama.cpp's logits against the numpy
  forward of DeepSpec's Gemma4DSparkModel (tests/reference_dspark.py), including the embedding
  scale sqrt(H) rounded to bf16 as DeepSpec applies it (the target here has H = 96, where the
  rounding shows: 9.8125 against 9.7980).
- Greedy speculative output equals plain greedy output (tests/test_lossless.py).
- Bad pairings: one line, exit 2, no file left.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from specgguf.runtime import native
from specgguf.converters import convert
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3
from specgguf.synthetic.gemma4 import MASK_ID, Gemma4Shape, gemma_successor, plain_ids, write_gemma4, write_gemma4_assistant

import checkpoint_fixtures as F
import reference_dspark as R
import test_lossless as L
import test_parity as TP
from conftest import GEMMA4_WIDE, run_cli
from test_convert_llama import checkpoint_weights, draft_block

WIDE = GEMMA4_WIDE
P = 6


@pytest.fixture(scope="module")
def g4dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma4")


@pytest.fixture(scope="module")
def g4_target(gemma4_wide_target):
    return gemma4_wide_target


@pytest.fixture(scope="module")
def g4_target_ctx(g4_target):
    with native.Model(g4_target) as m, native.Context(m, n_ctx=64, n_batch=32) as c:
        yield c


@pytest.fixture(scope="module")
def g4_counting(g4dir):
    return write_gemma4(g4dir / "g4-counting.gguf", Gemma4Shape(), seed=0, counting=True)


@pytest.fixture(scope="module")
def g4_drafts(g4dir, g4_counting):
    """Gemma-4 DSpark (Markov + confidence heads, counting) and DFlash drafts for the counting
    target, converted by `specgguf convert` from DeepSpec-format checkpoints."""
    out = {}
    for name, kw, head in [("dspark", dict(counting=True), "shared"), ("dspark-own", dict(counting=True), "own"),
                           ("dflash", dict(markov_rank=0, conf=False), "shared")]:
        ck = F.make_gemma4_dspark_checkpoint(g4dir / f"ck-{name}", g4_counting, target_layer_ids=(0, 2, 4), **kw)
        out[name] = convert(str(ck), g4_counting, g4dir / f"{name}.gguf", "f16", head).path
    # Gemma 4's own assistant (gemma4-assistant, kind mtp), knowing the counting rule
    out["mtp"] = write_gemma4_assistant(g4dir / "assistant.gguf", Gemma4Shape(), counting_target_seed=0)
    return out


# -- the target ------------------------------------------------------------------------------

def test_target_loads_tokenizes_and_exposes_layers(g4_target):
    with native.Model(g4_target) as m:
        assert m.n_embd == 96 and m.meta("general.architecture") == "gemma4"
        text = "The quick brown fox jumps over the lazy dog.\ndef add(a, b):"
        toks = m.tokenize(text, add_special=True, parse_special=True)
        assert toks[0] == 2  # <bos>: Gemma 4 always adds it
        assert m.detokenize(toks[1:]) == text
        assert len(toks) < len(text) // 2  # merges were used, not characters or bytes
        assert m.tokenize("<mask>", add_special=False, parse_special=True) == [MASK_ID]
        assert m.tokenize("é", add_special=False, parse_special=True) == [5 + 0xC3, 5 + 0xA9]  # <0xXX> fallback


def test_counting_target_counts_mostly(g4_counting):
    from specgguf.api import SpecGGUF

    with SpecGGUF(g4_counting, n_ctx=256) as llm:
        r = llm.generate("The quick brown fox", max_tokens=48)
    import gguf

    tt = gguf.GGUFReader(g4_counting).fields["tokenizer.ggml.token_type"].contents()
    succ = gemma_successor(tt)
    steps = [b == succ[a] for a, b in zip(r.tokens, r.tokens[1:])]
    assert all(t in set(plain_ids(tt)) for t in r.tokens)
    assert 0.5 < np.mean(steps), steps  # predictable, yet the layers still matter somewhere


# -- conversion numerics ---------------------------------------------------------------------

CASES = {"dspark": dict(markov_rank=32, conf=True), "dflash": dict(markov_rank=0, conf=False)}


@pytest.mark.parametrize("head", ["own", "shared"])
@pytest.mark.parametrize("case", list(CASES))
def test_draft_logits_match_deepspec_forward(tmp_path, g4_target, g4_target_ctx, case, head):
    ck = F.make_gemma4_dspark_checkpoint(tmp_path / "ck", g4_target, target_layer_ids=(0, 2, 4), **CASES[case])
    cfg = json.loads((ck / "config.json").read_text())
    out = convert(str(ck), g4_target, tmp_path / "d.gguf", "f32", head)
    w = checkpoint_weights(ck)
    rng = np.random.default_rng(5)
    for _ in range(3):
        feats = rng.normal(0, 1, (P, 3 * WIDE.n_embd)).astype(np.float32)
        anchor = int(rng.integers(5 + 256, cfg["vocab_size"]))
        ref, ref_conf = R.dspark_block(w, cfg, feats, anchor)
        got, conf = draft_block(out.path, g4_target_ctx, feats, anchor, MASK_ID, cfg["block_size"], head == "shared")
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert rel < 1e-4, f"{case}/{head}: max relative error {rel:.2e}"
        assert np.array_equal(got.argmax(1), ref.argmax(1))
        if ref_conf is not None:
            assert np.abs(conf - ref_conf).max() < 1e-4


@pytest.mark.parametrize("out_type", ["f16", "q8_0"])
def test_quantized_drafts_keep_the_argmax(tmp_path, g4_target, g4_target_ctx, out_type):
    ck = F.make_gemma4_dspark_checkpoint(tmp_path / "ck", g4_target, target_layer_ids=(0, 2, 4))
    cfg = json.loads((ck / "config.json").read_text())
    out = convert(str(ck), g4_target, tmp_path / "d.gguf", out_type, "shared")
    w = checkpoint_weights(ck)
    rng = np.random.default_rng(8)
    agree = total = 0
    for _ in range(5):
        feats = rng.normal(0, 1, (P, 3 * WIDE.n_embd)).astype(np.float32)
        anchor = int(rng.integers(5 + 256, cfg["vocab_size"]))
        ref, _ = R.dspark_block(w, cfg, feats, anchor)
        got, _ = draft_block(out.path, g4_target_ctx, feats, anchor, MASK_ID, cfg["block_size"], True)
        assert np.abs(got - ref).max() / np.abs(ref).max() < 3e-2
        agree, total = agree + int((got.argmax(1) == ref.argmax(1)).sum()), total + len(ref)
    assert agree / total >= 0.9, f"{out_type}: argmax agreement {agree}/{total}"


def test_embedding_scale_is_deepspecs_bf16_sqrt_h(tmp_path, g4_target, g4_target_ctx):
    """DeepSpec multiplies by sqrt(H) cast to the weights' dtype: a BF16 checkpoint means
    bf16(sqrt(96)) = 9.8125. The converted file carries that value, and llama.cpp's logits sit
    on the forward with it, measurably off the one with the exact sqrt(H)."""
    import gguf

    ck = F.make_gemma4_dspark_checkpoint(tmp_path / "ck", g4_target, target_layer_ids=(0, 2, 4))
    cfg = json.loads((ck / "config.json").read_text())
    out = convert(str(ck), g4_target, tmp_path / "d.gguf", "f32", "own")
    scale = gguf.GGUFReader(out.path).fields["dflash.embedding_scale"].contents()
    assert scale == 9.8125 == R.torch_scale(math.sqrt(96), "bfloat16")
    w = checkpoint_weights(ck)
    feats = np.random.default_rng(1).normal(0, 1, (P, 3 * 96)).astype(np.float32)
    got, _ = draft_block(out.path, g4_target_ctx, feats, 300, MASK_ID, cfg["block_size"], False)
    # mean absolute errors; llama.cpp's own floor (its GELU is tabulated in f16) is about a
    # third of the exact-scale forward's distance (measured: 6.5e-4 against 2.3e-3)
    err_bf16 = np.abs(got - R.dspark_block(w, cfg, feats, 300)[0]).mean()
    err_exact = np.abs(got - R.dspark_block(w, cfg, feats, 300, embed_scale=math.sqrt(96))[0]).mean()
    assert err_bf16 * 2 < err_exact, (err_bf16, err_exact)
    # an F32 checkpoint was trained with the exact value
    ck32 = F.make_gemma4_dspark_checkpoint(tmp_path / "ck32", g4_target, dtype="F32", target_layer_ids=(0, 2, 4))
    out32 = convert(str(ck32), g4_target, tmp_path / "d32.gguf", "f32", "own")
    assert gguf.GGUFReader(out32.path).fields["dflash.embedding_scale"].contents() == np.float32(math.sqrt(96))


def test_softcapped_config_warns_and_runs_uncapped(tmp_path, g4_target, g4_target_ctx):
    """DeepSpec caps the draft logits (final_logit_softcapping) before the Markov bias; llama.cpp's
    dflash graph adds the bias to uncapped logits and has no switch for it. The decision: convert,
    say so, and match DeepSpec's forward without the cap (the output stays the target's)."""
    ck = F.make_gemma4_dspark_checkpoint(tmp_path / "ck", g4_target, softcap=30.0, target_layer_ids=(0, 2, 4))
    cfg = json.loads((ck / "config.json").read_text())
    warnings = []
    out = convert(str(ck), g4_target, tmp_path / "d.gguf", "f32", "own", warn=warnings.append)
    assert any("final_logit_softcapping" in x for x in warnings), warnings
    w = checkpoint_weights(ck)
    feats = np.random.default_rng(2).normal(0, 1, (P, 3 * 96)).astype(np.float32)
    got, _ = draft_block(out.path, g4_target_ctx, feats, 300, MASK_ID, cfg["block_size"], False)
    uncapped = R.dspark_block(w, cfg, feats, 300, softcap=False)[0]
    assert np.abs(got - uncapped).max() / np.abs(uncapped).max() < 1e-4


# -- generation ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dspark", "dspark-own", "dflash", "mtp"])
def test_greedy_output_is_plain_output(g4_counting, g4_drafts, name):
    prompts = ["The quick brown fox", "def add(a, b):\n    return", "Numbers: 0 1 2 3"]
    assert not L.check_lossless(g4_counting, str(g4_drafts[name]), prompts, draft_max=4, n_ctx=512)


def test_dspark_reaches_real_acceptance(g4_counting, g4_drafts):
    from specgguf.api import SpecGGUF

    with SpecGGUF(g4_counting, draft=str(g4_drafts["dspark"]), draft_max=6, n_ctx=512) as llm:
        r = llm.generate("The quick brown fox", max_tokens=64)
    s = r.stats
    assert s.drafted > 0 and 0.3 < s.accepted / s.drafted < 1.0, (s.accepted, s.drafted)


def test_mtp_assistant_reaches_real_acceptance(g4_counting, g4_drafts):
    from specgguf.api import SpecGGUF

    with SpecGGUF(g4_counting, draft=str(g4_drafts["mtp"]), draft_max=4, n_ctx=512) as llm:
        assert llm.drafter.kind == "mtp"
        r = llm.generate("The quick brown fox", max_tokens=48)
    s = r.stats
    assert s.drafted > 0 and 0.3 < s.accepted / s.drafted < 1.0, (s.accepted, s.drafted)


# -- parity with llama-speculative-simple (tests/test_parity.py's checks, on these files) ------------

@pytest.fixture(scope="module")
def hidden_drafts(g4_drafts):
    """test_parity's case runner reads hidden-state drafts from this fixture: here, Gemma 4's."""
    return g4_drafts


@pytest.fixture(scope="module")
def g4_assistant(g4_drafts):
    return g4_drafts["mtp"]


# DeepSpec DFlash files are sample-from-anchor (slot k predicts anchor+k+1), which llama.cpp's
# driver honours as draft-dspark; as draft-dflash it would read slots 1.. (z-lab's rule).
PARITY = [TP.Case("gemma4-dspark", "draft-dspark", "g4_counting", "dspark", n_predict=40),
          TP.Case("gemma4-dspark-own-head", "draft-dspark", "g4_counting", "dspark-own", draft_max=6, n_predict=40),
          TP.Case("gemma4-dflash", "draft-dspark", "g4_counting", "dflash", n_predict=40),
          TP.Case("gemma4-assistant-mtp", "draft-mtp", "g4_counting", "g4_assistant", n_predict=40)]


@pytest.mark.parametrize("case", PARITY, ids=[c.id for c in PARITY])
def test_rounds_and_tokens_match_llama_cpp(case, request, tmp_path):
    TP.test_rounds_and_tokens_match_llama_cpp(case, request, tmp_path)


# -- refusals --------------------------------------------------------------------------------

def one_line_refusal(proc, *needles, out=None):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    if out is not None:
        assert not out.exists() and not list(out.parent.glob(out.name + "*"))


@pytest.fixture(scope="module")
def qwen3(g4dir):
    return write_qwen3(g4dir / "qwen3.gguf", QwenShape())


def test_gemma4_checkpoint_against_qwen3_target(tmp_path, g4_counting, qwen3):
    ck = F.make_gemma4_dspark_checkpoint(tmp_path / "ck", g4_counting, target_layer_ids=(0, 1, 2))
    out = tmp_path / "out.gguf"
    one_line_refusal(run_cli("convert", ck, "--target", qwen3, "-o", out), "Gemma 4 draft", "'qwen3'", out=out)


def test_qwen3_checkpoint_against_gemma4_target(tmp_path, g4_counting):
    ck = F.make_dspark_checkpoint(tmp_path / "ck", F.TargetSpec(n_layer=6))
    out = tmp_path / "out.gguf"
    one_line_refusal(run_cli("convert", ck, "--target", g4_counting, "-o", out), "gemma4", out=out)


def test_gemma4_draft_mask_missing_from_target_vocabulary(tmp_path, g4_counting):
    no_mask = write_gemma4(tmp_path / "nomask.gguf", Gemma4Shape(), seed=0, mask=False)
    ck = F.make_gemma4_dspark_checkpoint(tmp_path / "ck", g4_counting, target_layer_ids=(0, 2, 4))
    out = tmp_path / "out.gguf"
    one_line_refusal(run_cli("convert", ck, "--target", no_mask, "-o", out),
                     "mask_token_id 4", "'<unused0>'", out=out)


def test_gemma4_draft_beside_qwen3_target_at_run_time(g4_drafts, qwen3):
    one_line_refusal(run_cli("generate", qwen3, "-p", "hi", "-n", "4", "--draft", g4_drafts["dspark"]))
def test_assistant_of_another_width_is_refused(tmp_path, g4_counting):
    bad = write_gemma4_assistant(tmp_path / "a.gguf", Gemma4Shape(), width_out=80)
    one_line_refusal(run_cli("generate", g4_counting, "-p", "hi", "-n", "4", "--draft", bad, "--draft-max", "3"),
                     "embedding_length_out")


def test_assistant_beside_a_qwen3_target_is_refused(g4_drafts, qwen3):
    one_line_refusal(run_cli("generate", qwen3, "-p", "hi", "-n", "4", "--draft", g4_drafts["mtp"],
                             "--draft-max", "3"), "gemma4")


def test_gemma4_target_without_sliding_layers_is_refused(tmp_path):
    """llama.cpp asserts (aborts the process) when a gemma4 file marks no layer as sliding."""
    bad = write_gemma4(tmp_path / "nosw.gguf", Gemma4Shape(swa_pattern=(False,) * 6), seed=0)
    one_line_refusal(run_cli("generate", bad, "-p", "hi", "-n", "4"), "sliding")


# -- what runs where -----------------------------------------------------------------------------

def test_inspect_says_build_and_target_archs(g4_drafts, g4_counting, tmp_path):
    proc = run_cli("inspect", g4_drafts["dspark"], "--target", g4_counting)
    assert proc.returncode == 0, proc.stderr
    assert "runs on:      the stock build, beside a gemma4 target" in proc.stdout
    assert "pairing:      fits target" in proc.stdout
    # a DeepSpec Eagle3 (5 layers, q/k norms) needs the patched build
    from specgguf.synthetic.qwen3 import write_eagle3

    e3 = write_eagle3(tmp_path / "e3.gguf", layers=(0, 1, 2, 3, 4), qk_norm=True)
    proc = run_cli("inspect", e3)
    assert proc.returncode == 0 and "runs on:      the patched build only" in proc.stdout, proc.stdout
    proc = run_cli("inspect", g4_drafts["mtp"], "--target", g4_counting)
    assert proc.returncode == 0 and "kind 'mtp'" in proc.stdout and "pairing:      fits target" in proc.stdout


def test_models_lists_build_and_target_arch_of_all_twelve():
    from specgguf.converters import registry

    entries = registry.entries()
    assert len(entries) == 12
    table = {e["repo"].split("/")[1]: (e["build"], e["target_archs"]) for e in entries}
    assert table["dspark_gemma4_12b_block7"] == table["dflash_gemma4_12b_block7"] == ("stock", ["gemma4"])
    assert table["eagle3_qwen3_8b_ttt7"] == ("patched", ["qwen3"])
    assert table["eagle3_gemma4_12b_ttt7"] == ("patched", ["gemma4"])
    proc = run_cli("models")
    assert proc.returncode == 0
    assert proc.stdout.count("runs on the stock build with a gemma4 target") == 2
    assert proc.stdout.count("runs only on the patched build") == 4 and "runs nowhere yet" not in proc.stdout
    rows = {line.split()[0].split("/")[1]: line.split()[2] for line in proc.stdout.splitlines()
            if line.startswith("deepseek-ai/")}
    assert rows == {name: build for name, (build, _) in table.items()}  # the build column
