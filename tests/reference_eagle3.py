"""Numpy reference forward pass of DeepSpec's Eagle3 draft (Qwen3 variant), written from its
modeling semantics (docs/gguf-formats.md §4; deepspec/modeling/eagle3/qwen3/modeling.py):

    fused  = fc(concat of the K target layer outputs)             # [n, H]
    x      = concat(input_layernorm(embed(token)), hidden_norm(fused))
    q, k   = q_norm / k_norm per head (RMS over head_dim), then rotate-half RoPE at P
    h      = o_proj(causal attention(q, k, v)) + fused             # residual is the raw feature
    h      = h + mlp(post_attention_layernorm(h))                  # SwiGLU
    logits = lm_head(norm(h))

`deepspec_gemma4_eagle3` is the Gemma 4 variant (deepspec/modeling/eagle3/gemma4/modeling.py,
docs/patches.md 0003): embeddings times sqrt(H) as the checkpoint's dtype rounds it; global
heads (`global_head_dim`); K = V, V normalised without weight; proportional RoPE; attention
scale 1; the post-attention norm on the attention output before the residual add; pre- and
post-FFN norms around a GELU-tanh MLP; the sum times `layer_scalar` (that product is the h fed
back); logits soft-capped by `final_logit_softcapping` when set.

Draft position P pairs (token at P+1, feature of P). It takes the checkpoint's tensors by
their checkpoint names (float arrays), so it never sees the converter's renames, RoPE
permutations or the +1 layer shift: that is what the tests compare against llama.cpp.
"""

from __future__ import annotations

import math

import numpy as np

from reference_dspark import _attend, gelu_tanh, rms_norm, rope_rotate_half, silu, torch_scale


def deepspec_eagle3(w: dict, config: dict, tokens, positions, features=None, g=None):
    """(logits [n, V or Vd], pre-norm hidden h [n, H]) over n causal positions.

    Give `features` [n, K*Ht] (fc is applied) or `g` [n, H] (already fused: the previous
    step's h in autoregressive drafting, as EAGLE-3 feeds it back)."""
    p = "layers.0."
    nH = config["num_attention_heads"]
    hd = config.get("head_dim", config["hidden_size"] // nH)
    eps = config.get("rms_norm_eps", 1e-6)
    inv = config.get("rope_theta", 10000.0) ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    if g is None:
        g = np.asarray(features, dtype=np.float64) @ w["fc.weight"].T
    n = len(tokens)
    e = rms_norm(w["embed_tokens.weight"][list(tokens)], w[p + "input_layernorm.weight"], eps)
    x = np.concatenate([e, rms_norm(g, w[p + "hidden_norm.weight"], eps)], -1)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nH, hd)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, -1, hd)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(n, -1, hd)
    q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)  # per head, before RoPE
    k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
    q, k = rope_rotate_half(q, positions, inv), rope_rotate_half(k, positions, inv)
    causal = np.tril(np.ones((n, n), dtype=bool))
    o = _attend(q, k, v, 1 / math.sqrt(hd), causal).reshape(n, nH * hd) @ w[p + "self_attn.o_proj.weight"].T
    h = o + g
    h2 = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
    h = h + (silu(h2 @ w[p + "mlp.gate_proj.weight"].T) * (h2 @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(h, w["norm.weight"], eps) @ w["lm_head.weight"].T, h


def deepspec_gemma4_eagle3(w: dict, config: dict, tokens, positions, features=None, g=None):
    """(logits [n, V], h [n, H]) of Gemma4Eagle3Model over n causal positions; `features` or
    `g` as in deepspec_eagle3."""
    p = "layers.0."
    H, nH, hd = config["hidden_size"], config["num_attention_heads"], config["global_head_dim"]
    eps = config.get("rms_norm_eps", 1e-6)
    rp = config["rope_parameters"]["full_attention"]
    inv = rp["rope_theta"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    inv[int(hd * rp.get("partial_rotary_factor", 1.0) / 2):] = 0.0  # proportional RoPE: unrotated tail
    if g is None:
        g = np.asarray(features, dtype=np.float64) @ w["fc.weight"].T
    n = len(tokens)
    emb = w["embed_tokens.weight"][list(tokens)].astype(np.float64) * torch_scale(math.sqrt(H), config.get("dtype"))
    x = np.concatenate([rms_norm(emb, w[p + "input_layernorm.weight"], eps),
                        rms_norm(g, w[p + "hidden_norm.weight"], eps)], -1)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nH, hd)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, -1, hd)
    v = rms_norm(k, None, eps)  # K = V, weightless V norm
    q = rope_rotate_half(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), positions, inv)
    k = rope_rotate_half(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), positions, inv)
    causal = np.tril(np.ones((n, n), dtype=bool))
    o = _attend(q, k, v, 1.0, causal).reshape(n, nH * hd) @ w[p + "self_attn.o_proj.weight"].T
    h = g + rms_norm(o, w[p + "post_attention_layernorm.weight"], eps)
    m = rms_norm(h, w[p + "pre_feedforward_layernorm.weight"], eps)
    m = (gelu_tanh(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)) \
        @ w[p + "mlp.down_proj.weight"].T
    h = (h + rms_norm(m, w[p + "post_feedforward_layernorm.weight"], eps)) * w[p + "layer_scalar"][0]
    logits = rms_norm(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
    cap = config.get("final_logit_softcapping")
    if cap:
        logits = np.tanh(logits / cap) * cap
    return logits, h
