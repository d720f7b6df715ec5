"""DeepSpec DFlash / DSpark checkpoints (Qwen3 and Gemma 4 backbones) -> llama.cpp arch `dflash`.

The mapping is docs/gguf-formats.md §3: weights are renamed, never transposed (PyTorch
[out, in] is GGUF {in, out}). Three things are easy to get wrong and are done on purpose here:
- target layer ids are shifted by +1: DeepSpec feeds the *output* of layer i, llama.cpp
  extracts the *input* of layer i+1;
- `dflash.sample_from_anchor` is true for every DeepSpec file, DFlash included: DeepSpec
  trains slot k of the block to predict token anchor+k+1;
- heads: either both `token_embd` and `output` are written, or neither (llama.cpp silently
  ties a missing `output` to `token_embd`, wrong for untied targets such as Qwen3-8B).
DeepSpec Eagle3 checkpoints are converted by deepspec_eagle3.py.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFValueType as VT

from specgguf.errors import UserError

from .checkpoints import Kind, get_float, get_int, rope_parameters
from .safetensors import Weights, check_float_tensor
from .targets import check_target_layers, check_width, check_vocab, warn_if_cannot_feed
from .writer import DraftPlan


def plan_dspark(config: dict, weights: Weights, kind: Kind, target, head: str, warn) -> DraftPlan:
    """Check a DeepSpec DFlash/DSpark checkpoint against `target` and map it to a dflash plan."""
    gemma = kind.backbone == "gemma4"
    H = get_int(config, "hidden_size")
    n_layer = get_int(config, "num_hidden_layers")
    n_head = get_int(config, "num_attention_heads")
    V = get_int(config, "vocab_size")
    if gemma:
        if not config.get("attention_k_eq_v", False):
            raise UserError("Gemma 4 DSpark checkpoint without attention_k_eq_v: its separate V "
                            "projection and V-norm have no llama.cpp dflash equivalent")
        head_dim = get_int(config, "global_head_dim", "head_dim")
        n_kv = get_int(config, "num_global_key_value_heads", "num_key_value_heads")
        act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu"):
            raise UserError(f"Gemma 4 draft with activation {act!r}: llama.cpp dflash runs only "
                            "gelu_pytorch_tanh or silu")
        if config.get("enable_moe_block"):
            raise UserError("Gemma 4 draft with a MoE block: not supported by llama.cpp dflash")
    else:
        head_dim = get_int(config, "head_dim", default=H // n_head)
        n_kv = get_int(config, "num_key_value_heads", default=n_head)
        act = config.get("hidden_act") or "silu"
        if act != "silu":
            raise UserError(f"Qwen3 draft with activation {act!r}: llama.cpp dflash runs only silu")
    if config.get("attention_bias"):
        raise UserError("draft with attention biases: llama.cpp dflash loads no attention biases")
    layer_types = config.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise UserError(f"draft with layer types {sorted(set(layer_types))}: only full attention "
                        "layers are supported")

    ids = config.get("target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise UserError("config.json lacks target_layer_ids (a list of target layer numbers)")
    if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < -1:
        raise UserError(f"config.json: target_layer_ids {ids} must be increasing and >= -1")
    gguf_ids = [i + 1 for i in ids]  # output of layer i == input of layer i+1; -1 (embeddings) -> 0
    block_size = get_int(config, "block_size")
    if block_size < 2:
        raise UserError(f"config.json: block_size {block_size} must be at least 2")
    mask = get_int(config, "mask_token_id")
    rank = get_int(config, "markov_rank", default=0)
    if rank and (config.get("markov_head_type") or "vanilla") != "vanilla":
        raise UserError(f"Markov head type {config.get('markov_head_type')!r} is not supported by "
                        "llama.cpp (only 'vanilla'): this checkpoint cannot be converted")
    eps = get_float(config, "rms_norm_eps", 1e-6)
    rope = rope_parameters(config)
    theta = float(rope.get("rope_theta", 1e6 if gemma else 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "proportional") and not (rope_type == "linear" and not gemma):
        raise UserError(f"RoPE type {rope_type!r} in the draft config is not supported by the converter")

    # -- checks against the target GGUF (before any tensor is read) --------------------------
    _check_backbone(kind.backbone, target)
    check_vocab(V, target, "draft config vocab_size")
    check_width(H, target, "draft hidden_size (dflash drafts read rows of the target's width)")
    n_target = get_int(config, "num_target_layers", default=target.n_layer)
    if n_target != target.n_layer:
        raise UserError(f"draft was trained for a target with {n_target} layers but the target GGUF "
                        f"has {target.n_layer}: pair it with the target it was trained on")
    check_target_layers(gguf_ids, target, allow_nextn=False, shown=ids)
    _check_heads(target, n_head, head_dim)
    if mask >= target.n_vocab:
        raise UserError(f"mask_token_id {mask} is outside the target vocabulary ({target.n_vocab} tokens)")
    if gemma:
        _check_gemma_mask(mask, target)
    warn_if_cannot_feed(target, warn)
    if gemma and config.get("final_logit_softcapping") and rank:
        warn("the draft config sets final_logit_softcapping: llama.cpp adds the Markov bias to "
             "uncapped logits (DeepSpec to capped ones), so chained drafts may differ; output "
             "stays the target's")

    # -- tensors -----------------------------------------------------------------------------
    K = len(ids)
    I = _rows(weights, "layers.0.mlp.gate_proj.weight")  # Gemma 4 may widen MLPs: trust the tensor
    plan = DraftPlan("dflash", name=config.get("_name_or_path") or "DeepSpec draft")
    need = _Need(weights)
    if head == "own":
        plan.tensor("token_embd.weight", need("embed_tokens.weight", (V, H)))
        plan.tensor("output.weight", need("lm_head.weight", (V, H)))
    plan.tensor("fc.weight", need("fc.weight", (H, K * H)))
    plan.tensor("enc.output_norm.weight", need("hidden_norm.weight", (H,)))
    plan.tensor("output_norm.weight", need("norm.weight", (H,)))
    if gemma:
        _gemma_rope_freqs(plan, rope, head_dim)
    q_out, kv_out = n_head * head_dim, n_kv * head_dim
    for i in range(n_layer):
        p, b = f"layers.{i}.", f"blk.{i}."
        plan.tensor(b + "attn_norm.weight", need(p + "input_layernorm.weight", (H,)))
        plan.tensor(b + "attn_q.weight", need(p + "self_attn.q_proj.weight", (q_out, H)))
        plan.tensor(b + "attn_k.weight", need(p + "self_attn.k_proj.weight", (kv_out, H)))
        if gemma:
            if p + "self_attn.v_proj.weight" in weights:
                raise UserError(f"{p}self_attn.v_proj.weight present although attention_k_eq_v is "
                                "set: the checkpoint does not match its config")
        else:
            plan.tensor(b + "attn_v.weight", need(p + "self_attn.v_proj.weight", (kv_out, H)))
        plan.tensor(b + "attn_output.weight", need(p + "self_attn.o_proj.weight", (H, q_out)))
        plan.tensor(b + "attn_q_norm.weight", need(p + "self_attn.q_norm.weight", (head_dim,)))
        plan.tensor(b + "attn_k_norm.weight", need(p + "self_attn.k_norm.weight", (head_dim,)))
        if gemma:
            _gemma_layer_norms(plan, weights, need, p, b, H)
        else:  # Qwen3's post_attention_layernorm is the pre-FFN norm
            plan.tensor(b + "ffn_norm.weight", need(p + "post_attention_layernorm.weight", (H,)))
        plan.tensor(b + "ffn_gate.weight", need(p + "mlp.gate_proj.weight", (I, H)))
        plan.tensor(b + "ffn_up.weight", need(p + "mlp.up_proj.weight", (I, H)))
        plan.tensor(b + "ffn_down.weight", need(p + "mlp.down_proj.weight", (H, I)))

    has_conf = "confidence_head.proj.weight" in weights
    if rank:
        plan.tensor("markov_w1.weight", need("markov_head.markov_w1.weight", (V, rank)))
        plan.tensor("markov_w2.weight", need("markov_head.markov_w2.weight", (V, rank)))
        if has_conf:
            # llama.cpp's confidence head reads [norm(h); markov_w1[prev]]: width H + R
            plan.tensor("conf_proj.weight", need("confidence_head.proj.weight", (1, H + rank)), f32=True)
            plan.tensor("conf_proj.bias", need("confidence_head.proj.bias", (1,)))
    elif has_conf:
        warn("the checkpoint has a confidence head without a Markov head; llama.cpp loads "
             "confidence heads only with a Markov head, so it is left out")
        has_conf = False
    need.check_unused(warn)

    # -- metadata ----------------------------------------------------------------------------
    add = plan.add
    add("context_length", get_int(config, "max_position_embeddings", default=target.n_ctx_train or 32768), VT.UINT32)
    add("embedding_length", H, VT.UINT32)
    add("block_count", n_layer, VT.UINT32)
    add("feed_forward_length", I, VT.UINT32)
    add("attention.head_count", n_head, VT.UINT32)
    add("attention.head_count_kv", n_kv, VT.UINT32)
    add("attention.key_length", head_dim, VT.UINT32)
    add("attention.value_length", head_dim, VT.UINT32)
    add("attention.layer_norm_rms_epsilon", eps, VT.FLOAT32)
    add("rope.freq_base", theta, VT.FLOAT32)
    add("rope.dimension_count", head_dim, VT.UINT32)
    if rope_type == "linear":
        add("rope.scaling.type", "linear", VT.STRING)
        add("rope.scaling.factor", float(rope.get("factor", 1.0)), VT.FLOAT32)
    add("target_layers", gguf_ids, VT.ARRAY, VT.INT32)
    add("block_size", block_size, VT.UINT32)
    add("sample_from_anchor", True, VT.BOOL)
    add("has_confidence_head", bool(has_conf), VT.BOOL)
    if gemma:
        add("hidden_activation", "gelu_pytorch_tanh", VT.STRING)
        add("embedding_scale", _embedding_scale(H, config, weights), VT.FLOAT32)
        add("attention.scale", 1.0, VT.FLOAT32)
    plan.mask_token_id = mask
    plan.summary = {"kind": kind.name, "backbone": kind.backbone, "target_layers": gguf_ids,
                    "deepspec_layers": ids, "block_size": block_size, "markov_rank": rank,
                    "confidence_head": bool(has_conf), "head": head, "n_layer": n_layer,
                    "runtime": f"on the stock build, beside a {'gemma4' if gemma else 'qwen3'} target"}
    return plan


def _check_backbone(backbone: str, target) -> None:
    """A Gemma-4 draft reads a gemma4 target's layers and embeddings, a Qwen3 draft a Qwen3's:
    across the two, widths may even agree while tokens and features mean other things."""
    if backbone == "gemma4" and target.arch != "gemma4":
        raise UserError(f"this is a Gemma 4 draft but the target {target.path.name} has architecture "
                        f"{target.arch!r}: pair it with a gemma4 target GGUF (the model it was trained for)")
    if backbone != "gemma4" and target.arch == "gemma4":
        raise UserError(f"this is a {backbone} draft but the target {target.path.name} is a gemma4 model: "
                        "pair it with the target it was trained for (for Gemma 4, use a Gemma-4 checkpoint)")


def _check_gemma_mask(mask: int, target) -> None:
    """Gemma-4 drafts embed Gemma's own `<mask>` token; a target without it at that id would
    feed the draft some other token's embedding at every masked slot."""
    declared = target.mask_id
    text = target.tokens[mask]
    if declared == mask or (declared is None and text == "<mask>"):
        return
    has = f"its mask token is id {declared}" if declared is not None else f"its token {mask} is {text!r}"
    raise UserError(f"the draft's mask_token_id {mask} is not a <mask> token in the target vocabulary "
                    f"({has}): use the target GGUF the draft was trained for")


