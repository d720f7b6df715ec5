"""DeepSpec's Gemma-4 Eagle3 draft (Gemma4Eagle3Model) against the synthetic gemma4 target.

On any build: the checkpoint converts to an eagle3 file with Gemma's layer (docs/gguf-formats.md
§4: no attn_v, post norms, layer scalar, GELU-tanh, sqrt(H) embedding scale rounded to bf16,
attention scale 1, soft-capping, proportional RoPE), pairings across backbones are refused, and a
build without patch 0003 refuses the file with one line naming the build command. On the patched
build (`specgguf build-llama --patched`): llama.cpp's logits match a numpy forward pass of
DeepSpec's modeling code (tests/reference_eagle3.py), and greedy generation with the draft is
lossless on the counting gemma4 target, where a draft that knows the rule is accepted.
Patched tests skip on the stock wheel unless SPECGGUF_REQUIRE_PATCHED=1.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from conftest import GEMMA4_WIDE, require_eagle3_patch, run_cli
from specgguf.runtime import native, patchprobe
from specgguf.converters import convert
from specgguf.drafters import make_drafter
from specgguf.decoding.engine import Engine
from specgguf.synthetic.qwen3 import QwenShape, head_for, write_qwen3
from specgguf.synthetic.gemma4 import Gemma4Shape, gemma_successor, write_gemma4
from specgguf.runtime.target import Target
from test_cli import assert_one_line_error
from test_convert_llama import checkpoint_weights

import checkpoint_fixtures as F
import reference_eagle3 as R

WIDE = GEMMA4_WIDE
PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n"]


@pytest.fixture(scope="module")
def patched():
    return require_eagle3_patch(gemma=True)


@pytest.fixture(scope="module")
def g4dir(tmp_path_factory):
    return tmp_path_factory.mktemp("g4e3")


@pytest.fixture(scope="module")
def g4_target(gemma4_wide_target):
    return gemma4_wide_target


@pytest.fixture(scope="module")
def converted(g4dir, g4_target):
    ck = F.make_gemma4_eagle3_checkpoint(g4dir / "ck", g4_target, softcap=30.0)
    return ck, convert(str(ck), g4_target, g4dir / "draft.gguf", "f32", "shared")


# -- any build ------------------------------------------------------------------------------

def test_converts_to_eagle3_with_gemmas_layer(converted, g4_target):
    ck, out = converted
    r = gguf.GGUFReader(out.path)
    kv = {k: f.contents() for k, f in r.fields.items()}
    names = {t.name for t in r.tensors}
    assert kv["general.architecture"] == "eagle3"
    assert kv["eagle3.target_layers"] == [1, 2, 3, 4, 5]  # DeepSpec [0..4] + 1
    assert kv["eagle3.hidden_activation"] == "gelu_pytorch_tanh"
    assert kv["eagle3.embedding_scale"] == 9.8125  # bf16(sqrt(96)), as DeepSpec's BF16 model applies it
    assert kv["eagle3.attention.scale"] == 1.0 and kv["eagle3.final_logit_softcapping"] == 30.0
    assert kv["eagle3.attention.key_length"] == WIDE.head_dim and kv["eagle3.attention.head_count_kv"] == 1
    assert "blk.0.attn_v.weight" not in names  # K = V
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.layer_output_scale.weight",
            "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "rope_freqs.weight"} <= names
    freqs = next(t for t in r.tensors if t.name == "rope_freqs.weight").data
    assert list(freqs[:4]) == [1.0] * 4 and np.all(freqs[4:] == 1e30)  # 0.25 of 32 dims rotate: 4 pairs
    assert out.summary["runtime"].startswith("needs the patched llama.cpp build")
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4Eagle3Model"]


def test_uncapped_config_writes_no_softcap_key(tmp_path, g4_target):
    ck = F.make_gemma4_eagle3_checkpoint(tmp_path / "ck", g4_target, softcap=None)
    out = convert(str(ck), g4_target, tmp_path / "d.gguf", "f16", "shared")
    assert "eagle3.final_logit_softcapping" not in gguf.GGUFReader(out.path).fields


def test_gemma4_checkpoint_against_qwen3_target_is_refused(tmp_path, g4_target):
    qwen3 = write_qwen3(tmp_path / "qwen3.gguf", QwenShape(n_layer=6))
    ck = F.make_gemma4_eagle3_checkpoint(tmp_path / "ck", g4_target)
    out = tmp_path / "out.gguf"
    assert_one_line_error(run_cli("convert", ck, "--target", qwen3, "-o", out), "Gemma 4 draft", "'qwen3'")
    assert not out.exists()


def test_qwen3_checkpoint_against_gemma4_target_is_refused(tmp_path, g4_target):
    ck = F.make_deepspec_eagle3_checkpoint(tmp_path / "ck", F.TargetSpec(n_layer=6))
    out = tmp_path / "out.gguf"
    assert_one_line_error(run_cli("convert", ck, "--target", g4_target, "-o", out), "qwen3 draft", "gemma4")
    assert not out.exists()


def test_checkpoint_without_k_eq_v_is_refused(tmp_path, g4_target):
    ck = F.make_gemma4_eagle3_checkpoint(tmp_path / "ck", g4_target)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["attention_k_eq_v"] = False
    (ck / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(run_cli("convert", ck, "--target", g4_target, "-o", tmp_path / "o.gguf"),
                          "attention_k_eq_v")


def test_stock_build_refuses_with_the_build_command(converted, g4_target):
    """Through the CLI: one line, exit 2, the command to run. On the patched build the probe's
    answer is overridden to 'stock' so that the refusal path is tested there as well."""
    env = {"SPECGGUF_EAGLE3_PATCHED": "0"} if patchprobe.has_eagle3_patch(gemma=True) else None
    proc = run_cli("generate", g4_target, "-p", "hi", "-n", "4", "--draft", converted[1].path, env=env)
    assert_one_line_error(proc, "DeepSpec-style Eagle3", "Gemma-4 layer", "specgguf build-llama --patched")


def test_probe_tells_the_gemma4_layer_from_the_older_patches(tmp_path, monkeypatch):
    """A build with 0001-0002 only runs Qwen3 drafts, so the two levels are probed and cached
    apart; whatever this library is, the Gemma-4 level never exceeds the Qwen3 one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECGGUF_EAGLE3_PATCHED", raising=False)
    monkeypatch.setattr(patchprobe, "_memo", {})
    qwen3, gemma4 = patchprobe.has_eagle3_patch(), patchprobe.has_eagle3_patch(gemma=True)
    assert qwen3 or not gemma4
    assert len(json.loads(patchprobe.cache_file().read_text())) == 2


