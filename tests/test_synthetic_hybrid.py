"""The synthetic hybrid targets (specgguf.synthetic.lfm2, .qwen35) in the pinned llama.cpp:

- F32 and Q8_0 files load with llama_cpp.Llama and greedy decoding repeats itself;
- the counting variants mostly step token t -> t + 1;
- both keep n_rs_seq (recurrent-state rollback) and expose every layer's input;
- qwen35's MTP block loads with load_mtp and, counting, drafts the successor of its token;
- shapes the pinned build would refuse or abort on raise ValueError and leave no file.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import llama_cpp
import numpy as np
import pytest

from specgguf.synthetic.lfm2 import Lfm2Shape, write_lfm2
from specgguf.synthetic.qwen3 import successor
from specgguf.synthetic.qwen35 import Qwen35Shape, write_qwen35

WRITERS = {"lfm2": (write_lfm2, Lfm2Shape()), "qwen35": (write_qwen35, Qwen35Shape())}
PROMPT = "The quick brown fox"
N = 20


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """(arch, quant, counting) -> a written GGUF, each written once for the module."""
    root, made = tmp_path_factory.mktemp("hybrid"), {}

    def get(arch: str, quant: str | None, counting: bool = False, **kw):
        key = (arch, quant, counting, tuple(sorted(kw.items())))
        if key not in made:
            write, shape = WRITERS[arch]
            name = f"{arch}-{quant or 'F32'}-{'counting' if counting else 'random'}-{len(made)}.gguf"
            made[key] = write(root / name, shape, seed=0, counting=counting, quant=quant, **kw)
        return made[key]

    return get


def _llama(path):
    return llama_cpp.Llama(str(path), n_ctx=256, n_threads=2, n_threads_batch=2, verbose=False)


def _greedy(llm, prompt_ids, n=N):
    out = []
    for tok in llm.generate(prompt_ids, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(tok)
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("quant", [None, "Q8_0"])
@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_loads_and_greedy_decoding_repeats(hybrid, arch, quant):
    llm = _llama(hybrid(arch, quant))
    try:
        first = llm.create_completion(PROMPT, max_tokens=N, temperature=0.0)
        llm.reset()
        again = llm.create_completion(PROMPT, max_tokens=N, temperature=0.0)
        assert first["usage"]["completion_tokens"] > 0
        assert first["choices"][0]["text"] == again["choices"][0]["text"]
    finally:
        llm.close()


@pytest.mark.parametrize("quant", [None, "Q8_0"])
@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_counting_variant_mostly_counts(hybrid, arch, quant):
    llm = _llama(hybrid(arch, quant, counting=True))
    try:
        prompt = llm.tokenize(PROMPT.encode(), add_bos=False)
        succ = successor(llm.n_vocab())
        chain = [prompt[-1]] + _greedy(llm, prompt)
        steps = sum(int(b == succ[a]) for a, b in zip(chain, chain[1:]))
        assert len(chain) == N + 1 and steps >= 0.75 * N, chain
        # the random variant does not: counting is the head's doing, not the tokenizer's
        llm.close()
        llm = _llama(hybrid(arch, quant))
        chain = [prompt[-1]] + _greedy(llm, prompt)
        assert sum(int(b == succ[a]) for a, b in zip(chain, chain[1:])) < 0.5 * N
    finally:
        llm.close()


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_rollback_snapshots_are_kept(hybrid, arch):
    """llama.cpp clamps n_rs_seq to 0 for archs without partial rollback: both hybrids keep it."""
    mp = llama_cpp.llama_model_default_params()  # AMX-guarded by conftest, as specgguf loads
    model = llama_cpp.llama_model_load_from_file(str(hybrid(arch, None)).encode(), mp)
    assert model
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_rs_seq, cp.n_threads, cp.n_threads_batch = 256, 4, 2, 2
    ctx = llama_cpp.llama_init_from_model(model, cp)
    try:
        assert ctx and llama_cpp.llama_n_rs_seq(ctx) == 4
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_every_layer_input_can_be_read(hybrid, arch):
    """What eagle3 / dflash drafts read: layer 0's input is the token embedding, and each
    layer's input differs from the one before."""
    import gguf

    from specgguf.runtime.native.batch import Batch
    from specgguf.runtime.native.context import Context
    from specgguf.runtime.native.model import Model

    path = hybrid(arch, None)
    model = Model(path)
    ctx = Context(model, n_ctx=256, n_threads=2)
    for il in range(model.n_layer):
        ctx.set_layer_input(il)
    toks = [40, 41, 42, 43]
    batch = Batch(ctx)
    batch.add_tokens(toks, 0, outputs="all")
    ctx.decode(batch)
    emb = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    rows = [ctx.layer_input(il, len(toks)) for il in range(model.n_layer)]
    np.testing.assert_allclose(rows[0], np.asarray(emb.data).reshape(-1, model.n_embd)[toks], atol=1e-5)
    assert all(not np.allclose(a, b) for a, b in zip(rows, rows[1:]))