def _embedding_scale(H: int, config: dict, weights: Weights) -> float:
    """sqrt(H) as DeepSpec's model applies it: Gemma4TextScaledWordEmbedding multiplies by the
    scale cast to the weights' dtype, so a BF16 checkpoint (all released ones) was trained and
    evaluated with bf16(sqrt(H)) (62.0, not 61.97, for H = 3840): write what it computed."""
    scale = np.float32(math.sqrt(H))
    name = "embed_tokens.weight"
    dtype = weights[name].dtype if name in weights else {
        "bfloat16": "BF16", "float16": "F16"}.get(str(config.get("dtype") or config.get("torch_dtype")), "F32")
    if dtype == "BF16":
        bits = scale.view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return float(bits.view(np.float32))
    if dtype == "F16":
        return float(np.float16(scale))
    return float(scale)


def _check_heads(target, n_head: int, head_dim: int) -> None:
    """DeepSpec configs copy the target's: differing heads mean the draft is for another model."""
    t_heads = target.n_head
    t_dim = target.metadata.get(f"{target.arch}.attention.key_length")
    if t_heads and t_heads != n_head:
        raise UserError(f"draft has {n_head} attention heads but the target has {t_heads}: "
                        "this draft was trained for a different target")
    if isinstance(t_dim, int) and t_dim != head_dim:
        raise UserError(f"draft head size is {head_dim} but the target's is {t_dim}: "
                        "this draft was trained for a different target")


