"""DeepSpec Eagle3 checkpoints (`Qwen3Eagle3Model`) -> llama.cpp arch `eagle3`.

DeepSpec's Eagle3 is an EAGLE-3 head with two things the stock eagle3 graph lacks: it reads
5 target layers (not 3) and its Qwen3 decoder layer normalises q and k per head before RoPE
(docs/gguf-formats.md §4). The repository's patches/ teach llama.cpp both; the file is
written regardless, and the runtime refuses it with one line on a stock build
(compat.check_hidden_state_pair). What the mapping does on purpose:
- target layer ids are shifted by +1: DeepSpec feeds the *output* of layer i, llama.cpp
  extracts the *input* of layer i+1 (-1, the embeddings, becomes 0);
- q/k rows go from HF rotate-half to eagle3's interleaved (NORM) RoPE, and the q/k norm
  weights get the same within-head permutation, since they scale the permuted channels;
- `d2t`, when present, becomes absolute I64 target ids, and then the draft's own reduced
  head is always written (the target's head would not match it).
The Gemma 4 variant (post norms, layer scalar, GELU, K=V, attention scale 1, soft-capping)
has no eagle3 equivalent even with the patches and is refused.
"""

from __future__ import annotations


from specgguf.errors import UserError

from .checkpoints import Kind, get_float, get_int, rope_parameters
from .deepspec import _Need
from .eagle3 import _absolute_d2t, _unrotate_half, add_eagle3_keys
from .safetensors import Weights
from .targets import check_target_layers, check_vocab, check_width, warn_if_cannot_feed
from .writer import DraftPlan

PATCH_NOTE = "needs the patched llama.cpp build (specgguf build-llama --patched)"


def refuse_gemma4(kind: Kind) -> None:
    raise UserError(f"DeepSpec Eagle3 checkpoints for {kind.backbone} cannot be converted: their decoder "
                    "layer (post norms, layer scalar, GELU, K=V attention with scale 1, logit "
                    "soft-capping) has no llama.cpp eagle3 equivalent; convert the DFlash or DSpark "
                    "checkpoint of the same target instead")


