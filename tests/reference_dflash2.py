"""Numpy reference forward pass of a DFlash 2 draft (DFlash2DraftModel), written from the
checkpoint's own semantics, not from llama.cpp's graph.

DFlash 2 is z-lab's DFlash (a block [anchor, mask, ...] denoised in one non-causal pass over
the draft's context keys/values, which the fused target features fill: fc + hidden_norm) with
two additions, in PyTorch semantics:

* a grouped dynamic causal depthwise convolution around both sublayers of every layer
  (`attention_conv`, `mlp_conv`: GroupedDynamicCausalConv). The sublayer input h [L, H] gives
  the dynamic taps, kernel_projection(h) viewed [L, 2, k, groups]; side 0 convolves the input,
  side 1 the sublayer's output, with the same per-position taps:
      out[t, c] = sum_o (base_kernel[side, o, c] + dynamic[t, side, o, c // group]) * x[t - o, c]
  x[t - o] is zero before the block's first position (the convolution runs inside the block);
* a top-K candidate selector (`candidate_selector`): at each block position p >= 1 the K best
  logits are the candidates, and a candidate's score after a predecessor token `prev` is its
  logit plus successor_codebook[cand] . (predecessor_codebook[prev] * hidden_projection(h_p)),
  h_p the final (normed) hidden state. The draft is the greedy path from the anchor.

The tensors are the checkpoint's, by their checkpoint names, as float32 arrays (for a draft
without tables, embed_tokens/lm_head are the target's): the reference never sees the
converter's renames. Shared pieces (RMS norm, rotate-half RoPE, GQA attention) are those of
reference_dspark.py.
"""

from __future__ import annotations

import math

import numpy as np

from reference_dspark import _attend, rms_norm, rope_rotate_half, silu


def _draft_value(config: dict, name: str, default=None):
    """A key of dflash_config wins, then the top-level one (as DFlash2DraftModel reads them)."""
    method = config.get("dflash_config") or {}
    return method.get(name, config.get(name, default))


def dynamic_conv(x: np.ndarray, dynamic: np.ndarray, base: np.ndarray, group_size: int) -> np.ndarray:
    """GroupedDynamicCausalConv._convolve: x [L, H], dynamic [L, k, groups], base [k, H]."""
    L, H = x.shape
    k, groups = base.shape[0], H // group_size
    out = np.zeros((L, H), dtype=np.float64)
    for o in range(min(k, L)):  # taps at or past L read only the zero left context
        shifted = np.zeros_like(x, dtype=np.float64)
        shifted[o:] = x[:L - o]
        weight = base[o][None, :] + np.repeat(dynamic[:, o, :], group_size, axis=1)  # [L, H]
        out += weight * shifted
    return out


