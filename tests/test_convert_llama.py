"""Converted drafts load in the real llama.cpp and compute what the checkpoint means.

For each kind (Qwen3 DFlash, Qwen3 DSpark with Markov + confidence heads, standard EAGLE-3;
Gemma 4's need a gemma4 target: tests/test_gemma4.py) the converted GGUF runs one draft step
in llama.cpp (through specgguf.runtime.native) on random target features, and its logits are compared with the numpy
reference forward pass (tests/reference_dspark.py) on the same checkpoint weights.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from specgguf.runtime import native
from specgguf.converters import convert
from specgguf.converters.safetensors import Weights

import checkpoint_fixtures as F
import reference_dspark as R

SPEC = F.TargetSpec()
P = 6  # context positions fed before the block


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return F.make_target_gguf(tmp_path_factory.mktemp("tgt") / "target.gguf", SPEC)


@pytest.fixture(scope="module")
def target_ctx(target):
    with native.Model(target) as m, native.Context(m, n_ctx=64, n_batch=32) as c:
        yield c


def checkpoint_weights(directory) -> dict:
    with Weights(directory) as w:
        return {n: (w[n].float32() if w[n].dtype in ("BF16", "F16", "F32") else np.array(w[n].raw()))
                for n in w.names()}


def draft_block(path, target_ctx, feats, anchor, mask, bs, shared):
    """llama.cpp: inject features at 0..P-1, decode [anchor, mask...] at P..; logits, confidences."""
    with native.Model(path) as m, native.Context(m, n_ctx=64, n_batch=32,
                                                 ctx_other=target_ctx if shared else None) as c:
        c.set_causal(False)
        c.set_embeddings_nextn(True, True)
        b = native.Batch(c)
        for i, row in enumerate(feats):
            b.add_embedding(row, i)
        c.decode(b)
        b.clear()
        b.add_tokens([anchor] + [mask] * (bs - 1), len(feats), outputs="all")
        c.decode(b)
        logits = np.stack([c.logits(i).copy() for i in range(bs)])
        conf = c.embeddings_nextn(bs, m.n_embd)[:, 0] if m.meta("dflash.has_confidence_head") == "true" else None
        b.close()
    return logits, conf


CASES = {  # name: (backbone, markov_rank, confidence head, shards)
    "qwen3-dflash": ("qwen3", 0, False, 1),
    "qwen3-dspark": ("qwen3", 32, True, 1),
    "qwen3-dspark-sharded": ("qwen3", 32, True, 3),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, (backbone, rank, conf, shards) in CASES.items():
        out[name] = F.make_dspark_checkpoint(root / name, SPEC, backbone=backbone, markov_rank=rank,
                                             conf=conf, shards=shards)
    return out


@pytest.mark.parametrize("out_type, head", [("f32", "own"), ("f16", "shared"), ("f16", "own")])
@pytest.mark.parametrize("case", list(CASES))
def test_draft_logits_match_reference(tmp_path, checkpoints, target, target_ctx, case, out_type, head):
    ck = checkpoints[case]
    cfg = json.loads((ck / "config.json").read_text())
    out = convert(str(ck), target, tmp_path / "d.gguf", out_type, head)
    w = checkpoint_weights(ck)
    rng = np.random.default_rng(7)
    for trial in range(3):
        feats = rng.normal(0, 1, (P, len(cfg["target_layer_ids"]) * SPEC.n_embd)).astype(np.float32)
        anchor = int(rng.integers(0, SPEC.n_vocab - 8))
        ref, ref_conf = R.dspark_block(w, cfg, feats, anchor)
        got, conf = draft_block(out.path, target_ctx, feats, anchor, cfg["mask_token_id"],
                                cfg["block_size"], head == "shared")
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert rel < 5e-3, f"{case} {out_type}: max relative error {rel:.2e}"
        assert np.array_equal(got.argmax(1), ref.argmax(1)), (got.argmax(1), ref.argmax(1))
        if ref_conf is not None:
            assert conf is not None and np.abs(conf - ref_conf).max() < 2e-3


def test_q8_0_argmax_agreement(tmp_path, checkpoints, target, target_ctx, capsys):
    rates = {}
    for case in ("qwen3-dspark",):
        ck = checkpoints[case]
        cfg = json.loads((ck / "config.json").read_text())
        out = convert(str(ck), target, tmp_path / f"{case}.gguf", "q8_0", "shared")
        assert gguf.GGUFReader(out.path).get_tensor(0) is not None
        w = checkpoint_weights(ck)
        rng = np.random.default_rng(11)
        agree = total = 0
        worst = 0.0
        for trial in range(10):
            feats = rng.normal(0, 1, (P, len(cfg["target_layer_ids"]) * SPEC.n_embd)).astype(np.float32)
            anchor = int(rng.integers(0, SPEC.n_vocab - 8))
            ref, _ = R.dspark_block(w, cfg, feats, anchor)
            got, _ = draft_block(out.path, target_ctx, feats, anchor, cfg["mask_token_id"],
                                 cfg["block_size"], True)
            agree += int((got.argmax(1) == ref.argmax(1)).sum())
            total += len(ref)
            worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
        rates[case] = (agree / total, worst)
        assert agree / total >= 0.8, f"{case}: Q8_0 argmax agreement {agree}/{total}"
    with capsys.disabled():
        for case, (rate, worst) in rates.items():
            print(f"\n  Q8_0 {case}: argmax agreement {rate:.1%}, max relative error {worst:.2e}")


def read_kv(path) -> dict:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}, \
        {t.name: t.tensor_type.name for t in r.tensors}


def test_metadata_shift_anchor_mask_and_tokenizer(tmp_path, checkpoints, target):
    out = convert(str(checkpoints["qwen3-dflash"]), target, tmp_path / "d.gguf", "q8_0", "shared")
    kv, types = read_kv(out.path)
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.target_layers"] == [1, 2, 3]  # DeepSpec [0, 1, 2] + 1
    assert kv["dflash.sample_from_anchor"] is True  # DFlash too: DeepSpec slot 0 is a draft
    assert kv["dflash.block_size"] == 4 and kv["dflash.has_confidence_head"] is False
    assert kv["tokenizer.ggml.mask_token_id"] == SPEC.mask_id
    tkv, _ = read_kv(target)
    for key, value in tkv.items():
        if key.startswith("tokenizer."):
            assert kv[key] == value, key
    # shared head: neither token_embd nor output; 1-D tensors stay F32
    assert "token_embd.weight" not in types and "output.weight" not in types
    assert all(types[n] == "F32" for n in types if n.endswith("norm.weight"))
    assert types["fc.weight"] == "Q8_0"
    with native.Model(out.path) as m:
        assert m.target_layer_ids == [1, 2, 3] and m.n_vocab == SPEC.n_vocab


def test_head_own_writes_both(tmp_path, checkpoints, target):
    out = convert(str(checkpoints["qwen3-dspark"]), target, tmp_path / "d.gguf", "f16", "own")
    _, types = read_kv(out.path)
    assert "token_embd.weight" in types and "output.weight" in types
    assert types["conf_proj.weight"] == "F32" and types["markov_w1.weight"] == "F16"


def test_k_quant_through_llama_quantize(tmp_path):
    spec = F.TargetSpec(n_embd=256, n_ff=256, head_dim=64)
    tgt = F.make_target_gguf(tmp_path / "t256.gguf", spec)
    ck = F.make_dspark_checkpoint(tmp_path / "ck", spec, n_layer=1)
    out = convert(str(ck), tgt, tmp_path / "d.gguf", "q4_k_m", "own")
    assert any(t.startswith("Q4_K") for t in out.types), out.types
    assert out.types.get("F32") and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    cfg = json.loads((ck / "config.json").read_text())
    w = checkpoint_weights(ck)
    feats = np.random.default_rng(3).normal(0, 1, (P, 3 * 256)).astype(np.float32)
    ref, _ = R.dspark_block(w, cfg, feats, 42)
    with native.Model(tgt) as m, native.Context(m, n_ctx=64, n_batch=32) as c:
        got, _ = draft_block(out.path, c, feats, 42, cfg["mask_token_id"], cfg["block_size"], False)
    assert np.isfinite(got).all()
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.5


def test_eagle3_logits_match_reference(tmp_path, target, target_ctx):
    ck = F.make_eagle3_checkpoint(tmp_path / "e3", SPEC)
    cfg = json.loads((ck / "config.json").read_text())
    out = convert(str(ck), target, tmp_path / "e3.gguf", "f32", "own")
    kv, types = read_kv(out.path)
    assert kv["eagle3.target_layers"] == [1, 2, 3] and types["d2t"] == "I64"
    w = checkpoint_weights(ck)
    rng = np.random.default_rng(9)
    n = 5
    feats = rng.normal(0, 1, (n, 3 * SPEC.n_embd)).astype(np.float32)
    tokens = [int(t) for t in rng.integers(0, 300, n)]
    with native.Model(out.path) as m, native.Context(m, n_ctx=64, n_batch=32) as c:
        c.set_embeddings_nextn(True, True)
        b = native.Batch(c)
        for i, row in enumerate(feats):  # encoder: fc over the fused features
            b.add_embedding(row, i, output=True)
        c.encode(b)
        g = c.embeddings_nextn(n, m.n_embd)
        b.clear()
        for i in range(n):  # decoder: (token, g) pairs at positions 0..n-1
            b.add_embedding(g[i], i, output=True, token=tokens[i])
        c.decode(b)
        got = np.stack([c.logits(i).copy() for i in range(n)])
        b.close()
    assert np.allclose(g, feats @ w["fc.weight"].T, rtol=1e-3, atol=1e-3)
    ref_draft = R.eagle3_step(w, cfg, g.astype(np.float64), tokens, np.arange(n))
    d2t = w["d2t"] + np.arange(len(w["d2t"]))
    ref = np.full((n, SPEC.n_vocab), -np.inf)
    ref[:, d2t] = ref_draft
    assert np.all(np.isneginf(got[:, np.setdiff1d(np.arange(SPEC.n_vocab), d2t)]))
    rel = np.abs(got[:, d2t] - ref_draft).max() / np.abs(ref_draft).max()
    assert rel < 5e-3 and np.array_equal(got.argmax(1), ref.argmax(1))


def test_interrupted_write_leaves_nothing_and_keeps_old_file(tmp_path, checkpoints, target, monkeypatch):
    out = tmp_path / "d.gguf"
    out.write_bytes(b"old draft")
    from specgguf.converters import writer

    real = writer._slabs
    calls = {"n": 0}

    def interrupted(t, q, *rest):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        yield from real(t, q, *rest)

    monkeypatch.setattr(writer, "_slabs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert(str(checkpoints["qwen3-dspark"]), target, out, "f16", "own")
    assert out.read_bytes() == b"old draft"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.gguf"]