def plan_deepspec_eagle3(config: dict, weights: Weights, kind: Kind, target, head: str, warn) -> DraftPlan:
    if kind.backbone != "qwen3":
        refuse_gemma4(kind)
    H = get_int(config, "hidden_size")
    n_head = get_int(config, "num_attention_heads")
    n_kv = get_int(config, "num_key_value_heads", default=n_head)
    hd = get_int(config, "head_dim", default=H // n_head)
    V = get_int(config, "vocab_size")
    Vd = get_int(config, "draft_vocab_size", default=V)
    eps = get_float(config, "rms_norm_eps", 1e-6)
    Ht = get_int(config, "target_hidden_size", default=target.n_embd)
    if get_int(config, "draft_num_hidden_layers", "num_hidden_layers", default=1) != 1:
        raise UserError("DeepSpec Eagle3 draft with more than one decoder layer: llama.cpp's eagle3 "
                        "graph runs exactly one")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise UserError("DeepSpec Eagle3 draft with biases: llama.cpp's eagle3 graph has none")
    if (config.get("hidden_act") or "silu") != "silu":
        raise UserError(f"DeepSpec Eagle3 draft with activation {config.get('hidden_act')!r}: only silu runs")
    layer_types = config.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise UserError(f"draft with layer types {sorted(set(layer_types))}: only full attention "
                        "layers are supported")
    rope = rope_parameters(config)
    theta = float(rope.get("rope_theta", 10000.0))  # HF Qwen3Config's default
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise UserError(f"DeepSpec Eagle3 draft with RoPE type {rope.get('rope_type')!r}: only "
                        "default RoPE is supported")

    ids = config.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise UserError("config.json lacks target_layer_ids (a list of target layer numbers)")
    if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < -1:
        raise UserError(f"config.json: target_layer_ids {ids} must be increasing and >= -1")
    gguf_ids = [i + 1 for i in ids]  # output of layer i == input of layer i+1 (or the final output)

    # -- checks against the target GGUF (before any tensor is read) --------------------------
    check_vocab(V, target, "draft config vocab_size")
    check_width(Ht, target, "draft target_hidden_size")
    n_target = get_int(config, "num_target_layers", default=target.n_layer)
    if n_target != target.n_layer:
        raise UserError(f"draft was trained for a target with {n_target} layers but the target GGUF "
                        f"has {target.n_layer}: pair it with the target it was trained on")
    check_target_layers(gguf_ids, target, allow_nextn=True, shown=ids)
    warn_if_cannot_feed(target, warn)

    # -- tensors -----------------------------------------------------------------------------
    K = len(ids)
    need = _Need(weights)
    plan = DraftPlan("eagle3", name=config.get("_name_or_path") or "DeepSpec Eagle3 draft")
    has_d2t = "d2t" in weights
    if has_d2t:
        plan.tensor("d2t", _absolute_d2t(weights["d2t"], Vd, target.n_vocab))
        need.used.add("d2t")
    elif Vd != V:
        raise UserError(f"draft_vocab_size {Vd} < vocab_size {V} but the checkpoint has no d2t table")
    if head == "own":
        plan.tensor("token_embd.weight", need("embed_tokens.weight", (V, H)))
    if head == "own" or has_d2t:
        plan.tensor("output.weight", need("lm_head.weight", (Vd, H)))
    plan.tensor("fc.weight", need("fc.weight", (H, K * Ht)))
    plan.tensor("output_norm.weight", need("norm.weight", (H,)))
    p, b = "layers.0.", "blk.0."
    plan.tensor(b + "attn_norm.weight", need(p + "input_layernorm.weight", (H,)))
    plan.tensor(b + "attn_norm_2.weight", need(p + "hidden_norm.weight", (H,)))
    plan.tensor(b + "attn_q.weight", need(p + "self_attn.q_proj.weight", (n_head * hd, 2 * H)),
                transform=lambda w: _unrotate_half(w, n_head))
    plan.tensor(b + "attn_k.weight", need(p + "self_attn.k_proj.weight", (n_kv * hd, 2 * H)),
                transform=lambda w: _unrotate_half(w, n_kv))
    plan.tensor(b + "attn_v.weight", need(p + "self_attn.v_proj.weight", (n_kv * hd, 2 * H)))
    plan.tensor(b + "attn_output.weight", need(p + "self_attn.o_proj.weight", (H, n_head * hd)))
    plan.tensor(b + "attn_q_norm.weight", need(p + "self_attn.q_norm.weight", (hd,)),
                transform=lambda w: _unrotate_half(w, 1))
    plan.tensor(b + "attn_k_norm.weight", need(p + "self_attn.k_norm.weight", (hd,)),
                transform=lambda w: _unrotate_half(w, 1))
    plan.tensor(b + "ffn_norm.weight", need(p + "post_attention_layernorm.weight", (H,)))
    I = weights[p + "mlp.gate_proj.weight"].shape[0] if p + "mlp.gate_proj.weight" in weights else \
        get_int(config, "intermediate_size")
    plan.tensor(b + "ffn_gate.weight", need(p + "mlp.gate_proj.weight", (I, H)))
    plan.tensor(b + "ffn_up.weight", need(p + "mlp.up_proj.weight", (I, H)))
    plan.tensor(b + "ffn_down.weight", need(p + "mlp.down_proj.weight", (H, I)))
    need.check_unused(warn)

    # -- metadata ----------------------------------------------------------------------------
    # DeepSpec's residual is the raw fused feature: no norm before the residual or the fc
    add_eagle3_keys(plan, n_ctx=get_int(config, "max_position_embeddings", default=target.n_ctx_train or 32768),
                    width=H, n_ff=I, n_head=n_head, n_kv=n_kv, head_dim=hd, eps=eps, theta=theta,
                    layer_ids=gguf_ids, target_width=Ht, norm_before_residual=False, norm_before_fc=False)
    plan.summary = {"kind": kind.name, "backbone": kind.backbone, "target_layers": gguf_ids,
                    "deepspec_layers": ids, "block_size": None, "head": head, "n_layer": 1,
                    "draft_vocab": Vd if has_d2t else None, "runtime": PATCH_NOTE}
    return plan