def _gemma_layer_norms(plan: DraftPlan, weights: Weights, need, p: str, b: str, H: int) -> None:
    """A Gemma layer's norms around attention and FFN, and its optional output scalar.
    Gemma's post-attention norm acts on the attention output, before the residual."""
    plan.tensor(b + "post_attention_norm.weight", need(p + "post_attention_layernorm.weight", (H,)))
    plan.tensor(b + "ffn_norm.weight", need(p + "pre_feedforward_layernorm.weight", (H,)))
    plan.tensor(b + "post_ffw_norm.weight", need(p + "post_feedforward_layernorm.weight", (H,)))
    scalar = _first(weights, p + "layer_scalar", p + "layer_scalar.weight")
    if scalar is not None:
        plan.tensor(b + "layer_output_scale.weight", need(scalar, (1,)))


def _gemma_rope_freqs(plan: DraftPlan, rope: dict, head_dim: int) -> None:
    """Proportional RoPE: rotate the first n pairs, leave the rest (factor 1e30 = angle 0)."""
    if rope.get("rope_type", "proportional") != "proportional":
        return
    fraction = float(rope.get("partial_rotary_factor", 0.25))
    n_rot = int(head_dim * fraction / 2)
    if not 0 < fraction <= 1 or head_dim * fraction != 2 * n_rot:
        raise UserError(f"partial_rotary_factor {fraction} with head size {head_dim} gives an odd "
                        "number of rotated dimensions")
    factors = np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)
    plan.tensor("rope_freqs.weight", factors)


