"""DeepSpec Eagle3 drafts (5 target layers, per-head q/k norms) on the patched llama.cpp.

On any build: the Qwen3 checkpoint converts (layer ids +1, q/k norms, tokenizer of the
target) and a build without the patches refuses the draft with one line that names the
build command. On the patched build (`specgguf build-llama --patched`): the draft
loads, its logits match a numpy forward pass of DeepSpec's modeling code, generation with it
is lossless, and a draft that knows the counting target's rule is accepted far more often
than a random one. Those tests skip on the stock wheel unless SPECGGUF_REQUIRE_PATCHED=1.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from conftest import require_eagle3_patch, run_cli
from specgguf.runtime import native, patchprobe
from specgguf.converters import convert
from specgguf.drafters import make_drafter
from specgguf.decoding.engine import Engine
from specgguf.synthetic.qwen3 import bigger, head_for, qwen3_weights, successor, write_qwen3
from specgguf.runtime.target import Target
from test_cli import assert_one_line_error
from test_convert_llama import checkpoint_weights

import checkpoint_fixtures as F
import reference_eagle3 as R

SPEC = F.TargetSpec(n_layer=6)  # DeepSpec reads 5 layer outputs: ids 0..4 -> inputs 1..5
PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n"]


@pytest.fixture(scope="module")
def patched():
    return require_eagle3_patch()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return F.make_target_gguf(tmp_path_factory.mktemp("tgt") / "target.gguf", SPEC)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, target):
    d = tmp_path_factory.mktemp("dse3")
    ck = F.make_deepspec_eagle3_checkpoint(d / "ck", SPEC)
    return ck, convert(str(ck), target, d / "draft.gguf", "f32", "own")


def _generate(target, drafter, prompt, n=48):
    gen = Engine(target, drafter, 4).generate(target.tokenize(prompt), n)
    for _ in gen:
        pass
    return gen


# -- any build ------------------------------------------------------------------------------

def test_converts_with_shifted_layers_qk_norms_and_target_tokenizer(converted, target):
    _, out = converted
    r, t = gguf.GGUFReader(out.path), gguf.GGUFReader(target)
    kv = {k: f.contents() for k, f in r.fields.items()}
    assert kv["general.architecture"] == "eagle3"
    assert kv["eagle3.target_layers"] == [1, 2, 3, 4, 5]  # DeepSpec [0..4] + 1
    assert kv["eagle3.target_hidden_size"] == SPEC.n_embd
    names = {x.name: x for x in r.tensors}
    assert names["fc.weight"].shape.tolist() == [5 * SPEC.n_embd, SPEC.n_embd]  # K x target width
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= set(names)
    assert kv["tokenizer.ggml.tokens"] == t.fields["tokenizer.ggml.tokens"].contents()
    assert out.summary["runtime"].startswith("needs the patched llama.cpp build")


def test_cli_convert_says_a_patched_build_is_needed(tmp_path, target):
    ck = F.make_deepspec_eagle3_checkpoint(tmp_path / "ck", SPEC)
    proc = run_cli("convert", ck, "--target", target, "-o", tmp_path / "d.gguf")
    assert proc.returncode == 0, proc.stderr
    assert "needs the patched llama.cpp build (specgguf build-llama --patched)" in proc.stdout


def test_stock_build_refuses_with_the_build_command(converted, target):
    """Through the CLI: one line, exit 2, the command to run. On the patched build the probe's
    answer is overridden to 'stock' so that the refusal path is tested there as well."""
    env = {"SPECGGUF_EAGLE3_PATCHED": "0"} if patchprobe.has_eagle3_patch() else None
    proc = run_cli("generate", target, "-p", "hi", "--draft", converted[1].path, env=env)
    assert_one_line_error(proc, "DeepSpec-style Eagle3", "5 target layers", "q/k norms",
                          "specgguf build-llama --patched")


def test_probe_answer_is_cached_per_library(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPECGGUF_EAGLE3_PATCHED", raising=False)
    monkeypatch.setattr(patchprobe, "_memo", {})
    first = patchprobe.has_eagle3_patch()
    assert patchprobe.cache_file().is_file()
    monkeypatch.setattr(patchprobe, "_memo", {})
    monkeypatch.setattr(patchprobe, "_probe", lambda lib: pytest.fail("probed again despite the cache"))
    assert patchprobe.has_eagle3_patch() is first


# -- the patched build -------------------------------------------------------------------------

@pytest.mark.parametrize("head, draft_vocab", [("own", None), ("shared", 200)])
def test_logits_match_deepspec_reference(tmp_path, patched, target, head, draft_vocab):
    ck = F.make_deepspec_eagle3_checkpoint(tmp_path / "ck", SPEC, draft_vocab=draft_vocab)
    out = convert(str(ck), target, tmp_path / "d.gguf", "f32", head)
    w, cfg = checkpoint_weights(ck), F.deepspec_eagle3_config(SPEC, draft_vocab=draft_vocab)
    rng = np.random.default_rng(11)
    n = 6
    feats = rng.normal(0, 1, (n, 5 * SPEC.n_embd)).astype(np.float32)
    tokens = [int(t) for t in rng.integers(0, 300, n)]
    with native.Model(target) as tm, native.Context(tm, n_ctx=64, n_batch=32) as tc, \
            native.Model(out.path) as m, native.Context(m, n_ctx=64, n_batch=32, ctx_other=tc) as c:
        c.set_embeddings_nextn(True, True)
        with native.Batch(c) as b:
            for i, row in enumerate(feats):  # encoder: fc over the 5 fused layers
                b.add_embedding(row, i, output=True)
            c.encode(b)
            g = c.embeddings_nextn(n, m.n_embd).copy()
            b.clear()
            for i in range(n):  # decoder: (token, g) pairs at positions 0..n-1
                b.add_embedding(g[i], i, output=True, token=tokens[i])
            c.decode(b)
            got = np.stack([c.logits(i).copy() for i in range(n)])
            h = np.stack([c.embeddings_nextn_ith(i, m.n_embd).copy() for i in range(n)])
            # one autoregressive step: the pre-norm state h goes back in as the next g
            b.clear().add_embedding(h[-1], n, output=True, token=tokens[0])
            c.decode(b)
            got_next = c.logits(0).copy()
    ref, ref_h = R.deepspec_eagle3(w, cfg, tokens, np.arange(n), features=feats)
    ref_next, _ = R.deepspec_eagle3(w, cfg, tokens + [tokens[0]], np.arange(n + 1),
                                    g=np.vstack([feats @ w["fc.weight"].T, ref_h[-1:]]))
    ids = np.arange(SPEC.n_vocab)
    if draft_vocab:  # llama.cpp scatters draft logits to target ids (d2t), the rest is -inf
        ids = w["d2t"] + np.arange(draft_vocab)
        assert np.all(np.isneginf(np.delete(got, ids, axis=1)))
    rel = np.abs(got[:, ids] - ref).max() / np.abs(ref).max()
    rel_next = np.abs(got_next[ids] - ref_next[-1]).max() / np.abs(ref_next[-1]).max()
    print(f"\n{head} head, draft vocab {draft_vocab}: max rel logit error {rel:.2e}, next step {rel_next:.2e}")
    assert rel < 5e-3 and rel_next < 5e-3
    assert np.array_equal(ids[ref.argmax(1)], got.argmax(1))
    assert ids[ref_next[-1].argmax()] == got_next.argmax()


def _counting_checkpoint(directory, shape, n_vocab, knows_rule: bool):
    """A DeepSpec Eagle3 checkpoint for write_qwen3(counting=True): with knows_rule, fc averages
    the 5 layers, attention and MLP add nothing and the head predicts the successor of the
    successor, which is right for the first token of a round (cf. synthetic.write_eagle3)."""
    spec = F.TargetSpec(n_vocab=n_vocab, n_embd=shape.n_embd, n_layer=shape.n_layer)
    cfg = F.deepspec_eagle3_config(spec)
    emb = qwen3_weights(shape, n_vocab, 0)["token_embd.weight"]
    succ = successor(n_vocab)
    t = F.deepspec_eagle3_tensors(cfg, emb, head_for(emb, succ[succ], 4.0), seed=5)
    if knows_rule:
        H = shape.n_embd
        t["fc.weight"] = np.tile(np.eye(H, dtype=np.float32), (1, 5)) / 5
        t["layers.0.self_attn.o_proj.weight"][:] = 0
        t["layers.0.mlp.down_proj.weight"][:] = 0
    return F.write_checkpoint(directory, cfg, t, "F32")


def test_lossless_and_accepted_on_counting_target(tmp_path, patched):
    shape = bigger(n_layer=6)
    tpath = write_qwen3(tmp_path / "counting.gguf", shape, counting=True)
    with Target(tpath, n_ctx=512) as target:
        n_vocab = target.model.n_vocab
        rates = {}
        for name in ("knows-rule", "random"):
            ck = _counting_checkpoint(tmp_path / name, shape, n_vocab, name == "knows-rule")
            out = convert(str(ck), tpath, tmp_path / f"{name}.gguf", "f16", "own")
            plain = [_generate(target, None, p).tokens for p in PROMPTS]
            drafter = make_drafter(str(out.path), target, draft_max=4)
            try:
                assert drafter.layer_ids == [1, 2, 3, 4, 5]
                first = []
                for prompt, want in zip(PROMPTS, plain):
                    gen = _generate(target, drafter, prompt)
                    assert gen.tokens == want, f"{name} changed the output for {prompt!r}"
                    assert gen.stats.drafted > 0
                    first.append(gen.stats.accepted_by_position[0])
            finally:
                drafter.close()
            rates[name] = float(np.mean(first))
    print(f"\nfirst-position acceptance: knows rule {rates['knows-rule']:.2f}, random {rates['random']:.2f}")
    assert rates["knows-rule"] >= 0.8 and rates["random"] <= 0.3