def test_inspect_names_the_patched_build_and_a_gemma4_target(converted, g4_target):
    proc = run_cli("inspect", converted[1].path)
    assert proc.returncode == 0, proc.stderr
    assert "runs on:      the patched build only (`specgguf build-llama --patched`" in proc.stdout
    assert "beside a gemma4 target" in proc.stdout


def test_gemma4_eagle3_draft_beside_a_qwen3_target_is_refused(tmp_path, converted):
    qwen3 = write_qwen3(tmp_path / "qwen3.gguf", QwenShape(n_layer=6))
    proc = run_cli("generate", qwen3, "-p", "hi", "-n", "4", "--draft", converted[1].path,
                   env={"SPECGGUF_EAGLE3_PATCHED": "1"})
    assert_one_line_error(proc, "Gemma-4 draft", "'qwen3'")


# -- the patched build -------------------------------------------------------------------------

def _draft_logits(draft, target, feats, tokens):
    """Encode the fused features, decode (token, g) pairs at 0..n-1, then one autoregressive step
    that feeds h back as g: (logits [n, V], h [n, H], next logits [V])."""
    n = len(tokens)
    with native.Model(target) as tm, native.Context(tm, n_ctx=64, n_batch=32) as tc, \
            native.Model(draft) as m, native.Context(m, n_ctx=64, n_batch=32, ctx_other=tc) as c:
        c.set_embeddings_nextn(True, True)
        with native.Batch(c) as b:
            for i, row in enumerate(feats):
                b.add_embedding(row, i, output=True)
            c.encode(b)
            g = c.embeddings_nextn(n, m.n_embd).copy()
            b.clear()
            for i in range(n):
                b.add_embedding(g[i], i, output=True, token=tokens[i])
            c.decode(b)
            got = np.stack([c.logits(i).copy() for i in range(n)])
            h = np.stack([c.embeddings_nextn_ith(i, m.n_embd).copy() for i in range(n)])
            b.clear().add_embedding(h[-1], n, output=True, token=tokens[0])
            c.decode(b)
            return got, h, c.logits(0).copy()


