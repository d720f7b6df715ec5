"""Tiny deterministic `lfm2` target GGUFs for tests and demos (random weights): a hybrid of
short-convolution layers (recurrent: a conv state of `l_cache - 1` columns per sequence) and
grouped-query attention layers, as Liquid's LFM2.

What the pinned llama.cpp's loader asks for (src/models/lfm2.cpp, load_hparams in
src/llama-model.cpp):
- keys: `context_length`, `embedding_length`, `block_count`, `feed_forward_length`,
  `attention.head_count`, `attention.head_count_kv` as a per-layer array whose 0 entries mark
  the conv layers (that is how lfm2 tells them apart: is_recr = n_head_kv == 0),
  `shortconv.l_cache` (> 1) and `attention.layer_norm_rms_epsilon`; optional `rope.freq_base`
  and `attention.sliding_window` (not written: every attention layer sees all).
- tensors: `token_embd`, the final norm under the name `token_embd_norm` (llama.cpp's
  LLM_TENSOR_OUTPUT_NORM_LFM2), `output` (optional: tied to token_embd without it); per layer
  `attn_norm` (the operator norm), `ffn_norm`, `ffn_gate/up/down`; attention layers `attn_q`
  and `attn_output` (n_embd x n_embd: head_count x head_dim must be n_embd), `attn_k/v`,
  `attn_q_norm/k_norm` (head_dim); conv layers `shortconv.in_proj` (n_embd -> 3 n_embd: the
  B, C and x chunks), `shortconv.conv` (ne = {l_cache, n_embd}, numpy (n_embd, l_cache)) and
  `shortconv.out_proj`.

The graph exposes every layer's input (res->t_layer_inp[il] for il < n_layer), so eagle3 /
dflash extraction can read it; llama.cpp counts lfm2 hybrid (llama_model_is_hybrid) and not
recurrent, and lists it in llm_arch_supports_rs_rollback (n_rs_seq snapshots of the conv state).

    path = write_lfm2(tmp / "lfm2.gguf", Lfm2Shape(), seed=0, counting=True)

counting=True makes the predictable variant, as qwen3's counting target: greedy text mostly
steps through the vocabulary (token t -> t + 1), and the layers tip some near-ties.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._quant import file_type, make_counting, quantise
from .qwen3 import _initializers, add_tokenizer, finish_gguf

# each branch's last projection: what counting=True turns down
LFM2_OUT_PROJECTIONS = ("attn_output.weight", "shortconv.out_proj.weight", "ffn_down.weight")


@dataclass(frozen=True)
class Lfm2Shape:
    n_layer: int = 4
    conv_pattern: tuple = (True, True, False, True)  # per layer: short conv (True) or attention
    n_embd: int = 64
    n_head: int = 4  # head_dim = n_embd / n_head (lfm2's q and output projections are square)
    n_head_kv: int = 2
    n_ff: int = 128
    l_cache: int = 3  # conv kernel width; the state keeps l_cache - 1 columns (LFM2's is 3)
    n_merges: int = 250
    n_ctx_train: int = 4096
    tied: bool = False  # no output.weight (the released LFM2 ties them); counting needs a head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def lfm2_weights(shape: Lfm2Shape, n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random weights with GGUF names; numpy shapes are (ne1, ne0) as gguf expects."""
    mat, norm = _initializers(seed)
    H, hd, I = shape.n_embd, shape.head_dim, shape.n_ff
    w = {"token_embd.weight": mat(n_vocab, H, 1.0), "token_embd_norm.weight": norm(H)}
    if not shape.tied:
        w["output.weight"] = mat(n_vocab, H)
    for i, conv in enumerate(shape.conv_pattern):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(H)
        if conv:
            w[p + "shortconv.in_proj.weight"] = mat(3 * H, H)
            # a causal depthwise kernel: each channel mixes the last l_cache steps
            w[p + "shortconv.conv.weight"] = mat(H, shape.l_cache)
            w[p + "shortconv.out_proj.weight"] = mat(H, H)
        else:
            w[p + "attn_q.weight"] = mat(shape.n_head * hd, H)
            w[p + "attn_k.weight"] = mat(shape.n_head_kv * hd, H)
            w[p + "attn_v.weight"] = mat(shape.n_head_kv * hd, H)
            w[p + "attn_output.weight"] = mat(H, shape.n_head * hd)
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "ffn_norm.weight"] = norm(H)
        w[p + "ffn_gate.weight"] = mat(I, H)
        w[p + "ffn_up.weight"] = mat(I, H)
        w[p + "ffn_down.weight"] = mat(H, I)
    return w


def write_lfm2(path, shape: Lfm2Shape = Lfm2Shape(), seed: int = 0, counting: bool = False,
               mix: float = 0.05, name: str = "synthetic-lfm2", quant: str | None = None,
               tokenizer: dict | None = None, chat_template: str | None = None) -> Path:
    """Write an lfm2 GGUF with qwen3.py's byte-level BPE tokenizer (the same vocabulary as the
    synthetic qwen3 models). counting=True: the head maps each token to its successor and the
    branches' output projections are scaled by `mix` (bigger: the layers tip more near-ties).
    `quant` (a GGML type name such as "Q8_0") stores the matrices quantised; the conv kernels
    and norms stay F32."""
    import gguf

    if len(shape.conv_pattern) != shape.n_layer:
        raise ValueError("conv_pattern needs one entry per layer")
    if shape.n_embd % shape.n_head:
        raise ValueError("lfm2 needs head_count to divide embedding_length")
    if all(shape.conv_pattern):
        # no attention layer: the pinned build aborts (GGML_ASSERT(buffer)) making a context
        raise ValueError("lfm2 needs at least one attention layer in conv_pattern")
    if shape.n_head_kv < 1 or shape.n_head % shape.n_head_kv:
        raise ValueError("lfm2 needs head_count_kv to divide head_count")
    if shape.l_cache < 2:
        raise ValueError("lfm2's shortconv.l_cache must be at least 2")
    if counting and shape.tied:
        raise ValueError("a counting target needs its own head (tied=False)")
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    a = "lfm2"
    w = gguf.GGUFWriter(str(tmp), a)
    w.add_name(name)
    w.add_uint32(f"{a}.context_length", shape.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", shape.n_embd)
    w.add_uint32(f"{a}.block_count", shape.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", shape.n_ff)
    w.add_uint32(f"{a}.attention.head_count", shape.n_head)
    w.add_array(f"{a}.attention.head_count_kv", [0 if c else shape.n_head_kv for c in shape.conv_pattern])
    w.add_uint32(f"{a}.shortconv.l_cache", shape.l_cache)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    w.add_uint32("general.file_type", file_type(quant))
    n_vocab = add_tokenizer(w, shape.n_merges, **(tokenizer or {}))
    w.add_uint32(f"{a}.vocab_size", n_vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    weights = lfm2_weights(shape, n_vocab, seed)
    if counting:
        make_counting(weights, n_vocab, LFM2_OUT_PROJECTIONS, mix)
    return finish_gguf(w, quantise(weights, quant), path, tmp)
