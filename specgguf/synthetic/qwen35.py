"""Tiny deterministic `qwen35` target GGUFs for tests and demos (random weights): Qwen3.5 /
Qwen3.6 dense, a hybrid of gated DeltaNet linear-attention layers (recurrent: a conv state of
`ssm.conv_kernel - 1` columns and a `state_size` x `state_size` matrix per value head, per
sequence) and gated full-attention layers, optionally with one NextN / MTP block.

What the pinned llama.cpp's loader asks for (src/models/qwen35.cpp, load_hparams in
src/llama-model.cpp):
- keys: `context_length`, `embedding_length`, `block_count` (trunk layers plus MTP layers),
  `feed_forward_length`, `attention.head_count`, `attention.head_count_kv`, `attention.key_length`
  / `value_length` (head_dim; llama.cpp asserts they are equal), `attention.layer_norm_rms_epsilon`,
  `rope.dimension_sections` (required: qwen35 always ropes as interleaved M-RoPE,
  LLAMA_ROPE_TYPE_IMROPE; for text every section sees the same position, so the split only has to
  fit n_rot / 2), `rope.dimension_count` (partial rotary: Qwen3.5 rotates a quarter of each head),
  `rope.freq_base`; the DeltaNet sizes `ssm.conv_kernel`, `ssm.state_size` (the per-head key and
  value dim), `ssm.group_count` (key heads), `ssm.time_step_rank` (value heads, a multiple of the
  key heads) and `ssm.inner_size` (value heads x state size: the graph reads the value head dim
  as inner_size / time_step_rank, the loader as state_size); `full_attention_interval` (layer i is
  linear unless (i + 1) % interval == 0; `attention.recurrent_layers` would override it and is not
  written); `nextn_predict_layers` with MTP layers.
- tensors: `token_embd`, `output_norm`, `output` (optional: tied without it); per layer
  `attn_norm`, `post_attention_norm` (the pre-FFN norm: qwen35 has no ffn_norm) and
  `ffn_gate/up/down`; full-attention layers `attn_q` (ne1 = 2 x n_head x head_dim: per head the
  query and then its output gate, sigmoid(gate) multiplies the attention output), `attn_k`,
  `attn_v`, `attn_output`, `attn_q_norm/k_norm` (head_dim); linear layers `attn_qkv` (n_embd ->
  q, k for the key heads and v for the value heads), `attn_gate` (z, n_embd -> value dim),
  `ssm_conv1d` (ne = {conv_kernel, qkv dim}), `ssm_dt.bias` and `ssm_a` (no suffix; the
  converter stores -exp(A_log), so negative) per value head, `ssm_beta` and `ssm_alpha` (n_embd ->
  value heads), `ssm_norm` (state size; the gated RMS norm) and `ssm_out` (value dim -> n_embd).

NextN / MTP: the pinned build loads `nextn_predict_layers` blocks stored after the trunk
(blk.{n_layer}...), each a full-attention block (the tensors above, no DeltaNet) plus
`nextn.eh_proj` (2 n_embd -> n_embd over [enorm(token embedding), hnorm(hidden)]),
`nextn.enorm`, `nextn.hnorm` and optionally `nextn.shared_head_norm` (written: Qwen3.5's
`mtp.norm`), `nextn.embed_tokens` and `nextn.shared_head_head` (not written: the main embedding
and head serve). The main graph never runs them; running MTP takes llama_model_params.load_mtp =
true (otherwise the blocks are skipped at load), a second context on the same model with
ctx_type = LLAMA_CONTEXT_TYPE_MTP (ctx_other = the target context), and the target's pre-head
hidden states (t_h_nextn: llama-ext's llama_set_embeddings_nextn / llama_get_embeddings_nextn_ith,
C++ symbols outside llama.h that specgguf.runtime.native binds) fed to the MTP context as each
token entry's embedding (llama_batch_ext_add_token, then llama_batch_ext_set_embd_token; the
pinned llama_batch_ext_set_embd_state is a stub that returns false), decoded by llama_process.
The qwen35 MTP graph asserts exactly one block, so mtp_layers is 0 or 1 here.

The main graph exposes every trunk layer's input (res->t_layer_inp[il] = inpL for il <
n_layer, as qwen3.cpp does), so eagle3 / dflash extraction can read it. llama.cpp counts qwen35
hybrid (llm_arch_is_hybrid) and lists it in llm_arch_supports_rs_rollback (n_rs_seq snapshots
of the DeltaNet conv and ssm states).

    path = write_qwen35(tmp / "q35.gguf", Qwen35Shape(), seed=0, counting=True)

counting=True makes the predictable variant, as qwen3's counting target: greedy text mostly
steps through the vocabulary (token t -> t + 1), and the layers tip some near-ties. With
mtp_layers=1 the MTP block then predicts the successor of its input token (eh_proj passes the
token embedding through), which is right for the token after next: an MTP draft that agrees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._quant import file_type, make_counting, quantise
from .qwen3 import _initializers, add_tokenizer, finish_gguf

# each branch's last projection: what counting=True turns down
QWEN35_OUT_PROJECTIONS = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")


@dataclass(frozen=True)
class Qwen35Shape:
    n_layer: int = 4  # trunk layers (MTP blocks come on top: write_qwen35(mtp_layers=1))
    full_attention_interval: int = 4  # layers 3, 7, ... are full attention, the rest DeltaNet
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    rope_dim: int = 8  # rotated dims per head (Qwen3.5: a quarter; here half, so sections fit)
    rope_sections: tuple = (2, 1, 1, 0)  # M-RoPE t/h/w/extra split of rope_dim / 2
    n_ff: int = 128
    conv_kernel: int = 4  # DeltaNet causal conv width (Qwen3.5's is 4)
    state_size: int = 16  # key and value head dim of the linear layers
    n_k_heads: int = 2  # ssm.group_count
    n_v_heads: int = 4  # ssm.time_step_rank; more value heads than key heads, as Qwen3.5
    n_merges: int = 250
    n_ctx_train: int = 4096
    tied: bool = False  # no output.weight; counting needs a head

    @property
    def inner_size(self) -> int:
        return self.state_size * self.n_v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.state_size * self.n_k_heads + self.inner_size

    def is_linear(self, il: int) -> bool:
        return (il + 1) % self.full_attention_interval != 0


def check_shape(shape: Qwen35Shape, mtp_layers: int = 0, counting: bool = False) -> None:
    """ValueError for what the pinned llama.cpp would refuse or abort on (an abort takes the
    process down, so these are checked before writing)."""
    if not 1 <= shape.full_attention_interval <= shape.n_layer:
        # no full-attention layer: the pinned build aborts (GGML_ASSERT(buffer)) making a context
        raise ValueError("qwen35 needs a full-attention layer: 1 <= full_attention_interval <= n_layer")
    if shape.n_head_kv < 1 or shape.n_head % shape.n_head_kv:
        raise ValueError("qwen35 needs head_count_kv to divide head_count")
    if shape.rope_dim % 2 or not 0 < shape.rope_dim <= shape.head_dim:
        raise ValueError("rope_dim must be even and at most head_dim")
    if len(shape.rope_sections) != 4 or min(shape.rope_sections) < 0 or not 0 < 2 * sum(shape.rope_sections) <= shape.rope_dim:
        raise ValueError("rope_sections: four counts that sum to at most rope_dim / 2")
    if shape.conv_kernel < 2 or shape.state_size < 1 or shape.n_k_heads < 1:
        raise ValueError("qwen35 needs conv_kernel >= 2 and at least one key head")
    if shape.n_v_heads % shape.n_k_heads:
        raise ValueError("qwen35 needs the value heads (time_step_rank) to be a multiple of the key heads (group_count)")
    if mtp_layers not in (0, 1):
        raise ValueError("the pinned llama.cpp runs exactly one qwen35 MTP block: mtp_layers is 0 or 1")
    if counting and shape.tied:
        raise ValueError("a counting target needs its own head (tied=False)")


def _attention(w: dict, p: str, shape: Qwen35Shape, mat, norm) -> None:
    H, hd = shape.n_embd, shape.head_dim
    w[p + "attn_q.weight"] = mat(2 * shape.n_head * hd, H)  # per head: query rows, then gate rows
    w[p + "attn_k.weight"] = mat(shape.n_head_kv * hd, H)
    w[p + "attn_v.weight"] = mat(shape.n_head_kv * hd, H)
    w[p + "attn_output.weight"] = mat(H, shape.n_head * hd)
    w[p + "attn_q_norm.weight"] = norm(hd)
    w[p + "attn_k_norm.weight"] = norm(hd)


def _ffn(w: dict, p: str, shape: Qwen35Shape, mat) -> None:
    w[p + "ffn_gate.weight"] = mat(shape.n_ff, shape.n_embd)
    w[p + "ffn_up.weight"] = mat(shape.n_ff, shape.n_embd)
    w[p + "ffn_down.weight"] = mat(shape.n_embd, shape.n_ff)


def qwen35_weights(shape: Qwen35Shape, n_vocab: int, seed: int, mtp_layers: int = 0) -> dict[str, np.ndarray]:
    """Random weights with GGUF names; numpy shapes are (ne1, ne0) as gguf expects."""
    mat, norm = _initializers(seed)
    rng = np.random.default_rng([seed, 35])  # the DeltaNet decay parameters
    H, nv = shape.n_embd, shape.n_v_heads
    w = {"token_embd.weight": mat(n_vocab, H, 1.0), "output_norm.weight": norm(H)}
    if not shape.tied:
        w["output.weight"] = mat(n_vocab, H)
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(H)
        if shape.is_linear(i):
            w[p + "attn_qkv.weight"] = mat(shape.conv_dim, H)
            w[p + "attn_gate.weight"] = mat(shape.inner_size, H)
            w[p + "ssm_conv1d.weight"] = mat(shape.conv_dim, shape.conv_kernel)
            # decay per token exp(-exp(A_log) * softplus(alpha + dt_bias)), near 1 as trained ones
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), nv))
            w[p + "ssm_dt.bias"] = np.log(np.expm1(dt)).astype(np.float32)
            w[p + "ssm_a"] = (-rng.uniform(1.0, 16.0, nv)).astype(np.float32)
            w[p + "ssm_beta.weight"] = mat(nv, H)
            w[p + "ssm_alpha.weight"] = mat(nv, H)
            w[p + "ssm_norm.weight"] = norm(shape.state_size)
            w[p + "ssm_out.weight"] = mat(H, shape.inner_size)
        else:
            _attention(w, p, shape, mat, norm)
        w[p + "post_attention_norm.weight"] = norm(H)
        _ffn(w, p, shape, mat)
    for i in range(shape.n_layer, shape.n_layer + mtp_layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(H)
        _attention(w, p, shape, mat, norm)
        w[p + "post_attention_norm.weight"] = norm(H)
        _ffn(w, p, shape, mat)
        w[p + "nextn.eh_proj.weight"] = mat(H, 2 * H)
        w[p + "nextn.enorm.weight"] = norm(H)
        w[p + "nextn.hnorm.weight"] = norm(H)
        w[p + "nextn.shared_head_norm.weight"] = norm(H)
    return w


def write_qwen35(path, shape: Qwen35Shape = Qwen35Shape(), seed: int = 0, counting: bool = False,
                 mix: float = 0.05, name: str = "synthetic-qwen35", quant: str | None = None,
                 tokenizer: dict | None = None, chat_template: str | None = None, mtp_layers: int = 0) -> Path:
    """Write a qwen35 GGUF with qwen3.py's byte-level BPE tokenizer (the same vocabulary as the
    synthetic qwen3 models). counting=True: the head maps each token to its successor and the
    branches' output projections are scaled by `mix` (bigger: the layers tip more near-ties).
    `quant` (a GGML type name such as "Q8_0") stores the matrices quantised; conv kernels, the
    per-head vectors and norms stay F32. mtp_layers=1 adds one NextN / MTP block (module
    docstring: what llama.cpp needs to run it)."""
    import gguf

    check_shape(shape, mtp_layers, counting)
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    a = "qwen35"
    w = gguf.GGUFWriter(str(tmp), a)
    w.add_name(name)
    w.add_uint32(f"{a}.context_length", shape.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", shape.n_embd)
    w.add_uint32(f"{a}.block_count", shape.n_layer + mtp_layers)
    w.add_uint32(f"{a}.feed_forward_length", shape.n_ff)
    w.add_uint32(f"{a}.attention.head_count", shape.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", shape.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.rope.dimension_count", shape.rope_dim)
    w.add_array(f"{a}.rope.dimension_sections", [int(s) for s in shape.rope_sections])
    w.add_float32(f"{a}.rope.freq_base", 10_000_000.0)
    w.add_uint32(f"{a}.ssm.conv_kernel", shape.conv_kernel)
    w.add_uint32(f"{a}.ssm.state_size", shape.state_size)
    w.add_uint32(f"{a}.ssm.group_count", shape.n_k_heads)
    w.add_uint32(f"{a}.ssm.time_step_rank", shape.n_v_heads)
    w.add_uint32(f"{a}.ssm.inner_size", shape.inner_size)
    w.add_uint32(f"{a}.full_attention_interval", shape.full_attention_interval)
    if mtp_layers:
        w.add_uint32(f"{a}.nextn_predict_layers", mtp_layers)
    w.add_uint32("general.file_type", file_type(quant))
    n_vocab = add_tokenizer(w, shape.n_merges, **(tokenizer or {}))
    w.add_uint32(f"{a}.vocab_size", n_vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    weights = qwen35_weights(shape, n_vocab, seed, mtp_layers)
    if counting:
        make_counting(weights, n_vocab, QWEN35_OUT_PROJECTIONS, mix)
        H = shape.n_embd
        for i in range(shape.n_layer, shape.n_layer + mtp_layers):
            # the MTP block reads its input token's embedding alone: it then predicts that token's
            # successor through the shared counting head
            weights[f"blk.{i}.nextn.eh_proj.weight"] = np.hstack(
                [np.eye(H, dtype=np.float32), np.zeros((H, H), np.float32)])
            weights[f"blk.{i}.nextn.enorm.weight"] = np.ones(H, np.float32)
    return finish_gguf(w, quantise(weights, quant), path, tmp)
