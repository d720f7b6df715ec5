"""Tiny deterministic `gemma4` target GGUFs for tests and demos (random weights).

No small Gemma 4 model can be installed here, and DeepSpec's Gemma-4 DFlash/DSpark drafts
need a gemma4 target (its graph exposes layer inputs; gemma3's does not). This writes one with
every key and tensor the pinned llama.cpp loader asks for: interleaved sliding-window and
full-attention layers (`sliding_window_pattern`, `sliding_window`, per-kind head sizes
`key_length_swa`/`value_length_swa` and `rope.dimension_count_swa`, `rope.freq_base_swa`), no
per-layer input embeddings (`embedding_length_per_layer_input` = 0), Gemma's extra norms
(`post_attention_norm`, `post_ffw_norm`), a per-layer output scale, K = V on the full-attention
layers (no `attn_v`), one proportional-RoPE `rope_freqs` for them, and logit soft-capping.

The tokenizer is Gemma-style (tokenizer model `gemma4`): SPM-like BPE over raw UTF-8 with
spaces written as U+2581, `<0xXX>` byte-fallback tokens, and the specials at Gemma's ids
(`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, `<mask>` 4: DeepSpec's Gemma-4 drafts use 4).

    path = write_gemma4(tmp / "g4.gguf", Gemma4Shape(), seed=0, counting=True)

counting=True makes the predictable variant (as specgguf.synthetic's qwen3 counting target):
greedy text steps through the ordinary tokens, so drafts that know the rule reach real,
partial acceptance.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .qwen3 import _CORPUS, _initializers, finish_gguf, head_for, learn_merges

SPACE = "\u2581"
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # ids 0..4, as in Gemma 4
MASK_ID = 4
_TYPE_NORMAL, _TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_BYTE = 1, 2, 3, 6


@dataclass(frozen=True)
class Gemma4Shape:
    n_layer: int = 6
    swa_pattern: tuple = (True, True, False, True, True, False)  # per layer: sliding window?
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2  # sliding layers
    n_head_kv_full: int = 1  # full-attention layers (Gemma 4's fewer global KV heads)
    head_dim: int = 32  # full-attention layers (`global_head_dim` in HF configs)
    head_dim_swa: int = 16  # sliding layers (`head_dim`)
    n_ff: int = 128
    sliding_window: int = 48
    partial_rotary: float = 0.25  # full layers rotate this fraction of the head (proportional RoPE)
    softcap: float = 30.0
    n_merges: int = 200
    n_ctx_train: int = 4096
    n_vocab: int = 0  # 0: the learned vocabulary alone; more: padded to this size (gemma_vocab)


def gemma_vocab(n_merges: int, mask: bool = True, n_vocab: int = 0) -> tuple[list[str], list[int], list[str]]:
    """(tokens, types, merges) of a Gemma-style BPE vocabulary learned on the built-in corpus.
    `mask=False` puts `<unused0>` (a control token, not a mask) at id 4. n_vocab > 0 pads it to
    that many tokens with `<unusedN>` control tokens, as Gemma's own vocabulary carries: no merge
    produces them, so text tokenizes as without them, but every pass pays for the real width."""
    specials = list(GEMMA_SPECIALS) if mask else GEMMA_SPECIALS[:MASK_ID] + ["<unused0>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    types = [_TYPE_CONTROL, _TYPE_CONTROL, _TYPE_CONTROL, _TYPE_UNKNOWN, _TYPE_CONTROL] + [_TYPE_BYTE] * 256
    chars = [SPACE if c == 0x20 else chr(c) for c in range(0x20, 0x7F)] + ["\n", "\n\n"]
    words = Counter()
    for line in _CORPUS.split("\n"):
        for word in line.split(" "):
            if word:
                words[tuple(SPACE + word)] += 1
    merged, merges = learn_merges(words, n_merges)
    seen = set(tokens)
    for t in chars + merged:
        if t not in seen:
            tokens.append(t)
            types.append(_TYPE_NORMAL)
            seen.add(t)
    if 0 < n_vocab < len(tokens):
        raise ValueError(f"n_vocab {n_vocab} is below the {len(tokens)} tokens the corpus gives")
    i = 0
    while len(tokens) < n_vocab:
        name = f"<unused{i}>"
        i += 1
        if name not in seen:
            tokens.append(name)
            types.append(_TYPE_CONTROL)
    return tokens, types, merges


def add_gemma_tokenizer(writer, n_merges: int, mask: bool = True, n_vocab: int = 0) -> list[int]:
    """Write the tokenizer keys; returns the token types (their count is the vocabulary)."""
    tokens, types, merges = gemma_vocab(n_merges, mask, n_vocab)
    writer.add_tokenizer_model("gemma4")
    writer.add_tokenizer_pre("gemma4")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_add_bos_token(True)
    if mask:
        writer.add_mask_token_id(MASK_ID)
    return types


def plain_ids(types) -> np.ndarray:
    """Ids of the ordinary (printable, non-special, non-byte) tokens."""
    return np.array([i for i, t in enumerate(types) if t == _TYPE_NORMAL], dtype=np.int64)


def gemma_successor(types) -> np.ndarray:
    """The counting map: each ordinary token -> the next ordinary one (wrapping); specials and
    byte tokens -> the first ordinary token (so a counting model never ends or emits bytes)."""
    plain = plain_ids(types)
    succ = np.full(len(types), plain[0], dtype=np.int64)
    succ[plain] = np.roll(plain, -1)
    return succ


def gemma4_weights(shape: Gemma4Shape, n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Random weights with GGUF names; numpy shapes are (ne1, ne0) as gguf expects."""
    mat, norm = _initializers(seed)
    H, I = shape.n_embd, shape.n_ff
    w = {"token_embd.weight": mat(n_vocab, H, 1.0), "output_norm.weight": norm(H)}
    n_rot = int(shape.head_dim * shape.partial_rotary) // 2
    w["rope_freqs.weight"] = np.array([1.0] * n_rot + [1e30] * (shape.head_dim // 2 - n_rot), dtype=np.float32)
    for i, swa in enumerate(shape.swa_pattern):
        p = f"blk.{i}."
        hd = shape.head_dim_swa if swa else shape.head_dim
        kv = shape.n_head_kv if swa else shape.n_head_kv_full
        w[p + "attn_norm.weight"] = norm(H)
        w[p + "attn_q.weight"] = mat(shape.n_head * hd, H)
        w[p + "attn_k.weight"] = mat(kv * hd, H)
        if swa:  # full-attention layers use K as V (attention_k_eq_v), as Gemma 4's do
            w[p + "attn_v.weight"] = mat(kv * hd, H)
        w[p + "attn_output.weight"] = mat(H, shape.n_head * hd)
        w[p + "attn_q_norm.weight"] = norm(hd)
        w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "post_attention_norm.weight"] = norm(H)
        w[p + "ffn_norm.weight"] = norm(H)
        w[p + "ffn_gate.weight"] = mat(I, H)
        w[p + "ffn_up.weight"] = mat(I, H)
        w[p + "ffn_down.weight"] = mat(H, I)
        w[p + "post_ffw_norm.weight"] = norm(H)
        w[p + "layer_output_scale.weight"] = np.array([0.9 + 0.2 * (i % 2)], dtype=np.float32)
    return w


def _bf16_exact(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)


def write_gemma4(path, shape: Gemma4Shape = Gemma4Shape(), seed: int = 0, counting: bool = False,
                 name: str = "synthetic-gemma4", mask: bool = True) -> Path:
    """Write a gemma4 GGUF. Embeddings and head are untied with counting=True (the head maps
    each token to its successor, see `gemma_successor`; the post norms are turned down so the
    layers only sometimes tip a near-tie), and tied otherwise, as in the released Gemma 4."""
    import gguf

    if len(shape.swa_pattern) != shape.n_layer:
        raise ValueError("swa_pattern needs one entry per layer")
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    a = "gemma4"
    w = gguf.GGUFWriter(str(tmp), a)
    w.add_name(name)
    w.add_uint32(f"{a}.context_length", shape.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", shape.n_embd)
    w.add_uint32(f"{a}.block_count", shape.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", shape.n_ff)
    w.add_uint32(f"{a}.attention.head_count", shape.n_head)
    w.add_array(f"{a}.attention.head_count_kv",
                [shape.n_head_kv if s else shape.n_head_kv_full for s in shape.swa_pattern])
    w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    w.add_uint32(f"{a}.attention.key_length_swa", shape.head_dim_swa)
    w.add_uint32(f"{a}.attention.value_length_swa", shape.head_dim_swa)
    w.add_uint32(f"{a}.rope.dimension_count", shape.head_dim)
    w.add_uint32(f"{a}.rope.dimension_count_swa", shape.head_dim_swa)
    w.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10_000.0)
    w.add_uint32(f"{a}.attention.sliding_window", shape.sliding_window)
    w.add_array(f"{a}.attention.sliding_window_pattern", [bool(s) for s in shape.swa_pattern])
    w.add_uint32(f"{a}.embedding_length_per_layer_input", 0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    if shape.softcap:
        w.add_float32(f"{a}.final_logit_softcapping", shape.softcap)
    w.add_uint32("general.file_type", 0)
    types = add_gemma_tokenizer(w, shape.n_merges, mask, shape.n_vocab)
    weights = gemma4_weights(shape, len(types), seed)
    # bf16-exact embeddings, as in the released model: a BF16 draft checkpoint then holds
    # exactly the target's values (DeepSpec drafts carry frozen copies of them)
    weights["token_embd.weight"] = _bf16_exact(weights["token_embd.weight"])
    if counting:
        # embeddings enter scaled by sqrt(H); the post norms fix each branch's size, so they
        # (not the projections) decide how much the layers move the residual stream
        weights["output.weight"] = _bf16_exact(head_for(weights["token_embd.weight"], gemma_successor(types), 4.0))
        for k in weights:
            if k.endswith(("post_attention_norm.weight", "post_ffw_norm.weight")):
                weights[k] *= 0.4
    return finish_gguf(w, weights, path, tmp)


# --------------------------------------------------------------------------------------
# Gemma 4's own multi-token-prediction drafter (arch `gemma4-assistant`)
# --------------------------------------------------------------------------------------


def write_gemma4_assistant(path, target: Gemma4Shape = Gemma4Shape(), seed: int = 30, n_layer: int = 2,
                           n_embd: int = 48, counting_target_seed: int | None = None,
                           width_out: int | None = None) -> Path:
    """A gemma4-assistant draft for a gemma4 target of shape `target`: it has no KV cache of its
    own (its sliding layers read the target's last sliding layer's cache, its full ones the last
    full layer's), takes [target embedding of the token; target hidden state] through
    `nextn.pre_projection`, and hands the next step its hidden state through
    `nextn.post_projection` (`embedding_length_out` = the target's width; its own, `n_embd`,
    must differ: llama.cpp refuses an assistant as wide as its target).

    counting_target_seed: the seed of a counting target; the draft then projects the token's
    embedding straight through and its (tied) head maps it to its successor, so it drafts
    the counting rule."""
    import gguf

    if tuple(target.swa_pattern[-2:]) != (True, False):
        raise ValueError("the target's last two layers must be sliding then full (the assistant shares them)")
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    a = "gemma4-assistant"
    H, Hb = n_embd, target.n_embd
    pattern = [True] * (n_layer - 1) + [False]
    w = gguf.GGUFWriter(str(tmp), a)
    w.add_name("synthetic-gemma4-assistant")
    w.add_uint32(f"{a}.context_length", target.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", H)
    w.add_uint32(f"{a}.embedding_length_out", width_out or Hb)
    w.add_uint32(f"{a}.block_count", n_layer)
    w.add_uint32(f"{a}.nextn_predict_layers", n_layer)
    w.add_uint32(f"{a}.feed_forward_length", target.n_ff)
    w.add_uint32(f"{a}.attention.head_count", target.n_head)
    w.add_array(f"{a}.attention.head_count_kv", [target.n_head_kv if s else target.n_head_kv_full for s in pattern])
    w.add_uint32(f"{a}.attention.key_length", target.head_dim)
    w.add_uint32(f"{a}.attention.value_length", target.head_dim)
    w.add_uint32(f"{a}.attention.key_length_swa", target.head_dim_swa)
    w.add_uint32(f"{a}.attention.value_length_swa", target.head_dim_swa)
    w.add_uint32(f"{a}.rope.dimension_count", target.head_dim)
    w.add_uint32(f"{a}.rope.dimension_count_swa", target.head_dim_swa)
    w.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10_000.0)
    w.add_uint32(f"{a}.attention.sliding_window", target.sliding_window)
    w.add_array(f"{a}.attention.sliding_window_pattern", pattern)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32("general.file_type", 0)
    types = add_gemma_tokenizer(w, target.n_merges, n_vocab=target.n_vocab)
    V = len(types)
    mat, norm = _initializers(seed)
    n_rot = int(target.head_dim * target.partial_rotary) // 2
    t = {"token_embd.weight": mat(V, H, 1.0), "output_norm.weight": norm(H),
         "nextn.pre_projection.weight": mat(H, 2 * Hb), "nextn.post_projection.weight": mat(Hb, H),
         "rope_freqs.weight": np.array([1.0] * n_rot + [1e30] * (target.head_dim // 2 - n_rot), dtype=np.float32)}
    for i, swa in enumerate(pattern):
        p = f"blk.{i}."
        hd = target.head_dim_swa if swa else target.head_dim
        t.update({p + "attn_norm.weight": norm(H), p + "attn_q.weight": mat(target.n_head * hd, H),
                  p + "attn_output.weight": mat(H, target.n_head * hd), p + "attn_q_norm.weight": norm(hd),
                  p + "post_attention_norm.weight": norm(H), p + "ffn_norm.weight": norm(H),
                  p + "ffn_gate.weight": mat(target.n_ff, H), p + "ffn_up.weight": mat(target.n_ff, H),
                  p + "ffn_down.weight": mat(H, target.n_ff), p + "post_ffw_norm.weight": norm(H),
                  p + "layer_output_scale.weight": np.array([1.0], dtype=np.float32)})
    if counting_target_seed is not None:
        emb = _bf16_exact(gemma4_weights(target, V, counting_target_seed)["token_embd.weight"])
        proj = np.linalg.qr(np.random.default_rng(seed).standard_normal((Hb, H)))[0].T  # orthonormal rows
        t["nextn.pre_projection.weight"] = np.concatenate([proj, np.zeros((H, Hb))], 1).astype(np.float32)
        t["token_embd.weight"] = head_for(emb @ proj.T, gemma_successor(types), 4.0)  # tied: the head
        for k in t:
            if k.endswith(("post_attention_norm.weight", "post_ffw_norm.weight")):
                t[k] *= 0.05
    return finish_gguf(w, t, path, tmp)
