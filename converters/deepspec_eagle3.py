"""DeepSpec Eagle3 checkpoints (`Qwen3Eagle3Model`, `Gemma4Eagle3Model`) -> llama.cpp arch `eagle3`.

DeepSpec's Eagle3 is an EAGLE-3 head with things the stock eagle3 graph lacks: it reads
5 target layers (not 3), its decoder layer normalises q and k per head before RoPE, and the
Gemma 4 variant's layer is Gemma's (docs/gguf-formats.md §4, docs/patches.md 0001-0003). The
repository's patches/ teach llama.cpp all of it; the file is written regardless, and the
runtime refuses it with one line on a stock build (compat.check_hidden_state_pair). What the
mapping does on purpose:
- target layer ids are shifted by +1: DeepSpec feeds the *output* of layer i, llama.cpp
  extracts the *input* of layer i+1 (-1, the embeddings, becomes 0);
- q/k rows go from HF rotate-half to eagle3's interleaved (NORM) RoPE, and the q/k norm
  weights get the same within-head permutation, since they scale the permuted channels;
- `d2t`, when present, becomes absolute I64 target ids, and then the draft's own reduced
  head is always written (the target's head would not match it).
- Gemma 4: K = V (no v_proj), so V carries the permuted k rows as well; its channels reach
  o_proj in that order, so o_proj's columns get the same within-head permutation. Gemma's
  norms, the layer scalar, GELU-tanh, sqrt(H) embeddings (rounded as DeepSpec computes them),
  attention scale 1, proportional RoPE and soft-capping become the eagle3 keys and optional
  tensors of patch 0003.
"""

from __future__ import annotations

from gguf import GGUFValueType as VT

from specgguf.errors import UserError

from .checkpoints import Kind, get_float, get_int, rope_parameters
from .deepspec import _Need, _check_backbone, _embedding_scale, _gemma_layer_norms, _gemma_rope_freqs
from .eagle3 import _absolute_d2t, _unrotate_half, add_eagle3_keys
from .safetensors import Weights
from .targets import check_target_layers, check_vocab, check_width, warn_if_cannot_feed
from .writer import DraftPlan

PATCH_NOTE = "needs the patched llama.cpp build (specgguf build-llama --patched)"


BACKBONES = ("qwen3", "gemma4")


def refuse_backbone(kind: Kind) -> None:
    if kind.backbone not in BACKBONES:
        raise UserError(f"DeepSpec Eagle3 checkpoints for {kind.backbone} cannot be converted: only "
                        "Qwen3 and Gemma 4 decoder layers have an eagle3 form")


def _gemma_checks(config: dict) -> tuple[int, int]:
    """(head size, KV heads) of a Gemma4Eagle3Model's attention; what patch 0003 cannot run is refused."""
    if not config.get("attention_k_eq_v", False):
        raise UserError("Gemma 4 Eagle3 checkpoint without attention_k_eq_v: its separate V projection "
                        "(with a V norm) has no llama.cpp eagle3 equivalent")
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu"):
        raise UserError(f"Gemma 4 Eagle3 draft with activation {act!r}: llama.cpp eagle3 runs only "
                        "gelu_pytorch_tanh or silu")
    if config.get("enable_moe_block") or get_int(config, "hidden_size_per_layer_input", default=0):
        raise UserError("Gemma 4 Eagle3 draft with a MoE block or per-layer inputs: not supported by llama.cpp eagle3")
    if config.get("final_logit_softcapping") is not None:
        get_float(config, "final_logit_softcapping")  # positive and finite, or one line
    return (get_int(config, "global_head_dim", "head_dim"),
            get_int(config, "num_global_key_value_heads", "num_key_value_heads"))


def plan_deepspec_eagle3(config: dict, weights: Weights, kind: Kind, target, head: str, warn) -> DraftPlan:
    refuse_backbone(kind)
    _check_backbone(kind.backbone, target)  # first: a Gemma-4 config is not read against a qwen3 target
    gemma = kind.backbone == "gemma4"
    H = get_int(config, "hidden_size")
    n_head = get_int(config, "num_attention_heads")
    if gemma:
        hd, n_kv = _gemma_checks(config)
    else:
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
    if not gemma and (config.get("hidden_act") or "silu") != "silu":
        raise UserError(f"DeepSpec Eagle3 draft with activation {config.get('hidden_act')!r}: only silu runs")
    layer_types = config.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise UserError(f"draft with layer types {sorted(set(layer_types))}: only full attention "
                        "layers are supported")
    rope = rope_parameters(config)
    theta = float(rope.get("rope_theta", 1e6 if gemma else 10000.0))  # HF configs' defaults
    rope_types = ("default", None, "proportional") if gemma else ("default", None)
    if rope.get("rope_type", rope.get("type", "default")) not in rope_types:
        raise UserError(f"DeepSpec Eagle3 draft with RoPE type {rope.get('rope_type')!r}: only "
                        f"{'default or proportional' if gemma else 'default'} RoPE is supported")

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
    if not gemma:
        plan.tensor(b + "attn_v.weight", need(p + "self_attn.v_proj.weight", (n_kv * hd, 2 * H)))
        plan.tensor(b + "attn_output.weight", need(p + "self_attn.o_proj.weight", (H, n_head * hd)))
    else:
        if p + "self_attn.v_proj.weight" in weights:
            raise UserError(f"{p}self_attn.v_proj.weight present although attention_k_eq_v is set: the "
                            "checkpoint does not match its config")
        # V is K's permuted rows (K = V): o_proj reads those channels, so permute its columns too
        plan.tensor(b + "attn_output.weight", need(p + "self_attn.o_proj.weight", (H, n_head * hd)),
                    transform=lambda w: _unrotate_half(w.T, n_head).T.copy())
    plan.tensor(b + "attn_q_norm.weight", need(p + "self_attn.q_norm.weight", (hd,)),
                transform=lambda w: _unrotate_half(w, 1))
    plan.tensor(b + "attn_k_norm.weight", need(p + "self_attn.k_norm.weight", (hd,)),
                transform=lambda w: _unrotate_half(w, 1))
    if gemma:
        _gemma_layer_norms(plan, weights, need, p, b, H)
        _gemma_rope_freqs(plan, rope, hd)
    else:
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
    if gemma:  # Gemma's layer (patch 0003, docs/patches.md)
        plan.add("hidden_activation", "gelu_pytorch_tanh", VT.STRING)
        plan.add("embedding_scale", _embedding_scale(H, config, weights), VT.FLOAT32)
        plan.add("attention.scale", 1.0, VT.FLOAT32)
        if config.get("final_logit_softcapping") is not None:
            plan.add("final_logit_softcapping", get_float(config, "final_logit_softcapping"), VT.FLOAT32)
    plan.summary = {"kind": kind.name, "backbone": kind.backbone, "target_layers": gguf_ids,
                    "deepspec_layers": ids, "block_size": None, "head": head, "n_layer": 1,
                    "draft_vocab": Vd if has_d2t else None, "runtime": PATCH_NOTE}
    return plan
