"""Standard EAGLE-3 drafts (SpecForge / speculators / AngelSlim exports) -> llama.cpp arch `eagle3`.

These are the 3-layer, one-decoder-layer, Llama-style heads that the pinned llama.cpp runs
(src/models/eagle3.cpp). Facts taken from its converter (conversion/llama.py) and loader:
- layers are `midlayer.*` (SpecForge) or `layers.0.*` (speculators), optionally under `model.`;
- `eagle_aux_hidden_state_layer_ids` are already layer-*input* ids (no shift); without them
  the default is [2, n/2, n-3];
- q/k rows are permuted from the HF rotate-half layout to llama's interleaved RoPE;
- `d2t` holds offsets (draft id i -> target id i + d2t[i]); GGUF wants absolute ids, as I64;
- the draft's own lm_head (reduced vocabulary) is always written: the target's head would not
  match `d2t`. `token_embd` is written with `--head own`, else borrowed from the target.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFValueType as VT

from specgguf.errors import UserError

from .checkpoints import Kind, get_float, get_int, rope_parameters
from .safetensors import Weights, check_float_tensor
from .targets import check_target_layers, check_vocab, check_width, warn_if_cannot_feed
from .writer import DraftPlan

_IGNORED = ("t2d", "rotary_emb.")


def plan_eagle3(config: dict, weights: Weights, kind: Kind, target, head: str, warn) -> DraftPlan:
    if isinstance(config.get("transformer_layer_config"), dict):  # speculators nests the layer config
        config = {**config, **config["transformer_layer_config"]}
    names = _Names(weights)
    Hd = get_int(config, "hidden_size")
    n_head = get_int(config, "num_attention_heads")
    n_kv = get_int(config, "num_key_value_heads", default=n_head)
    hd = get_int(config, "head_dim", default=Hd // n_head)
    V = get_int(config, "vocab_size", default=target.n_vocab)
    Vd = get_int(config, "draft_vocab_size", default=V)
    eps = get_float(config, "rms_norm_eps", 1e-6)
    Ht = get_int(config, "target_hidden_size", default=target.n_embd)
    if get_int(config, "num_hidden_layers", default=1) != 1:
        raise UserError("EAGLE-3 draft with more than one decoder layer: llama.cpp's eagle3 graph "
                        "runs exactly one")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise UserError("EAGLE-3 draft with biases: llama.cpp's eagle3 graph has none")
    if (config.get("hidden_act") or "silu") != "silu":
        raise UserError(f"EAGLE-3 draft with activation {config.get('hidden_act')!r}: only silu runs")
    layer = names.layer_prefix()
    if names.has(layer + "self_attn.q_norm.weight"):
        raise UserError("EAGLE-3 draft with q/k norms: llama.cpp's eagle3 graph has none")

    ids = config.get("eagle_aux_hidden_state_layer_ids") or config.get("aux_hidden_state_layer_ids")
    if not ids:
        n = target.n_layer
        ids = [2, n // 2, n - 3]
    if len(ids) != 3 or not all(isinstance(i, int) for i in ids):
        raise UserError(f"EAGLE-3 draft reads target layers {ids}: llama.cpp's eagle3 needs exactly 3")

    check_vocab(V, target, "draft vocab_size")
    check_width(Ht, target, "draft target_hidden_size")
    check_target_layers(ids, target, allow_nextn=True)
    warn_if_cannot_feed(target, warn)

    plan = DraftPlan("eagle3", name=config.get("_name_or_path") or "EAGLE-3 draft")
    need = names.need
    I = names.get(layer + "mlp.gate_proj.weight").shape[0] if names.has(layer + "mlp.gate_proj.weight") else \
        get_int(config, "intermediate_size")
    if head == "own":
        if not names.has("embed_tokens.weight"):
            raise UserError("this EAGLE-3 checkpoint has no embed_tokens.weight: use --head shared "
                            "(the draft then borrows the target's embeddings)")
        plan.tensor("token_embd.weight", need("embed_tokens.weight", (V, Hd)))
    plan.tensor("output.weight", need("lm_head.weight", (Vd, Hd)))
    plan.tensor("fc.weight", need("fc.weight", (Hd, 3 * Ht)))
    norm_before_fc = bool(config.get("norm_before_fc", False))
    if norm_before_fc:
        plan.tensor("enc.output_norm.weight", need("input_norm.weight", (3 * Ht,)))
    plan.tensor("output_norm.weight", need("norm.weight", (Hd,)))
    b, p = "blk.0.", layer
    plan.tensor(b + "attn_norm.weight", need(p + "input_layernorm.weight", (Hd,)))
    plan.tensor(b + "attn_norm_2.weight", need(p + "hidden_norm.weight", (Hd,)))
    plan.tensor(b + "attn_q.weight", need(p + "self_attn.q_proj.weight", (n_head * hd, 2 * Hd)),
                transform=lambda w: _unrotate_half(w, n_head))
    plan.tensor(b + "attn_k.weight", need(p + "self_attn.k_proj.weight", (n_kv * hd, 2 * Hd)),
                transform=lambda w: _unrotate_half(w, n_kv))
    plan.tensor(b + "attn_v.weight", need(p + "self_attn.v_proj.weight", (n_kv * hd, 2 * Hd)))
    plan.tensor(b + "attn_output.weight", need(p + "self_attn.o_proj.weight", (Hd, n_head * hd)))
    plan.tensor(b + "ffn_norm.weight", need(p + "post_attention_layernorm.weight", (Hd,)))
    plan.tensor(b + "ffn_gate.weight", need(p + "mlp.gate_proj.weight", (I, Hd)))
    plan.tensor(b + "ffn_up.weight", need(p + "mlp.up_proj.weight", (I, Hd)))
    plan.tensor(b + "ffn_down.weight", need(p + "mlp.down_proj.weight", (Hd, I)))
    if names.has("d2t"):
        plan.tensor("d2t", _absolute_d2t(names.get("d2t"), Vd, target.n_vocab))
        names.used.add(names.full("d2t"))
    elif Vd != V:
        raise UserError(f"draft_vocab_size {Vd} < vocab_size {V} but the checkpoint has no d2t table")

    rope = rope_parameters(config)
    theta = float(rope.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "llama3":
        plan.tensor("rope_freqs.weight", _llama3_factors(rope, theta, hd))
    elif rope_type not in ("default", None):
        raise UserError(f"EAGLE-3 draft with RoPE type {rope_type!r}: only default and llama3 are supported")
    names.check_unused(skip={"embed_tokens.weight"})

    add_eagle3_keys(plan, n_ctx=get_int(config, "max_position_embeddings", default=target.n_ctx_train or 4096),
                    width=Hd, n_ff=I, n_head=n_head, n_kv=n_kv, head_dim=hd, eps=eps, theta=theta,
                    layer_ids=list(ids), target_width=Ht,
                    norm_before_residual=bool(config.get("norm_before_residual", False)),
                    norm_before_fc=norm_before_fc)
    plan.summary = {"kind": kind.name, "backbone": "llama", "target_layers": list(ids),
                    "block_size": None, "draft_vocab": Vd, "head": head, "n_layer": 1}
    return plan


def _unrotate_half(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half rows -> llama's interleaved RoPE pairs (llama.cpp's LlamaModel.permute)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _absolute_d2t(t, n_draft: int, n_target: int) -> np.ndarray:
    offsets = np.asarray(t.raw()).reshape(-1).astype(np.int64)
    if offsets.size != n_draft:
        raise UserError(f"d2t has {offsets.size} entries but draft_vocab_size is {n_draft}")
    ids = offsets + np.arange(offsets.size, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n_target):
        raise UserError(f"d2t maps draft tokens outside the target vocabulary ({n_target} tokens): "
                        "this draft was made for a different target")
    if np.unique(ids).size != ids.size:
        raise UserError("d2t maps two draft tokens to the same target token: the table is damaged")
    return ids


def _llama3_factors(rope: dict, base: float, dim: int) -> np.ndarray:
    """Llama-3 RoPE scaling as per-frequency divisors (ggml's rope freq_factors)."""
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old_ctx = float(rope.get("original_max_position_embeddings", 8192))
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


class _Names:
    """Checkpoint tensor lookup tolerant of an optional `model.` prefix, with shape checks."""

    def __init__(self, weights: Weights):
        self.weights = weights
        self.used: set[str] = set()

    def full(self, name: str) -> str | None:
        for n in (name, "model." + name):
            if n in self.weights:
                return n
        return None

    def has(self, name: str) -> bool:
        return self.full(name) is not None

    def get(self, name: str):
        return self.weights[self.full(name)]

    def layer_prefix(self) -> str:
        for p in ("midlayer.", "layers.0."):
            if self.has(p + "self_attn.q_proj.weight"):
                return p
        raise UserError("checkpoint lacks the EAGLE-3 decoder layer (midlayer.* or layers.0.*): "
                        "not a standard EAGLE-3 export")

    def need(self, name: str, shape):
        full = self.full(name)
        if full is None:
            raise UserError(f"checkpoint lacks tensor {name}: the weights are incomplete or do not "
                            "match config.json")
        t = self.weights[full]
        check_float_tensor(t, name, shape)
        self.used.add(full)
        return t

    def check_unused(self, skip=()) -> None:
        extra = [n for n in self.weights.names() if n not in self.used
                 and n.removeprefix("model.") not in skip and not n.removeprefix("model.").startswith(_IGNORED)]
        if extra:
            raise UserError(f"checkpoint has tensors the converter does not know ({', '.join(extra[:3])}"
                            f"{', ...' if len(extra) > 3 else ''}): not a standard EAGLE-3 export")


def add_eagle3_keys(plan, *, n_ctx: int, width: int, n_ff: int, n_head: int, n_kv: int, head_dim: int,
                    eps: float, theta: float, layer_ids: list, target_width: int,
                    norm_before_residual: bool, norm_before_fc: bool) -> None:
    """The `eagle3.*` keys llama.cpp reads (one decoder layer), for every EAGLE-3 flavour."""
    add = plan.add
    add("context_length", n_ctx, VT.UINT32)
    add("embedding_length", width, VT.UINT32)
    add("block_count", 1, VT.UINT32)
    add("feed_forward_length", n_ff, VT.UINT32)
    add("attention.head_count", n_head, VT.UINT32)
    add("attention.head_count_kv", n_kv, VT.UINT32)
    add("attention.key_length", head_dim, VT.UINT32)
    add("attention.value_length", head_dim, VT.UINT32)
    add("attention.layer_norm_rms_epsilon", eps, VT.FLOAT32)
    add("rope.freq_base", theta, VT.FLOAT32)
    add("rope.dimension_count", head_dim, VT.UINT32)
    add("target_layers", list(layer_ids), VT.ARRAY, VT.INT32)
    add("target_hidden_size", target_width, VT.UINT32)
    add("norm_before_residual", norm_before_residual, VT.BOOL)
    add("norm_before_fc", norm_before_fc, VT.BOOL)