@pytest.mark.parametrize("head, softcap", [("shared", 30.0), ("own", None)])
def test_logits_match_deepspec_reference(tmp_path, patched, g4_target, head, softcap):
    ck = F.make_gemma4_eagle3_checkpoint(tmp_path / "ck", g4_target, softcap=softcap)
    out = convert(str(ck), g4_target, tmp_path / "d.gguf", "f32", head)
    w, cfg = checkpoint_weights(ck), json.loads((ck / "config.json").read_text())
    rng = np.random.default_rng(11)
    n = 6
    feats = rng.normal(0, 3, (n, 5 * WIDE.n_embd)).astype(np.float32)
    tokens = [int(t) for t in rng.integers(5 + 256, cfg["vocab_size"], n)]
    got, h, got_next = _draft_logits(out.path, g4_target, feats, tokens)
    ref, ref_h = R.deepspec_gemma4_eagle3(w, cfg, tokens, np.arange(n), features=feats)
    ref_next, _ = R.deepspec_gemma4_eagle3(w, cfg, tokens + [tokens[0]], np.arange(n + 1),
                                           g=np.vstack([feats @ w["fc.weight"].T, ref_h[-1:]]))
    err, err_h = np.abs(got - ref).max(), np.abs(h - ref_h).max()
    rel, rel_next = err / np.abs(ref).max(), np.abs(got_next - ref_next[-1]).max() / np.abs(ref_next[-1]).max()
    print(f"\n{head} head, softcap {softcap}: max |logit diff| {err:.2e} (rel {rel:.2e}), h {err_h:.2e}, "
          f"next step rel {rel_next:.2e}")
    assert rel < 2e-3 and rel_next < 2e-3  # measured ~5e-4 (F16 KV cache, ggml's GELU table)
    assert np.array_equal(ref.argmax(1), got.argmax(1)) and ref_next[-1].argmax() == got_next.argmax()
    if softcap:
        assert np.abs(got).max() < softcap  # capped in the graph, as DeepSpec's compute_logits does


def _counting_checkpoint(directory, target, knows_rule: bool):
    """With knows_rule, fc averages the 5 layers, attention and MLP add nothing (their post norms
    keep a zero at zero) and the head predicts the successor of the successor, which is right
    for the first draft token of a round (cf. test_eagle3_patch._counting_checkpoint)."""
    spec, tw, types = F.gemma4_target_spec(target)
    succ = gemma_successor(types)
    head = head_for(tw["token_embd.weight"], succ[succ], 40.0) if knows_rule else None
    ck = F.make_gemma4_eagle3_checkpoint(directory, target, dtype="F32", softcap=30.0, head=head, seed=6)
    if knows_rule:
        t = checkpoint_weights(ck)
        H = spec.n_embd
        t["fc.weight"] = np.tile(np.eye(H, dtype=np.float32), (1, 5)) / 5
        t["layers.0.self_attn.o_proj.weight"][:] = 0
        t["layers.0.mlp.down_proj.weight"][:] = 0
        cfg = json.loads((ck / "config.json").read_text())
        F.write_checkpoint(ck, cfg, t, "F32")
    return ck


def test_lossless_and_accepted_on_counting_target(tmp_path, patched):
    tpath = write_gemma4(tmp_path / "g4-counting.gguf", Gemma4Shape(), seed=0, counting=True)
    with Target(tpath, n_ctx=512) as target:
        plain = []
        for p in PROMPTS:
            gen = Engine(target, None, 4).generate(target.tokenize(p), 48)
            for _ in gen:
                pass
            plain.append(gen.tokens)
        rates = {}
        for name in ("knows-rule", "random"):
            ck = _counting_checkpoint(tmp_path / name, tpath, name == "knows-rule")
            out = convert(str(ck), tpath, tmp_path / f"{name}.gguf", "f16", "own")
            drafter = make_drafter(str(out.path), target, draft_max=4)
            try:
                assert drafter.layer_ids == [1, 2, 3, 4, 5]
                first = []
                for prompt, want in zip(PROMPTS, plain):
                    gen = Engine(target, drafter, 4).generate(target.tokenize(prompt), 48)
                    for _ in gen:
                        pass
                    assert gen.tokens == want, f"{name} changed the output for {prompt!r}"
                    assert gen.stats.drafted > 0
                    first.append(gen.stats.accepted_by_position[0])
            finally:
                drafter.close()
            rates[name] = float(np.mean(first))
    print(f"\nfirst-position acceptance: knows rule {rates['knows-rule']:.2f}, random {rates['random']:.2f}")
    # the counting gemma4 target counts most of the time, not always (test_gemma4.py): ~0.8 here
    assert rates["knows-rule"] >= 0.6 and rates["random"] <= 0.3
