"""Numpy reference forward passes of the drafts, written from the checkpoints' own semantics.

`dspark_block` follows DeepSpec's DSpark/DFlash draft (docs/gguf-formats.md §3, PyTorch
semantics of deepspec/modeling/dspark/{qwen3,gemma4}/modeling.py): target features are fused
by fc + hidden_norm into context keys/values at the context positions; the block
[anchor, mask, ...] attends, non-causally, to the context and to itself; slot k predicts
token anchor+k+1 (sample from anchor); the vanilla Markov head adds w2·w1[prev] with prev
chained greedily from the anchor; the confidence head reads [norm(h); w1[prev]].

`eagle3_step` follows a standard EAGLE-3 decoder layer (HF Llama attention, rotate-half RoPE).

Both take the checkpoint's tensors by their checkpoint names, as float32 arrays, so they
never see the converter's renames or permutations: that is what the tests check.
"""

from __future__ import annotations

import math

import numpy as np


def rms_norm(x, w=None, eps=1e-6):
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def rope_rotate_half(x, pos, inv_freq):
    """HF apply_rotary_pos_emb: x [..., n, heads, d] with positions pos [n]."""
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [n, d/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def _attend(q, k, v, scale, mask=None):
    """q [nq, H, d], k/v [nk, KV, d] (GQA), mask [nq, nk] of bools (True = visible)."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) * scale
    if mask is not None:
        s = np.where(mask[None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v)


def torch_scale(value: float, dtype: str | None) -> float:
    """A Python float scale as torch applies it after `.to(dtype)` (bf16 / f16 rounding)."""
    x = np.float32(value)
    if dtype == "bfloat16":
        b = x.view(np.uint32)
        return float(((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))
                     .view(np.float32))
    if dtype == "float16":
        return float(np.float16(x))
    return float(x)


def dspark_block(w: dict, config: dict, features: np.ndarray, anchor_token: int,
                 block_size: int | None = None, *, softcap: bool = True, embed_scale: float | None = None):
    """Logits [bs, V] (Markov-biased if present) and confidences [bs] (or None) for one block.

    features: [P, K*H] target features at positions 0..P-1; the anchor is at position P.
    Gemma 4: embeddings are scaled by sqrt(H) cast to the checkpoint's dtype (Gemma4Text-
    ScaledWordEmbedding multiplies by `embed_scale.to(weight.dtype)`; `embed_scale` overrides
    it), and with `final_logit_softcapping` the logits are capped before the Markov bias is
    added (compute_logits, then apply_block_logits); softcap=False leaves them uncapped.
    """
    gemma = str(config.get("model_type", "")).startswith("gemma4")
    H = config["hidden_size"]
    nH = config["num_attention_heads"]
    eps = config.get("rms_norm_eps", 1e-6)
    if gemma:
        hd = config["global_head_dim"]
        rp = config["rope_parameters"]["full_attention"]
        theta = rp["rope_theta"]
        n_pairs = int(hd * rp.get("partial_rotary_factor", 1.0) / 2)
        inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        inv[n_pairs:] = 0.0  # proportional RoPE: unrotated tail
        scale = 1.0
        act = gelu_tanh
    else:
        hd = config["head_dim"]
        rp = config.get("rope_parameters") or {}
        theta = rp.get("rope_theta", config.get("rope_theta", 10000.0))
        inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        scale = 1.0 / math.sqrt(hd)
        act = silu
    bs = block_size or config["block_size"]
    mask_id = config["mask_token_id"]
    P = features.shape[0]
    ctx = rms_norm(features.astype(np.float64) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    tokens = [anchor_token] + [mask_id] * (bs - 1)
    x = w["embed_tokens.weight"][tokens].astype(np.float64)
    if gemma:
        x = x * (embed_scale if embed_scale is not None else torch_scale(math.sqrt(H), config.get("dtype")))
    ctx_pos, blk_pos = np.arange(P), np.arange(P, P + bs)
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        wq, wk = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        q = (h @ wq.T).reshape(bs, nH, hd)
        k_raw = (h @ wk.T).reshape(bs, -1, hd)
        kc_raw = (ctx @ wk.T).reshape(P, -1, hd)
        if gemma:  # K = V projection; V gets a weightless RMS norm
            v, vc = rms_norm(k_raw, None, eps), rms_norm(kc_raw, None, eps)
        else:
            wv = w[p + "self_attn.v_proj.weight"]
            v, vc = (h @ wv.T).reshape(bs, -1, hd), (ctx @ wv.T).reshape(P, -1, hd)
        q = rope_rotate_half(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), blk_pos, inv)
        k = rope_rotate_half(rms_norm(k_raw, w[p + "self_attn.k_norm.weight"], eps), blk_pos, inv)
        kc = rope_rotate_half(rms_norm(kc_raw, w[p + "self_attn.k_norm.weight"], eps), ctx_pos, inv)
        o = _attend(q, np.concatenate([kc, k]), np.concatenate([vc, v]), scale)  # non-causal
        o = o.reshape(bs, nH * hd) @ w[p + "self_attn.o_proj.weight"].T
        if gemma:
            o = rms_norm(o, w[p + "post_attention_layernorm.weight"], eps)
            x = x + o
            h2 = rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        else:
            x = x + o
            h2 = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        m = (act(h2 @ w[p + "mlp.gate_proj.weight"].T) * (h2 @ w[p + "mlp.up_proj.weight"].T))
        m = m @ w[p + "mlp.down_proj.weight"].T
        if gemma:
            m = rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps)
        x = x + m
        if gemma and p + "layer_scalar" in w:
            x = x * w[p + "layer_scalar"][0]
    hn = rms_norm(x, w["norm.weight"], eps)
    logits = hn @ w["lm_head.weight"].T
    cap = config.get("final_logit_softcapping") if gemma and softcap else None
    if cap:
        logits = np.tanh(logits / cap) * cap
    conf = None
    if config.get("markov_rank"):
        w1, w2 = w["markov_head.markov_w1.weight"], w["markov_head.markov_w2.weight"]
        has_conf = "confidence_head.proj.weight" in w
        conf = np.zeros(bs) if has_conf else None
        prev = anchor_token
        for k in range(bs):  # greedy chain, as DeepSpec's eval and llama.cpp's graph do
            e = w1[prev].astype(np.float64)
            logits[k] = logits[k] + w2 @ e
            if has_conf:
                z = np.concatenate([hn[k], e]) @ w["confidence_head.proj.weight"][0] + w["confidence_head.proj.bias"][0]
                conf[k] = 1 / (1 + np.exp(-z))
            prev = int(np.argmax(logits[k]))
    return logits, conf


def eagle3_step(w: dict, config: dict, g: np.ndarray, tokens, positions):
    """Draft logits [n, Vd] (draft vocabulary) of an EAGLE-3 layer over n causal positions.

    g: [n, H] fused features (fc output) paired with tokens[i] at positions[i].
    """
    pre = "midlayer." if "midlayer.input_layernorm.weight" in w else "layers.0."
    Hd, nH = config["hidden_size"], config["num_attention_heads"]
    hd = config.get("head_dim", Hd // nH)
    eps = config.get("rms_norm_eps", 1e-6)
    inv = config.get("rope_theta", 10000.0) ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    n = len(tokens)
    e = rms_norm(w["embed_tokens.weight"][list(tokens)], w[pre + "input_layernorm.weight"], eps)
    gn = rms_norm(g, w[pre + "hidden_norm.weight"], eps)
    x = np.concatenate([e, gn], -1)
    q = (x @ w[pre + "self_attn.q_proj.weight"].T).reshape(n, nH, hd)
    k = (x @ w[pre + "self_attn.k_proj.weight"].T).reshape(n, -1, hd)
    v = (x @ w[pre + "self_attn.v_proj.weight"].T).reshape(n, -1, hd)
    q, k = rope_rotate_half(q, positions, inv), rope_rotate_half(k, positions, inv)
    causal = np.tril(np.ones((n, n), dtype=bool))
    o = _attend(q, k, v, 1 / math.sqrt(hd), causal).reshape(n, nH * hd) @ w[pre + "self_attn.o_proj.weight"].T
    resid = gn if config.get("norm_before_residual") else g
    h = o + resid
    h2 = rms_norm(h, w[pre + "post_attention_layernorm.weight"], eps)
    m = silu(h2 @ w[pre + "mlp.gate_proj.weight"].T) * (h2 @ w[pre + "mlp.up_proj.weight"].T)
    h = h + m @ w[pre + "mlp.down_proj.weight"].T
    return rms_norm(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