def _rows(weights: Weights, name: str) -> int:
    if name not in weights:
        raise UserError(f"checkpoint lacks tensor {name}: the weights are incomplete or not a "
                        "DeepSpec draft")
    return weights[name].shape[0]


def _first(weights: Weights, *names):
    return next((n for n in names if n in weights), None)


class _Need:
    """Fetch checkpoint tensors by name with shape/dtype checks; remember which were used."""

    IGNORED = ("rotary_emb.", "t2d")

    def __init__(self, weights: Weights):
        self.weights = weights
        self.used: set[str] = set()

    def __call__(self, name: str, shape: tuple[int, ...]):
        if name not in self.weights:
            raise UserError(f"checkpoint lacks tensor {name}: the weights are incomplete or do "
                            "not match config.json")
        t = self.weights[name]
        check_float_tensor(t, name, shape)
        self.used.add(name)
        return t

    def check_unused(self, warn) -> None:
        skipped = {"embed_tokens.weight", "lm_head.weight"}  # --head shared leaves them out
        extra = [n for n in self.weights.names()
                 if n not in self.used and n not in skipped and not n.startswith(self.IGNORED)]
        if extra:
            raise UserError(f"checkpoint has tensors the converter does not know ({', '.join(extra[:3])}"
                            f"{', ...' if len(extra) > 3 else ''}): it is not a supported DeepSpec layout")
