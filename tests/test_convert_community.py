"""Community DFlash / DSpark / DFlash 2 layouts (issue 43) convert to the GGUF the pinned
llama.cpp expects, or are refused with one line and no file (docs/gguf-formats.md §8).

Every checkpoint is synthetic (tests/checkpoint_fixtures.py): the DeepSpec draft's weights
saved as SpecForge (DSparkDraftModel), vLLM speculators (DSparkSpeculator), LiquidAI
(Lfm2DSparkDraftModel, interleaved RoPE), Ling (LingDSparkModel), z-lab DFlash
(DFlashDraftModel) and DFlash 2 (DFlash2DraftModel: dynamic convolutions and a top-K selector)
would save them, for the synthetic qwen3 target (specgguf.synthetic.write_qwen3). Converted
files are loaded by the stock llama.cpp; some run one draft block there.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import zipfile

import gguf
import numpy as np
import pytest

from specgguf.errors import UserError
from specgguf.converters import convert
from specgguf.converters.community import zlab_default_layers
from specgguf.converters.safetensors import Weights
from specgguf.runtime import native
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3

import checkpoint_fixtures as F
import reference_dspark as R

P = 6  # context positions fed before a block


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("qwen3") / "target.gguf", QwenShape(), seed=0)


@pytest.fixture(scope="module")
def spec(target):
    return F.qwen3_target_spec(target)


@pytest.fixture(scope="module")
def target_ctx(target):
    with native.Model(target) as m, native.Context(m, n_ctx=64, n_batch=32) as c:
        yield c


def read(path):
    r = gguf.GGUFReader(path)
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return kv, {t.name: t for t in r.tensors}


def loads(path) -> None:
    """The stock llama.cpp loads the file (llama_model_load_from_file, default params)."""
    with native.Model(path) as m:
        assert m.n_embd > 0


def refused(tmp_path, ckpt, target, match, **kw) -> str:
    out = tmp_path / "out" / "d.gguf"
    out.parent.mkdir(exist_ok=True)
    with pytest.raises(UserError, match=match) as err:
        convert(str(ckpt), target, out, **kw)
    assert "\n" not in str(err.value)
    assert list(out.parent.iterdir()) == []  # no output, no .partial file
    return str(err.value)


def ck(tmp_path, spec, layout, name="ck", **kw):
    if layout == "deepspec":
        return F.make_dspark_checkpoint(tmp_path / name, spec, **kw)
    return F.make_community_checkpoint(tmp_path / name, spec, layout, **kw)


# -- each layout converts and loads ---------------------------------------------------------

CONVERTS = {  # case: (layout, checkpoint options, kind, sample_from_anchor)
    "specforge": ("specforge", {}, "dspark", True),
    "speculators": ("speculators", {}, "dspark", False),
    "speculators-anchor": ("speculators", {"sample_from_anchor": True}, "dspark", True),
    "speculators-reduced": ("speculators", {"draft_vocab": 200}, "dspark", False),
    "lfm2": ("lfm2", {}, "dspark", True),
    "ling": ("ling", {}, "dspark", True),
    "zlab": ("zlab", {}, "dflash", False),
    "dflash2": ("dflash2", {}, "dflash2", False),
}


@pytest.mark.parametrize("case", list(CONVERTS))
def test_layout_converts_and_loads(tmp_path, target, spec, case):
    layout, options, kind, anchor = CONVERTS[case]
    out = convert(str(ck(tmp_path, spec, layout, **options)), target, tmp_path / "d.gguf")
    assert out.kind == kind and out.summary["layout"] == layout
    kv, tensors = read(out.path)
    assert kv["general.architecture"] == "dflash"
    assert kv["dflash.target_layers"] == [1, 2, 3]  # DeepSpec ids [0, 1, 2] + 1 = speculators' aux ids
    assert kv["dflash.sample_from_anchor"] is anchor
    assert kv["tokenizer.ggml.mask_token_id"] == spec.mask_id
    assert ("markov_w1.weight" in tensors) == (kind == "dspark")
    assert ("selector_hidden.weight" in tensors) == (kind == "dflash2")
    reduced = case == "speculators-reduced"
    assert ("output.weight" in tensors) == reduced and "token_embd.weight" not in tensors
    loads(out.path)


@pytest.mark.parametrize("layout", ["specforge", "lfm2", "zlab", "speculators"])
def test_own_head_without_tables_takes_the_targets(tmp_path, target, spec, layout):
    # these exports ship no embed_tokens (most no lm_head either): they are the target's anyway
    c = ck(tmp_path, spec, layout)
    out = convert(str(c), target, tmp_path / "d.gguf", "f32", "own")
    assert np.array_equal(gguf_table(out.path, "token_embd.weight"), gguf_table(target, "token_embd.weight"))
    head = gguf_table(out.path, "output.weight")
    if layout == "speculators":  # it ships its lm_head: that one
        assert np.array_equal(head, checkpoint_weights(c)["lm_head.weight"])
    else:
        assert np.array_equal(head, gguf_table(target, "output.weight"))
    loads(out.path)


def test_model_prefixed_tensor_names(tmp_path, target, spec):
    """Some DFlash exports keep their tensors under `model.` (the pinned converter adds it)."""
    def edit(cfg, t):
        for n in list(t):
            t["model." + n] = t.pop(n)
    a = convert(str(ck(tmp_path, spec, "zlab")), target, tmp_path / "a.gguf")
    b = convert(str(ck(tmp_path, spec, "zlab", name="pre", edit=edit)), target, tmp_path / "b.gguf")
    assert tensor_bytes(a.path) == tensor_bytes(b.path)


# -- the same weights give the same tensors, whatever the layout ----------------------------

def tensor_bytes(path) -> dict:
    return {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape), bytes(np.asarray(t.data).tobytes()))
            for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("out_type", ["f16", "bf16"])
def test_deepspec_specforge_speculators_lfm2_ling_tensors_are_byte_identical(tmp_path, target, spec, out_type):
    """DeepSpec names, DSparkDraftModel's nested keys, DSparkSpeculator's nested backbone and
    aux ids, LFM2's interleaved q/k rows (permuted back) and Ling's class name: one model."""
    got = {}
    for layout in ("deepspec", "specforge", "speculators", "lfm2", "ling"):
        c = ck(tmp_path, spec, layout, name=layout)
        got[layout] = tensor_bytes(convert(str(c), target, tmp_path / f"{layout}.gguf", out_type).path)
    want = got.pop("deepspec")
    assert "markov_w1.weight" in want and "conf_proj.weight" in want
    for layout, tensors in got.items():
        assert tensors.keys() == want.keys(), layout
        for name in want:
            assert tensors[name] == want[name], f"{layout}: {name} differs from the DeepSpec conversion"


def test_target_layers_by_layout(tmp_path, target, spec):
    # speculators: aux ids are layer inputs, written as they are
    c = ck(tmp_path, spec, "speculators", name="s", target_layer_ids=(-1, 1))  # aux [0, 2]
    assert json.loads((c / "config.json").read_text())["aux_hidden_state_layer_ids"] == [0, 2]
    assert read(convert(str(c), target, tmp_path / "s.gguf").path)[0]["dflash.target_layers"] == [0, 2]
    # z-lab without target_layer_ids: its build_target_layer_ids(num_target_layers, n_draft), + 1
    def no_ids(cfg, t):
        del cfg["dflash_config"]["target_layer_ids"]
    c = ck(tmp_path, spec, "zlab", name="z", n_layer=1, target_layer_ids=(1,), edit=no_ids)
    assert zlab_default_layers(4, 1) == [2]
    assert read(convert(str(c), target, tmp_path / "z.gguf").path)[0]["dflash.target_layers"] == [3]


# -- keys seen in the wild ------------------------------------------------------------------

def test_runtime_keys_are_written_as_the_pinned_converter_does(tmp_path, target, spec, target_ctx):
    def edit(cfg, t):
        cfg["dflash_config"].update(attention_value_scale=0.5, output_multiplier=2.0,
                                    final_logit_softcapping=30.0, input_embedding_scale=8.0, causal=True)
        cfg.update(partial_rotary_factor=0.5, use_sliding_window=True, sliding_window=64,
                   layer_types=["sliding_attention", "full_attention"], runtime_block_size=3)
        del t["confidence_head.proj.bias"]  # optional in the runtime
    warnings = []
    out = convert(str(ck(tmp_path, spec, "specforge", edit=edit)), target, tmp_path / "d.gguf",
                  warn=warnings.append)
    kv, tensors = read(out.path)
    assert kv["dflash.rope.dimension_count"] == 8  # head_dim 16 x 0.5
    assert kv["dflash.attention.value_scale"] == 0.5
    assert kv["dflash.logit_scale"] == 2.0
    assert kv["dflash.final_logit_softcapping"] == 30.0
    assert kv["dflash.embedding_scale"] == 8.0
    assert kv["dflash.attention.causal"] is True
    assert kv["dflash.attention.sliding_window"] == 64
    assert kv["dflash.attention.sliding_window_pattern"] == [True, False]
    assert "conf_proj.weight" in tensors and "conf_proj.bias" not in tensors
    assert any("runtime_block_size" in w and "--draft-max 3" in w for w in warnings), warnings
    assert any("Markov bias" in w for w in warnings), warnings  # logits scaled before the bias
    with native.Model(out.path) as m:
        assert m.n_swa == 64
    feats = np.random.default_rng(0).normal(0, 1, (P, 3 * spec.n_embd)).astype(np.float32)
    assert np.all(np.isfinite(draft_block(out.path, target_ctx, feats, [5] + [spec.mask_id] * 3)))
    # no key, no entry: the defaults stay the runtime's
    kv, _ = read(convert(str(ck(tmp_path, spec, "specforge", name="plain")), target, tmp_path / "p.gguf").path)
    assert kv["dflash.rope.dimension_count"] == 16
    for key in ("attention.value_scale", "logit_scale", "final_logit_softcapping", "embedding_scale",
                "attention.causal", "attention.sliding_window", "rope.dimension_sections"):
        assert "dflash." + key not in kv, key


def test_mrope_target_gets_temporal_rope_sections(tmp_path):
    """Beside an M-RoPE target the draft ropes on the temporal section only: the same logits as
    the plain NeoX draft (every position row holds the token's position)."""
    spec = F.TargetSpec()
    c = ck(tmp_path, spec, "specforge")
    feats = np.random.default_rng(0).normal(0, 1, (P, 3 * spec.n_embd)).astype(np.float32)
    got = {}
    for name, extra in (("mrope", {"qwen3.rope.dimension_sections": [8, 4, 4, 0]}), ("plain", None)):
        target = F.make_target_gguf(tmp_path / f"{name}.gguf", spec, extra_arrays=extra)
        out = convert(str(c), target, tmp_path / f"{name}-draft.gguf", "f32")
        kv, _ = read(out.path)
        assert kv.get("dflash.rope.dimension_sections") == ([spec.head_dim // 2, 0, 0, 0] if extra else None)
        with native.Model(target) as m, native.Context(m, n_ctx=64, n_batch=32) as tc:
            got[name] = draft_block(out.path, tc, feats, [5] + [spec.mask_id] * 3)
    assert np.allclose(got["mrope"], got["plain"], atol=1e-4)


def test_confidence_head_without_markov_input_is_left_out(tmp_path, target, spec):
    def edit(cfg, t):
        cfg["confidence_head_with_markov"] = False
        t["confidence_head.proj.weight"] = t["confidence_head.proj.weight"][:, :spec.n_embd].copy()
    warnings = []
    out = convert(str(ck(tmp_path, spec, "speculators", edit=edit)), target, tmp_path / "d.gguf",
                  warn=warnings.append)
    kv, tensors = read(out.path)
    assert "conf_proj.weight" not in tensors and kv["dflash.has_confidence_head"] is False
    assert any("confidence_head_with_markov" in w for w in warnings)
    loads(out.path)


def test_speculators_causal_sliding_window(tmp_path, target, spec):
    def edit(cfg, t):
        cfg["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=32)
    kv, _ = read(convert(str(ck(tmp_path, spec, "speculators", edit=edit)), target, tmp_path / "d.gguf").path)
    assert kv["dflash.attention.causal"] is True  # sliding_window_non_causal false
    assert kv["dflash.attention.sliding_window_pattern"] == [True, True]


# -- reduced draft vocabulary (d2t) ---------------------------------------------------------

def checkpoint_weights(directory) -> dict:
    with Weights(directory) as w:
        return {n: (w[n].float32() if w[n].dtype in ("BF16", "F16", "F32") else np.array(w[n].raw()))
                for n in w.names()}


def test_reduced_vocabulary_runs_with_d2t(tmp_path, target, spec, target_ctx):
    """llama.cpp scatters the draft head's logits (and the Markov bias) to the target ids in d2t
    and leaves every other id at -inf (src/models/dflash.cpp)."""
    c = ck(tmp_path, spec, "speculators", draft_vocab=200, sample_from_anchor=True)
    out = convert(str(c), target, tmp_path / "d.gguf", "f32")
    _, tensors = read(out.path)
    w = checkpoint_weights(c)
    keep = w["d2t"] + np.arange(200)
    assert tensors["d2t"].tensor_type.name == "I64" and np.array_equal(np.asarray(tensors["d2t"].data), keep)
    assert tuple(int(d) for d in tensors["output.weight"].shape) == (spec.n_embd, 200)
    assert tuple(int(d) for d in tensors["markov_w2.weight"].shape) == (32, 200)
    cfg = {**F.dspark_config(spec), "block_size": 4}
    full = dict(w)
    for name in ("lm_head.weight", "markov_head.markov_w2.weight"):  # scattered to full rows
        rows = np.zeros((spec.n_vocab, w[name].shape[1]), dtype=np.float32)
        rows[keep] = w[name]
        full[name] = rows
    full["embed_tokens.weight"] = gguf_table(target, "token_embd.weight")
    rng = np.random.default_rng(3)
    for _ in range(2):
        feats = rng.normal(0, 1, (P, 3 * spec.n_embd)).astype(np.float32)
        anchor = int(rng.integers(0, 250))
        ref, _ = R.dspark_block(full, cfg, feats, anchor)
        got = draft_block(out.path, target_ctx, feats, [anchor] + [spec.mask_id] * 3)
        others = np.setdiff1d(np.arange(spec.n_vocab), keep)
        assert np.all(np.isneginf(got[:, others]))
        assert set(got.argmax(1)) <= set(keep.tolist())
        # slot 0's Markov bias reads the anchor, as in the reference (later slots chain on argmax)
        assert np.abs(got[0, keep] - ref[0, keep]).max() < 5e-3 * np.abs(ref[0, keep]).max()


def gguf_table(path, name) -> np.ndarray:
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return np.asarray(t.data, dtype=np.float32).reshape(int(t.shape[1]), int(t.shape[0]))


def draft_block(path, target_ctx, feats, tokens, nextn=False):
    """Inject features at 0..P-1, decode `tokens` at P..; logits (and the nextn rows)."""
    with native.Model(path) as m, native.Context(m, n_ctx=64, n_batch=32, ctx_other=target_ctx) as c:
        c.set_causal(False)
        c.set_embeddings_nextn(True, not nextn)
        b = native.Batch(c)
        for i, row in enumerate(feats):
            b.add_embedding(row, i)
        c.decode(b)
        b.clear()
        b.add_tokens(tokens, len(feats), outputs="all")
        c.decode(b)
        logits = np.stack([c.logits(i).copy() for i in range(len(tokens))])
        rows = c.embeddings_nextn(len(tokens), m.n_embd) if nextn else None
        b.close()
    return (logits, rows) if nextn else logits


# -- DFlash 2 -------------------------------------------------------------------------------

def test_dflash2_keys_and_tensors(tmp_path, target, spec):
    out = convert(str(ck(tmp_path, spec, "dflash2")), target, tmp_path / "d.gguf")
    kv, tensors = read(out.path)
    assert (kv["dflash.conv_kernel_size"], kv["dflash.conv_group_size"]) == (2, 16)
    assert (kv["dflash.selector_rank"], kv["dflash.selector_top_k"]) == (8, 4)
    H, V, groups = spec.n_embd, spec.n_vocab, spec.n_embd // 16
    shapes = {n: tuple(int(d) for d in t.shape) for n, t in tensors.items()}  # GGUF order, fastest first
    for i in range(2):
        for side in ("attn", "ffn"):
            assert shapes[f"blk.{i}.{side}_conv_base"] == (H, 2, 2)  # {n_embd, kernel, 2}
            assert tensors[f"blk.{i}.{side}_conv_base"].tensor_type.name == "F32"
            assert shapes[f"blk.{i}.{side}_conv_proj.weight"] == (H, 2 * 2 * groups)
    assert shapes["selector_predecessor.weight"] == shapes["selector_successor.weight"] == (8, V)
    assert shapes["selector_hidden.weight"] == (H, 8)
    assert out.summary["selector"] == {"rank": 8, "top_k": 4, "conv_kernel": 2, "conv_group": 16}
    loads(out.path)


def test_dflash2_lattice_layout(tmp_path, target, spec, target_ctx):
    """What the selector packs into the nextn rows (src/models/dflash.cpp build_dflash2_selector):
    row 0 of a block is zeros; row p holds the top-K candidate ids of position p (as floats),
    then K x K scores, predecessor-major: scores[j*K + i] = logit(cand_p[i]) +
    succ[cand_p[i]] . (pred[prev_j] * gate_p), prev_j = the anchor for p = 1, cand_{p-1}[j] after.
    With a zero predecessor codebook every score is its candidate's logit."""
    def zero_predecessor(cfg, t):
        t["candidate_selector.predecessor_codebook"][:] = 0.0
    K = 4
    for name, edit in (("random", None), ("zero", zero_predecessor)):
        out = convert(str(ck(tmp_path, spec, "dflash2", name=name, edit=edit)), target,
                      tmp_path / f"{name}.gguf", "f32")
        rng = np.random.default_rng(5)
        feats = rng.normal(0, 1, (P, 3 * spec.n_embd)).astype(np.float32)
        logits, rows = draft_block(out.path, target_ctx, feats, [17] + [spec.mask_id] * 3, nextn=True)
        assert np.all(rows[0] == 0)
        for p in range(1, 4):
            cand = rows[p, :K]
            assert np.array_equal(cand, np.round(cand)) and np.all(rows[p, K + K * K:] == 0)
            top = np.argsort(-logits[p])[:K]
            assert set(cand.astype(int).tolist()) == set(top.tolist()), (p, cand, top)
            scores = rows[p, K:K + K * K].reshape(K, K)  # [predecessor j, successor i]
            unary = logits[p, cand.astype(int)]
            if p == 1:  # one predecessor (the anchor), repeated over j
                assert np.allclose(scores, scores[0])
            if name == "zero":
                assert np.allclose(scores, unary[None, :], atol=1e-4)
            else:
                assert not np.allclose(scores, unary[None, :], atol=1e-4)


# -- refusals: one line, no file ------------------------------------------------------------

def _set(path_keys, value):
    def edit(cfg, t):
        d = cfg
        for k in path_keys[:-1]:
            d = d[k]
        d[path_keys[-1]] = value
    return edit


def _drop(*names):
    def edit(cfg, t):
        for n in names:
            del t[n]
    return edit


REFUSALS = {  # case: (layout, options, match)
    "gated-markov": ("specforge", {"edit": _set(("dflash_config", "markov_head_type"), "gated")},
                     "Markov head type 'gated' is not supported"),
    "rnn-markov": ("speculators", {"edit": _set(("markov_head_type",), "rnn")},
                   "Markov head type 'rnn' is not supported"),
    "reduced-without-d2t": ("speculators", {"draft_vocab": 200, "edit": _drop("d2t")},
                            "no d2t table"),
    "dflash2-reduced": ("dflash2", {"edit": _set(("draft_vocab_size",), 200)}, "reduced draft vocabulary"),
    "dflash2-codebook-rank": ("dflash2", {"edit": _set(("dflash_config", "selector_rank"), 6)},
                              r"predecessor_codebook has shape \[.*\] but .* needs"),
    "dflash2-hidden-shape": ("dflash2", {"edit": lambda c, t: t.update(
        {"candidate_selector.hidden_projection.weight": t["candidate_selector.hidden_projection.weight"].T.copy()})},
        "hidden_projection.weight has shape"),
    "dflash2-top-k": ("dflash2", {"edit": _set(("dflash_config", "selector_top_k"), 8)},
                      "selector_top_k 8 needs 72 values"),
    "dflash2-group": ("dflash2", {"edit": _set(("dflash_config", "conv_group_size"), 24)},
                      "conv_group_size 24 does not divide"),
    "dflash2-kernel": ("dflash2", {"edit": _set(("dflash_config", "conv_kernel_size"), 5)},
                       "conv_kernel_size 5 exceeds block_size 4"),
    "dflash2-missing-keys": ("dflash2", {"edit": lambda c, t: c["dflash_config"].pop("selector_top_k")},
                             "without selector_top_k"),
    "dflash2-anchor": ("dflash2", {"sample_from_anchor": True}, "selector walks in-place slots"),
    "runtime-block": ("specforge", {"edit": _set(("runtime_block_size",), 9)},
                      "runtime_block_size 9 must lie in 2..block_size"),
    "layer-type": ("specforge", {"edit": _set(("layer_types",), ["linear_attention", "full_attention"])},
                   "layer types \\['linear_attention'\\]"),
    "mixed-causal": ("speculators", {"edit": lambda c, t: c["transformer_layer_config"].update(
        layer_types=["sliding_attention", "full_attention"], sliding_window=32)}, "one causal setting"),
    "zlab-no-layers": ("zlab", {"edit": lambda c, t: (c["dflash_config"].pop("target_layer_ids"),
                                                      c.pop("num_target_layers"))},
                       "neither target_layer_ids nor num_target_layers"),
    "zlab-no-mask": ("zlab", {"edit": lambda c, t: c["dflash_config"].pop("mask_token_id")},
                     "lacks mask_token_id"),
    "unknown-tensor": ("specforge", {"edit": lambda c, t: t.update(
        {"markov_head.gate_proj.weight": np.zeros((4, 4), np.float32)})}, "does not know"),
    "partial-rotary": ("lfm2", {"edit": _set(("partial_rotary_factor",), 0.2)}, "rotated dimensions"),
    "bad-dflash-config": ("specforge", {"edit": _set(("dflash_config",), [1, 2])},
                          "dflash_config must be an object"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_with_one_line_and_no_file(tmp_path, target, spec, case):
    layout, options, match = REFUSALS[case]
    refused(tmp_path, ck(tmp_path, spec, layout, **options), target, match)


def test_dflash2_with_markov_head_is_refused(tmp_path, target, spec):
    def edit(cfg, t):
        cfg["dflash_config"]["markov_rank"] = 32
        base = F.dspark_tensors(spec, F.dspark_config(spec))
        t.update({k: v for k, v in base.items() if k.startswith("markov_head.")})
    refused(tmp_path, ck(tmp_path, spec, "dflash2", edit=edit), target, "DFlash 2 checkpoint with a Markov head")


def test_cli_refusal_is_one_error_line(tmp_path, target, spec):
    c = ck(tmp_path, spec, "speculators", edit=_set(("markov_head_type",), "gated"))
    out = tmp_path / "o" / "d.gguf"
    out.parent.mkdir()
    proc = subprocess.run([sys.executable, "-m", "specgguf", "convert", str(c), "--target", str(target),
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'gated'" in errors[0], proc.stderr
    assert list(out.parent.iterdir()) == []


# -- mask_embedding.pt ----------------------------------------------------------------------

def test_mask_embedding_patches_the_embedding_table(tmp_path, target, spec):
    c = ck(tmp_path, spec, "specforge")
    vector = np.random.default_rng(9).normal(0, 1, spec.n_embd).astype(np.float32)
    F.write_torch_pt(c / "mask_embedding.pt", {"mask_token_id": spec.mask_id, "embedding": vector})
    warnings = []
    out = convert(str(c), target, tmp_path / "d.gguf", "f32", warn=warnings.append)
    assert out.head == "shared" and out.summary["head"] == "own"
    assert any("mask_embedding.pt" in w for w in warnings)
    embd = gguf_table(out.path, "token_embd.weight")
    want = gguf_table(target, "token_embd.weight")
    assert np.array_equal(embd[spec.mask_id], vector)
    rest = np.arange(spec.n_vocab) != spec.mask_id
    assert np.array_equal(embd[rest], want[rest])
    assert np.array_equal(gguf_table(out.path, "output.weight"), gguf_table(target, "output.weight"))
    loads(out.path)


def _pickle_zip(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", payload)
        z.writestr("archive/version", "3\n")


@pytest.mark.parametrize("case, match", [
    ("wrong-id", "is for mask token 5 but the config's mask_token_id"),
    ("wrong-shape", r"embedding has shape \[32\], expected \[64\]"),
    ("legacy", "not a torch.save zip archive"),
    ("code", "holds objects other than tensors and numbers \\(os.system\\)"),
    ("not-dict", "holds a list, not a dict"),
    ("damaged", "damaged or not a torch.save file"),
])
def test_bad_mask_embedding_is_refused(tmp_path, target, spec, case, match):
    c = ck(tmp_path, spec, "specforge")
    path = c / "mask_embedding.pt"
    vector = np.zeros(spec.n_embd, dtype=np.float32)
    if case == "wrong-id":
        F.write_torch_pt(path, {"mask_token_id": 5, "embedding": vector})
    elif case == "wrong-shape":
        F.write_torch_pt(path, {"mask_token_id": spec.mask_id, "embedding": vector[:32]})
    elif case == "legacy":
        path.write_bytes(pickle.dumps({"mask_token_id": spec.mask_id}))
    elif case == "code":
        _pickle_zip(path, b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00truer.")
    elif case == "not-dict":
        _pickle_zip(path, pickle.dumps([1, 2], protocol=2))
    else:
        _pickle_zip(path, b"\x80\x02}(X\x01\x00\x00\x00a")
    refused(tmp_path, c, target, match)


# -- specgguf drives them -------------------------------------------------------------------

@pytest.mark.parametrize("case", ["zlab", "speculators-reduced", "dflash2"])
def test_converted_layout_drafts_losslessly_in_specgguf(tmp_path, target, spec, case):
    """The engine's dflash/dspark drafter runs the converted file (a DFlash 2 file through its
    lattice walk, tests/test_dflash2.py) and leaves the target's greedy output unchanged."""
    from specgguf.decoding.engine import Engine
    from specgguf.drafters import make_drafter
    from specgguf.runtime.target import Target

    layout, options, kind, anchor = CONVERTS[case]
    out = convert(str(ck(tmp_path, spec, layout, **options)), target, tmp_path / "d.gguf")

    def run(tgt, drafter):
        gen = Engine(tgt, drafter, 3).generate(tgt.tokenize("hello world, the draft"), 24)
        for _ in gen:
            pass
        return gen

    with Target(target, n_ctx=256) as tgt:
        plain = run(tgt, None).tokens
        drafter = make_drafter(str(out.path), tgt, draft_max=3)
        try:
            assert drafter.kind == ("dspark" if kind == "dspark" else "dflash")
            assert drafter.sample_from_anchor is anchor
            gen = run(tgt, drafter)
            assert gen.tokens == plain and gen.stats.drafted > 0
        finally:
            drafter.close()


@pytest.mark.parametrize("case", ["zlab", "speculators-reduced", "lfm2", "specforge"])
def test_converted_layout_matches_llama_cpp_per_round(tmp_path, target, spec, case):
    """The stock llama-speculative-simple runs the converted file too, and specgguf drafts and
    accepts what it does, round for round (greedy; a reduced vocabulary through d2t). Random
    weights: the target accepts nothing, so this checks the drafted counts, each round's token
    and the text; the drafted tokens with acceptances are the DeepSpec file's (the tensors are
    byte-identical, above), whose parity tests/test_parity.py checks."""
    from test_dflash2 import parity_rounds

    layout, options, kind, _ = CONVERTS[case]
    out = convert(str(ck(tmp_path, spec, layout, **options)), target, tmp_path / "d.gguf")
    rounds = parity_rounds(target, out.path, tmp_path, draft_max=4, n_predict=24, spec_type=f"draft-{kind}")
    assert sum(n for n, _ in rounds) > 0


def test_models_lists_the_reported_community_drafters():
    """`specgguf models` lists the drafters others report (issue 43) beside DeepSpec's, each
    with its kind, target, layout, that it is reported, and what this release runs."""
    from conftest import run_cli
    from specgguf.converters import registry

    reported = registry.community()
    assert len(reported) >= 8
    for e in reported:
        assert {"repo", "kind", "target", "layout", "status", "runs"} <= set(e)
        assert e["status"].startswith("reported") and e["kind"] in ("dspark", "dflash", "dflash2")
    assert {e["kind"] for e in reported} == {"dspark", "dflash", "dflash2"}
    assert not any(registry.find(e["repo"]) for e in reported)  # never trusted for a conversion
    out = run_cli("models").stdout
    assert "reported by others" in out and "z-lab/Qwen3.8-27B-DFlash2" in out and "DSparkSpeculator" in out