@pytest.mark.parametrize("quant", [None, "Q8_0"])
def test_qwen35_mtp_block_loads_and_drafts_the_successor(hybrid, quant):
    path = hybrid("qwen35", quant, counting=True, mtp_layers=1)
    llm = _llama(path)  # load_mtp off (llama.cpp's default): the block is skipped, the trunk decodes
    try:
        assert llama_cpp.llama_model_n_layer_nextn(llm.model) == 1
        assert llm.create_completion(PROMPT, max_tokens=4, temperature=0.0)["usage"]["completion_tokens"] == 4
    finally:
        llm.close()

    mp = llama_cpp.llama_model_default_params()  # AMX-guarded by conftest, as specgguf loads
    mp.load_mtp = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    assert model
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 256, 2, 2
    tgt = llama_cpp.llama_init_from_model(model, cp)
    cp.ctx_type, cp.ctx_other = llama_cpp.LLAMA_CONTEXT_TYPE_MTP, tgt
    dft = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_ext_init(dft)
    try:
        assert tgt and dft
        H = llama_cpp.llama_model_n_embd(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        toks = [40, 41, 42, 43]
        # the hidden rows the target would hand over (t_h_nextn); a counting block ignores them
        h = np.random.default_rng(0).standard_normal((len(toks), H)).astype(np.float32)
        for i, t in enumerate(toks):
            idx = llama_cpp.llama_batch_ext_add_token(batch, 0, t)
            row = llama_cpp.llama_embd(h[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, H)
            assert llama_cpp.llama_batch_ext_set_embd_token(batch, idx, row)
            llama_cpp.llama_batch_ext_set_pos(batch, idx, (ctypes.c_int32 * 1)(i))
            llama_cpp.llama_batch_ext_set_output_logits(batch, idx, True)
        assert llama_cpp.llama_process(dft, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
        succ = successor(n_vocab)
        for i, t in enumerate(toks):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(dft, i), shape=(n_vocab,))
            assert int(logits.argmax()) == succ[t]
    finally:
        llama_cpp.llama_batch_ext_free(batch)
        llama_cpp.llama_free(dft)
        llama_cpp.llama_free(tgt)
        llama_cpp.llama_model_free(model)


BAD = [
    ("lfm2", replace(Lfm2Shape(), conv_pattern=(True, False)), {}),  # one entry per layer
    ("lfm2", replace(Lfm2Shape(), conv_pattern=(True,) * 4), {}),  # no attention layer: llama.cpp aborts
    ("lfm2", replace(Lfm2Shape(), n_head=3), {}),  # head_count must divide n_embd
    ("lfm2", replace(Lfm2Shape(), n_head_kv=3), {}),
    ("lfm2", replace(Lfm2Shape(), l_cache=1), {}),
    ("lfm2", replace(Lfm2Shape(), tied=True), {"counting": True}),
    ("qwen35", replace(Qwen35Shape(), full_attention_interval=5), {}),  # no attention layer
    ("qwen35", replace(Qwen35Shape(), n_v_heads=3), {}),  # value heads not a multiple of key heads
    ("qwen35", replace(Qwen35Shape(), n_head_kv=3), {}),
    ("qwen35", replace(Qwen35Shape(), rope_dim=32), {}),  # wider than head_dim
    ("qwen35", replace(Qwen35Shape(), rope_sections=(4, 2, 2, 0)), {}),  # more than rope_dim / 2
    ("qwen35", replace(Qwen35Shape(), conv_kernel=1), {}),
    ("qwen35", Qwen35Shape(), {"mtp_layers": 2}),  # the qwen35 MTP graph runs one block
    ("qwen35", replace(Qwen35Shape(), tied=True), {"counting": True}),
]


@pytest.mark.parametrize("arch,shape,kw", BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD)])
def test_bad_shape_raises_and_writes_nothing(tmp_path, arch, shape, kw):
    write, _ = WRITERS[arch]
    with pytest.raises(ValueError):
        write(tmp_path / "bad.gguf", shape, **kw)
    assert list(tmp_path.iterdir()) == []
