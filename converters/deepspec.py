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

from .checkpoints import Kind, flatten, get_float, get_int, rope_parameters
from .community import read_keys
from .eagle3 import _absolute_d2t
from .safetensors import Weights, check_float_tensor
from .targets import check_target_layers, check_width, check_vocab, target_tensor, warn_if_cannot_feed
from .torchpt import read_pt
from .writer import DraftPlan


def plan_dspark(config: dict, weights: Weights, kind: Kind, target, head: str, warn) -> DraftPlan:
    """Check a DFlash/DSpark checkpoint (DeepSpec's, or a community layout: family "dflash")
    against `target` and map it to a dflash plan."""
    community = kind.family == "dflash"
    if community:
        config = flatten(config)
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
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise UserError("draft with attention or MLP biases: llama.cpp dflash loads no such biases")
    layer_types = config.get("layer_types")
    if not community and layer_types and any(t != "full_attention" for t in layer_types):
        raise UserError(f"draft with layer types {sorted(set(layer_types))}: only full attention "
                        "layers are supported")

    if community:
        keys = read_keys(config, kind, n_layer, warn)
        ids, gguf_ids, block_size, mask, rank = keys.ids, keys.gguf_ids, keys.block_size, keys.mask, keys.rank
    else:
        keys = None
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
    Vd = get_int(config, "draft_vocab_size", default=V) if community else V  # DeepSpec: always full
    if Vd > V:
        raise UserError(f"config.json: draft_vocab_size {Vd} exceeds vocab_size {V}: the config is damaged")
    reduced = Vd < V
    if reduced and keys is not None and keys.dflash2:
        raise UserError("DFlash 2 checkpoint with a reduced draft vocabulary: the pinned runtime's selector "
                        "indexes its codebooks by target token id, over the full vocabulary")
    eps = get_float(config, "rms_norm_eps", 1e-6)
    rope = rope_parameters(config)
    theta = float(rope.get("rope_theta", 1e6 if gemma else 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope_ok = ("default", "proportional") + (("linear",) if not gemma else ()) + (("yarn",) if community else ())
    if rope_type not in rope_ok:
        raise UserError(f"RoPE type {rope_type!r} in the draft config is not supported by the converter")
    n_rot = head_dim
    if community:  # as the pinned converter: a partial rotary factor ropes the first dims only
        fraction = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
        if fraction is not None:
            fraction = get_float({"partial_rotary_factor": fraction}, "partial_rotary_factor")
            n_rot = int(head_dim * fraction)
            if not 0 < n_rot <= head_dim or n_rot % 2:
                raise UserError(f"partial_rotary_factor {fraction} with head size {head_dim} gives "
                                f"{n_rot} rotated dimensions: it must be a positive even number")

    # -- checks against the target GGUF (before any tensor is read) --------------------------
    _check_backbone(kind.backbone, target)
    check_vocab(V, target, "draft config vocab_size")
    check_width(H, target, "draft hidden_size (dflash drafts read rows of the target's width)")
    n_target = keys.n_target if community else get_int(config, "num_target_layers", default=None)
    if n_target is not None and n_target != target.n_layer:
        raise UserError(f"draft was trained for a target with {n_target} layers but the target GGUF "
                        f"has {target.n_layer}: pair it with the target it was trained on")
    check_target_layers(gguf_ids, target, allow_nextn=False, shown=ids)
    if not community:  # DeepSpec configs copy the target's; other exports may shape their own heads
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
    if community and rank and (keys.softcap or (keys.logit_scale not in (None, 1.0))):
        warn("the draft config scales or caps its logits (output_multiplier, final_logit_softcapping): "
             "llama.cpp adds the Markov bias to the raw logits, so chained drafts may differ; output "
             "stays the target's")

    # -- tensors -----------------------------------------------------------------------------
    K = len(ids)
    need = _Need(weights)
    I = need.shape("layers.0.mlp.gate_proj.weight")[0]  # Gemma 4 may widen MLPs: trust the tensor
    plan = DraftPlan("dflash", name=config.get("_name_or_path") or "DFlash draft")
    mask_row = _mask_embedding(weights, config, mask, H, V) if community else None
    if mask_row is not None:
        if head != "own":
            warn("mask_embedding.pt replaces the mask token's embedding, so the draft carries its own "
                 "embeddings and head (as with --head own)")
        head = "own"
    if head == "own":
        embd = _own_table(need, target, "embed_tokens.weight", "token_embd.weight", (V, H), community)
        plan.tensor("token_embd.weight", embd,
                    transform=None if mask_row is None else _patch_row(mask, mask_row))
        if not reduced:
            plan.tensor("output.weight", _own_table(need, target, "lm_head.weight", "output.weight", (V, H),
                                                    community))
    if reduced:  # the draft's own head over its vocabulary, always: the target's has V rows
        plan.tensor("output.weight", need("lm_head.weight", (Vd, H)))
    plan.tensor("fc.weight", need("fc.weight", (H, K * H)))
    plan.tensor("enc.output_norm.weight", need("hidden_norm.weight", (H,)))
    plan.tensor("output_norm.weight", need("norm.weight", (H,)))
    if gemma:
        _gemma_rope_freqs(plan, rope, head_dim)
    q_out, kv_out = n_head * head_dim, n_kv * head_dim
    # interleaved-RoPE checkpoints: q/k rows (and their norms) to the NeoX layout, per head
    qk = None if keys is None or keys.neox else (lambda w: _to_neox(w, head_dim))
    for i in range(n_layer):
        p, b = f"layers.{i}.", f"blk.{i}."
        plan.tensor(b + "attn_norm.weight", need(p + "input_layernorm.weight", (H,)))
        plan.tensor(b + "attn_q.weight", need(p + "self_attn.q_proj.weight", (q_out, H)), transform=qk)
        plan.tensor(b + "attn_k.weight", need(p + "self_attn.k_proj.weight", (kv_out, H)), transform=qk)
        if gemma:
            if need.has(p + "self_attn.v_proj.weight"):
                raise UserError(f"{p}self_attn.v_proj.weight present although attention_k_eq_v is "
                                "set: the checkpoint does not match its config")
        else:
            plan.tensor(b + "attn_v.weight", need(p + "self_attn.v_proj.weight", (kv_out, H)))
        plan.tensor(b + "attn_output.weight", need(p + "self_attn.o_proj.weight", (H, q_out)))
        plan.tensor(b + "attn_q_norm.weight", need(p + "self_attn.q_norm.weight", (head_dim,)), transform=qk)
        plan.tensor(b + "attn_k_norm.weight", need(p + "self_attn.k_norm.weight", (head_dim,)), transform=qk)
        if gemma:
            _gemma_layer_norms(plan, weights, need, p, b, H)
        else:  # Qwen3's post_attention_layernorm is the pre-FFN norm
            plan.tensor(b + "ffn_norm.weight", need(p + "post_attention_layernorm.weight", (H,)))
        plan.tensor(b + "ffn_gate.weight", need(p + "mlp.gate_proj.weight", (I, H)))
        plan.tensor(b + "ffn_up.weight", need(p + "mlp.up_proj.weight", (I, H)))
        plan.tensor(b + "ffn_down.weight", need(p + "mlp.down_proj.weight", (H, I)))
        if keys is not None and keys.dflash2:
            _dflash2_layer(plan, need, keys, p, b, H)
    if keys is not None and keys.dflash2:
        _dflash2_selector(plan, need, keys, H, V)

    has_conf = need.has("confidence_head.proj.weight")
    if rank:
        plan.tensor("markov_w1.weight", need("markov_head.markov_w1.weight", (V, rank)))
        plan.tensor("markov_w2.weight", need("markov_head.markov_w2.weight", (Vd, rank)))
        if has_conf and community and need.shape("confidence_head.proj.weight") == (1, H):
            warn("the checkpoint's confidence head reads the hidden state only (confidence_head_with_markov "
                 "false); llama.cpp's reads [hidden; Markov embedding], so it is left out")
            need.skip("confidence_head.proj.weight", "confidence_head.proj.bias")
            has_conf = False
        if has_conf:
            # llama.cpp's confidence head reads [norm(h); markov_w1[prev]]: width H + R
            plan.tensor("conf_proj.weight", need("confidence_head.proj.weight", (1, H + rank)), f32=True)
            if need.has("confidence_head.proj.bias") or not community:  # optional in the runtime
                plan.tensor("conf_proj.bias", need("confidence_head.proj.bias", (1,)))
    elif has_conf:
        warn("the checkpoint has a confidence head without a Markov head; llama.cpp loads "
             "confidence heads only with a Markov head, so it is left out")
        need.skip("confidence_head.proj.weight", "confidence_head.proj.bias")
        has_conf = False
    if need.has("d2t"):
        d2t = need.take("d2t")
        if reduced:
            plan.tensor("d2t", _absolute_d2t(d2t, Vd, target.n_vocab))
        elif np.any(np.asarray(d2t.raw())):
            raise UserError("d2t maps a full draft vocabulary onto other target tokens: the checkpoint is "
                            "damaged (a full vocabulary needs no mapping)")
    elif reduced:
        raise UserError(f"draft_vocab_size {Vd} < vocab_size {V} but the checkpoint has no d2t table")
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
    add("rope.dimension_count", n_rot, VT.UINT32)
    if rope_type == "linear":
        add("rope.scaling.type", "linear", VT.STRING)
        add("rope.scaling.factor", float(rope.get("factor", 1.0)), VT.FLOAT32)
    elif rope_type == "yarn":
        _yarn_keys(plan, rope)
    add("target_layers", gguf_ids, VT.ARRAY, VT.INT32)
    add("block_size", block_size, VT.UINT32)
    anchor = keys.sample_from_anchor if community else True
    add("sample_from_anchor", anchor, VT.BOOL)
    add("has_confidence_head", bool(has_conf), VT.BOOL)
    if gemma:
        add("hidden_activation", "gelu_pytorch_tanh", VT.STRING)
        add("embedding_scale", _embedding_scale(H, config, weights), VT.FLOAT32)
        add("attention.scale", 1.0, VT.FLOAT32)
    if community:
        _community_keys(plan, keys, target, head_dim)
    plan.mask_token_id = mask
    plan.summary = {"kind": kind.name, "backbone": kind.backbone, "target_layers": gguf_ids,
                    "block_size": block_size, "markov_rank": rank,
                    "confidence_head": bool(has_conf), "head": head, "n_layer": n_layer,
                    "sample_from_anchor": anchor,
                    "runtime": f"on the stock build, beside a {'gemma4' if gemma else 'qwen3'} target"}
    if not community or not keys.ids_are_inputs:
        plan.summary["deepspec_layers"] = ids  # the checkpoint's layer-output ids (shown + 1)
    if community:
        plan.summary["layout"] = kind.layout
        plan.summary["runtime"] = "on the stock build, beside its target"
    if reduced:
        plan.summary["draft_vocab"] = Vd
    if keys is not None and keys.dflash2:
        plan.summary["selector"] = {"rank": keys.sel_rank, "top_k": keys.sel_top_k,
                                    "conv_kernel": keys.conv_kernel, "conv_group": keys.conv_group}
        plan.summary["runtime"] = ("on the stock build, beside its target (llama.cpp walks the selector "
                                   "lattice; a driver that reads only logits drafts their argmax)")
    return plan


def _community_keys(plan: DraftPlan, keys, target, head_dim: int) -> None:
    """The keys the pinned converter writes for community layouts (conversion/qwen.py)."""
    add = plan.add
    if keys.value_scale is not None:
        add("attention.value_scale", keys.value_scale, VT.FLOAT32)
    if keys.logit_scale is not None:
        add("logit_scale", keys.logit_scale, VT.FLOAT32)
    if keys.softcap is not None:
        add("final_logit_softcapping", keys.softcap, VT.FLOAT32)
    if keys.embed_scale is not None:
        add("embedding_scale", keys.embed_scale, VT.FLOAT32)
    if keys.swa_window is not None:
        add("attention.sliding_window", keys.swa_window, VT.UINT32)
        add("attention.sliding_window_pattern", list(keys.swa_pattern), VT.ARRAY, VT.BOOL)
    if keys.causal is not None:
        add("attention.causal", bool(keys.causal), VT.BOOL)
    sections = target.arrays.get(f"{target.arch}.rope.dimension_sections")
    if sections is not None and any(int(s) for s in np.asarray(sections).reshape(-1)):
        # an M-RoPE target: the draft ropes on the temporal section only
        add("rope.dimension_sections", [head_dim // 2, 0, 0, 0], VT.ARRAY, VT.INT32)
    if keys.dflash2:
        add("conv_kernel_size", keys.conv_kernel, VT.UINT32)
        add("conv_group_size", keys.conv_group, VT.UINT32)
        add("selector_rank", keys.sel_rank, VT.UINT32)
        add("selector_top_k", keys.sel_top_k, VT.UINT32)


def _yarn_keys(plan: DraftPlan, rope: dict) -> None:
    factor = rope.get("factor")
    if factor is None:
        raise UserError("YaRN RoPE without a factor in the draft config: the config is incomplete")
    plan.add("rope.scaling.type", "yarn", VT.STRING)
    plan.add("rope.scaling.factor", float(factor), VT.FLOAT32)
    if rope.get("original_max_position_embeddings") is None:
        raise UserError("YaRN RoPE without original_max_position_embeddings in the draft config")
    plan.add("rope.scaling.original_context_length", int(rope["original_max_position_embeddings"]), VT.UINT32)
    for src, key in (("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"),
                     ("attn_factor", "yarn_attn_factor"), ("beta_fast", "yarn_beta_fast"),
                     ("beta_slow", "yarn_beta_slow")):
        if rope.get(src) is not None and not any(k == f"dflash.rope.scaling.{key}" for k, *_ in plan.kv):
            plan.add(f"rope.scaling.{key}", float(get_float(rope, src)), VT.FLOAT32)


def _dflash2_layer(plan: DraftPlan, need, keys, p: str, b: str, H: int) -> None:
    """DFlash 2's grouped dynamic causal convolutions around attention and the MLP.
    base_kernel [2, kernel, H] (side 0: on the sublayer input, 1: on its output);
    kernel_projection [2*kernel*groups, H], rows ordered (side, tap, group)."""
    kernel, group = keys.conv_kernel, keys.conv_group
    if H % group:
        raise UserError(f"conv_group_size {group} does not divide the hidden size {H}: the pinned "
                        "runtime's grouped convolution cannot run it")
    groups = H // group
    for src, dst in (("attention_conv", "attn_conv"), ("mlp_conv", "ffn_conv")):
        plan.tensor(f"{b}{dst}_base", need(f"{p}{src}.base_kernel", (2, kernel, H)), f32=True)
        plan.tensor(f"{b}{dst}_proj.weight", need(f"{p}{src}.kernel_projection.weight", (2 * kernel * groups, H)))


def _dflash2_selector(plan: DraftPlan, need, keys, H: int, V: int) -> None:
    """The top-K candidate selector: codebooks over the full vocabulary, a hidden projection."""
    rank, top_k = keys.sel_rank, keys.sel_top_k
    if top_k * (top_k + 1) > H:
        raise UserError(f"selector_top_k {top_k} needs {top_k * (top_k + 1)} values per position but the "
                        f"hidden size is {H}: the pinned runtime packs the selector lattice into one hidden row")
    if top_k > V:
        raise UserError(f"selector_top_k {top_k} exceeds the vocabulary ({V} tokens)")
    names = {}
    for which in ("predecessor_codebook", "successor_codebook"):
        base = f"candidate_selector.{which}"
        name = next((n for n in (base, base + ".weight") if need.has(n)), base)
        shape = need.shape(name) if need.has(name) else None
        if shape is not None and shape != (V, rank):
            raise UserError(f"{name} has shape {list(shape)} but the pinned runtime's selector needs "
                            f"[{V}, {rank}] (vocab_size x selector_rank): unknown selector layout")
        names[which] = name
    hidden = "candidate_selector.hidden_projection.weight"
    if need.has(hidden) and need.shape(hidden) != (rank, H):
        raise UserError(f"{hidden} has shape {list(need.shape(hidden))} but the pinned runtime's selector "
                        f"needs [{rank}, {H}] (selector_rank x hidden_size): unknown selector layout")
    plan.tensor("selector_predecessor.weight", need(names["predecessor_codebook"], (V, rank)))
    plan.tensor("selector_successor.weight", need(names["successor_codebook"], (V, rank)))
    plan.tensor("selector_hidden.weight", need(hidden, (rank, H)))


def _to_neox(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Interleaved RoPE rows (pairs 2i, 2i+1) -> NeoX halves, per head: even dims, then odd."""
    shape = w.shape
    return np.ascontiguousarray(w.reshape(-1, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape))


def _own_table(need, target, name: str, target_name: str, shape, fallback: bool):
    """A [V, H] table for --head own: the checkpoint's, else (community layouts, whose tables are
    the target's anyway) the target GGUF's."""
    if need.has(name) or not fallback:
        return need(name, shape)
    table = target_tensor(target, target_name)
    if table is None and target_name == "output.weight":
        table = target_tensor(target, "token_embd.weight")  # a tied target
    if table is None or tuple(table.shape) != tuple(shape):
        raise UserError(f"the checkpoint has no {name} and the target has no usable {target_name}: "
                        "use --head shared")
    return table


def _patch_row(row: int, values: np.ndarray):
    """A transform that replaces one row of a [V, H] table (the mask token's embedding)."""
    def patch(w: np.ndarray) -> np.ndarray:
        w = np.array(w, dtype=np.float32)
        w[row] = values
        return w
    return patch


def _mask_embedding(weights: Weights, config: dict, mask: int, H: int, V: int):
    """The mask token's own embedding from `mask_embedding.pt` (MiMo-style drafts), or None."""
    directory = getattr(weights, "directory", None)
    path = None if directory is None else directory / "mask_embedding.pt"
    if path is None or not path.is_file():
        return None
    data = read_pt(path)
    got_id, vector = data.get("mask_token_id"), data.get("embedding")
    if isinstance(got_id, np.ndarray) and got_id.size == 1:
        got_id = int(got_id.reshape(-1)[0])
    if not isinstance(got_id, int) or isinstance(got_id, bool) or got_id != mask:
        raise UserError(f"mask_embedding.pt is for mask token {got_id!r:.20} but the config's mask_token_id "
                        f"is {mask}: the side file belongs to another draft")
    if not isinstance(vector, np.ndarray) or vector.dtype.kind != "f" or vector.shape != (H,):
        shape = list(vector.shape) if isinstance(vector, np.ndarray) else type(vector).__name__
        raise UserError(f"mask_embedding.pt embedding has shape {shape}, expected [{H}] (the hidden size)")
    if not 0 <= mask < V:
        raise UserError(f"mask_embedding.pt mask token {mask} is outside the vocabulary ({V} tokens)")
    if not np.all(np.isfinite(vector)):
        raise UserError("mask_embedding.pt embedding holds NaN/Inf values: the file is damaged")
    return vector.astype(np.float32)


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


def _first(weights: Weights, *names):
    return next((n for n in names if n in weights), None)


class _Need:
    """Fetch checkpoint tensors by name with shape/dtype checks; remember which were used.
    Names are DeepSpec's (`fc.weight`, `layers.0...`); checkpoints that keep them under a
    `model.` prefix (some DFlash exports) are read the same way."""

    IGNORED = ("rotary_emb.", "t2d", "verifier_norm.", "verifier_lm_head.")  # training-only

    def __init__(self, weights: Weights):
        self.weights = weights
        self.used: set[str] = set()
        names = weights.names()
        self.prefix = "model." if names and "fc.weight" not in weights and "model.fc.weight" in weights else ""

    def full(self, name: str) -> str:
        return self.prefix + name

    def has(self, name: str) -> bool:
        return self.full(name) in self.weights

    def shape(self, name: str) -> tuple[int, ...]:
        if not self.has(name):
            raise UserError(f"checkpoint lacks tensor {name}: the weights are incomplete or not a "
                            "DFlash/DSpark draft")
        return tuple(self.weights[self.full(name)].shape)

    def take(self, name: str):
        """A tensor of any dtype (d2t), marked used."""
        self.used.add(self.full(name))
        return self.weights[self.full(name)]

    def skip(self, *names: str) -> None:
        """Tensors deliberately left out (with a warning elsewhere)."""
        self.used.update(self.full(n) for n in names if self.has(n))

    def __call__(self, name: str, shape: tuple[int, ...]):
        if not self.has(name):
            raise UserError(f"checkpoint lacks tensor {name}: the weights are incomplete or do "
                            "not match config.json")
        t = self.weights[self.full(name)]
        check_float_tensor(t, t.name, shape)
        self.used.add(t.name)
        return t

    def check_unused(self, warn) -> None:
        skipped = {self.full("embed_tokens.weight"), self.full("lm_head.weight")}  # --head shared leaves them out
        ignored = tuple(self.prefix + n for n in self.IGNORED) + self.IGNORED
        extra = [n for n in self.weights.names()
                 if n not in self.used and n not in skipped and not n.startswith(ignored)]
        if extra:
            raise UserError(f"checkpoint has tensors the converter does not know ({', '.join(extra[:3])}"
                            f"{', ...' if len(extra) > 3 else ''}): it is not a supported DFlash/DSpark layout")