def dflash2_block(w: dict, config: dict, features: np.ndarray, anchor_token: int, block_size: int):
    """(logits [bs, V], h [bs, H]) of one block [anchor, mask x (bs - 1)] at positions P..P+bs-1
    over context features [P, n_target * H] at positions 0..P-1; h is the final normed hidden
    state (what the selector's hidden projection reads)."""
    H = config["hidden_size"]
    nH = config["num_attention_heads"]
    hd = config.get("head_dim") or H // nH
    eps = config.get("rms_norm_eps", 1e-6)
    rp = config.get("rope_parameters") or {}
    theta = rp.get("rope_theta", config.get("rope_theta", 10000.0))
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    k_size = int(_draft_value(config, "conv_kernel_size"))
    group = int(_draft_value(config, "conv_group_size"))
    groups = H // group
    mask_id = _draft_value(config, "mask_token_id")
    bs = block_size
    P = features.shape[0]
    ctx = rms_norm(features.astype(np.float64) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    x = w["embed_tokens.weight"][[anchor_token] + [mask_id] * (bs - 1)].astype(np.float64)
    scale = _draft_value(config, "input_embedding_scale")
    if scale is not None:
        x = x * float(scale)
    ctx_pos, blk_pos = np.arange(P), np.arange(P, P + bs)

    def conv_pair(name: str, h: np.ndarray):
        dyn = (h @ w[name + ".kernel_projection.weight"].T).reshape(bs, 2, k_size, groups)
        base = w[name + ".base_kernel"]
        return (dynamic_conv(h, dyn[:, 0], base[0], group),
                lambda out: dynamic_conv(out, dyn[:, 1], base[1], group))

    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        h, finish = conv_pair(p + "attention_conv", h)
        wq, wk, wv = (w[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        q = rms_norm((h @ wq.T).reshape(bs, nH, hd), w[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm((h @ wk.T).reshape(bs, -1, hd), w[p + "self_attn.k_norm.weight"], eps)
        kc = rms_norm((ctx @ wk.T).reshape(P, -1, hd), w[p + "self_attn.k_norm.weight"], eps)
        v, vc = (h @ wv.T).reshape(bs, -1, hd), (ctx @ wv.T).reshape(P, -1, hd)
        q, k = rope_rotate_half(q, blk_pos, inv), rope_rotate_half(k, blk_pos, inv)
        kc = rope_rotate_half(kc, ctx_pos, inv)
        o = _attend(q, np.concatenate([kc, k]), np.concatenate([vc, v]), 1 / math.sqrt(hd))  # non-causal
        o = o.reshape(bs, nH * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = x + finish(o)
        h2 = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        h2, finish = conv_pair(p + "mlp_conv", h2)
        m = silu(h2 @ w[p + "mlp.gate_proj.weight"].T) * (h2 @ w[p + "mlp.up_proj.weight"].T)
        x = x + finish(m @ w[p + "mlp.down_proj.weight"].T)
    hn = rms_norm(x, w["norm.weight"], eps)
    logits = hn @ w["lm_head.weight"].T
    mult = _draft_value(config, "output_multiplier")
    if mult is not None:
        logits = logits * float(mult)
    cap = _draft_value(config, "final_logit_softcapping")
    if cap:
        logits = np.tanh(logits / cap) * cap
    return logits, hn


def top_k(row: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest entries, best first (torch.topk's set; its order is unspecified
    with sorted=False, and nothing below depends on it)."""
    return np.argsort(-row, kind="stable")[:k]


def lattice(w: dict, logits: np.ndarray, h: np.ndarray, anchor_token: int, K: int):
    """Per block position p >= 1: (candidates [K], scores [K_prev, K]); scores[j, c] is candidate
    c's score after predecessor j: the anchor for p = 1 (one row), the candidates of p - 1 after."""
    pred, succ = w["candidate_selector.predecessor_codebook"], w["candidate_selector.successor_codebook"]
    gate = h @ w["candidate_selector.hidden_projection.weight"].T  # [bs, rank]
    out, prev = [], np.array([anchor_token])
    for p in range(1, len(logits)):
        cand = top_k(logits[p], K)
        scores = logits[p, cand][None, :] + (pred[prev] * gate[p][None, :]) @ succ[cand].T
        out.append((cand, scores))
        prev = cand
    return out


def select(w: dict, logits: np.ndarray, h: np.ndarray, anchor_token: int, K: int) -> list[int]:
    """CandidateSelector.select at temperature 0: the greedy path through the candidates,
    each position's best candidate after the one chosen before it (the anchor first)."""
    pred, succ = w["candidate_selector.predecessor_codebook"], w["candidate_selector.successor_codebook"]
    gate = h @ w["candidate_selector.hidden_projection.weight"].T
    path, prev = [], anchor_token
    for p in range(1, len(logits)):
        cand = top_k(logits[p], K)
        scores = logits[p, cand] + succ[cand] @ (pred[prev] * gate[p])
        prev = int(cand[int(np.argmax(scores))])
        path.append(prev)
    return path
