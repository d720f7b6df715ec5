"""Community DFlash/DSpark layouts: their configs read into one set of `dflash` settings.

The pinned llama.cpp converter (conversion/qwen.py: DFlashModel, DSparkModel) maps these
checkpoint classes to arch `dflash`; this module reads their configs the way it does and
refuses what the pinned runtime (src/models/dflash.cpp, common/speculative.cpp) cannot run.
The weights are DeepSpec's Qwen3-style names throughout, so deepspec.py writes the tensors;
docs/gguf-formats.md §8 has the table of layouts, keys and refusals.

- Settings may live in a nested `dflash_config` (SpecForge, LiquidAI, z-lab), which wins over
  the top level, or the backbone in a nested `transformer_layer_config` (vLLM speculators),
  which is merged over the top level.
- Target layers: `target_layer_ids` are layer *outputs* (+1 in GGUF, as for DeepSpec);
  speculators' `aux_hidden_state_layer_ids` are already layer *inputs* (written as they are).
- `sample_from_anchor`: an explicit key decides; without one, speculators exports reserve
  slot 0 for the bonus token (false), DFlash (z-lab) predicts in place (false), the other
  DSpark lineages sample from the anchor (true).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specgguf.errors import UserError

from .checkpoints import Kind, get_float, get_int, method_value


def _int(config: dict, key: str, default=None, low: int = 0):
    value = method_value(config, key)
    if value is None:
        return default
    where = "dflash_config." + key if (config.get("dflash_config") or {}).get(key) is not None else key
    got = get_int({where: value}, where)
    if got < low:
        raise UserError(f"config.json: {where} is {got}, below {low}: the config is damaged")
    return got


def _float(config: dict, key: str):
    value = method_value(config, key)
    if value is None:
        return None
    return get_float({key: value}, key)


def _bool(config: dict, key: str):
    value = method_value(config, key)
    if value is not None and not isinstance(value, bool):
        raise UserError(f"config.json: {key} must be true or false, got {value!r:.40}")
    return value


def _ids(value, key: str) -> list[int]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
        raise UserError(f"config.json: {key} must be a list of target layer numbers, got {value!r:.60}")
    if any(b <= a for a, b in zip(value, value[1:])):
        raise UserError(f"config.json: {key} {value} must be increasing")
    return list(value)


def zlab_default_layers(n_target: int, n_draft: int) -> list[int]:
    """z-lab's build_target_layer_ids: the layers a DFlash draft without target_layer_ids reads."""
    if n_draft == 1:
        return [n_target // 2]
    start, end = 1, n_target - 3
    return [int(round(start + i * (end - start) / (n_draft - 1))) for i in range(n_draft)]


@dataclass
class DFlashKeys:
    """What a community config says about the draft, in the pinned runtime's terms."""

    layout: str
    ids: list[int]  # as the checkpoint states them (shown in messages)
    gguf_ids: list[int]  # layer inputs: dflash.target_layers
    ids_are_inputs: bool
    mask: int
    block_size: int
    rank: int
    sample_from_anchor: bool
    n_target: int | None
    neox: bool = True
    causal: bool | None = None
    swa_window: int | None = None
    swa_pattern: list[bool] | None = None
    value_scale: float | None = None
    logit_scale: float | None = None
    softcap: float | None = None
    embed_scale: float | None = None
    runtime_block: int | None = None
    conv_kernel: int | None = None
    conv_group: int | None = None
    sel_rank: int | None = None
    sel_top_k: int | None = None

    @property
    def dflash2(self) -> bool:
        return self.sel_rank is not None


def read_keys(config: dict, kind: Kind, n_layer: int, warn) -> DFlashKeys:
    """Read and check a community config (already `flatten`ed) for the pinned dflash runtime."""
    layout = kind.layout
    speculators = "transformer_layer_config" in config or config.get("aux_hidden_state_layer_ids") is not None

    markov_type = method_value(config, "markov_head_type", "vanilla")
    rank = _int(config, "markov_rank", 0)
    if rank and markov_type != "vanilla":
        raise UserError(f"Markov head type {markov_type!r} is not supported by the pinned llama.cpp "
                        "(its dflash graph runs only 'vanilla' heads): this checkpoint cannot be converted")

    # -- target layers -----------------------------------------------------------------------
    method = config.get("dflash_config") or {}
    n_target = _int(config, "num_target_layers", None, low=1)
    if method.get("target_layer_ids") is not None:
        ids, inputs = _ids(method["target_layer_ids"], "dflash_config.target_layer_ids"), False
    elif config.get("aux_hidden_state_layer_ids") is not None:
        ids, inputs = _ids(config["aux_hidden_state_layer_ids"], "aux_hidden_state_layer_ids"), True
    elif config.get("target_layer_ids") is not None:
        ids, inputs = _ids(config["target_layer_ids"], "target_layer_ids"), False
    elif layout in ("zlab", "dflash2"):
        if n_target is None:
            raise UserError("config.json has neither target_layer_ids nor num_target_layers: the target "
                            "layers this DFlash draft reads cannot be known")
        ids, inputs = zlab_default_layers(n_target, n_layer), False
    else:
        raise UserError("config.json lacks target_layer_ids (a list of target layer numbers, at the top "
                        "level or in dflash_config)")
    if (ids[0] < 0) if inputs else (ids[0] < -1):
        raise UserError(f"config.json: target layer ids {ids} must be >= {0 if inputs else -1}")
    gguf_ids = list(ids) if inputs else [i + 1 for i in ids]

    mask = _int(config, "mask_token_id")
    if mask is None:
        raise UserError("config.json lacks mask_token_id (at the top level or in dflash_config): the "
                        "draft's masked slots cannot be filled")
    block_size = _int(config, "block_size", 16)
    if block_size < 2:
        raise UserError(f"config.json: block_size {block_size} must be at least 2")

    explicit = _bool(config, "sample_from_anchor")
    if explicit is not None:
        anchor = explicit
    else:
        anchor = not speculators and layout not in ("zlab", "dflash2")
    keys = DFlashKeys(layout, ids, gguf_ids, inputs, mask, block_size, rank, anchor, n_target)

    # -- runtime and attention keys ----------------------------------------------------------
    neox = _bool(config, "rope_is_neox_style")
    keys.neox = True if neox is None else neox
    keys.value_scale = _float(config, "attention_value_scale")
    keys.logit_scale = _float(config, "output_multiplier")
    cap = method_value(config, "final_logit_softcapping")
    if cap is not None:
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap):
            raise UserError(f"config.json: final_logit_softcapping must be a number, got {cap!r:.40}")
        keys.softcap = float(cap) if cap > 0 else None
    keys.embed_scale = _float(config, "input_embedding_scale")
    runtime_block = _int(config, "runtime_block_size", None)
    if runtime_block is not None:
        if not 2 <= runtime_block <= block_size:
            raise UserError(f"config.json: runtime_block_size {runtime_block} must lie in 2..block_size "
                            f"({block_size}): the draft cannot run blocks longer than it was trained on")
        keys.runtime_block = runtime_block
        if runtime_block < block_size:
            drafts = runtime_block if anchor else runtime_block - 1
            warn(f"the checkpoint recommends {runtime_block}-token blocks (runtime_block_size) although it "
                 f"was trained on {block_size}: run it with --draft-max {drafts}")
    _attention_layout(config, keys, n_layer, speculators)

    # -- DFlash 2 ------------------------------------------------------------------------------
    conv = {k: _int(config, k, None, low=1) for k in ("conv_kernel_size", "conv_group_size",
                                                       "selector_rank", "selector_top_k")}
    if layout == "dflash2" or any(v is not None for v in conv.values()):
        missing = [k for k, v in conv.items() if v is None]
        if missing:
            raise UserError(f"DFlash 2 checkpoint without {', '.join(missing)} in its config: the pinned "
                            "runtime needs all of conv_kernel_size, conv_group_size, selector_rank, selector_top_k")
        keys.conv_kernel, keys.conv_group = conv["conv_kernel_size"], conv["conv_group_size"]
        keys.sel_rank, keys.sel_top_k = conv["selector_rank"], conv["selector_top_k"]
        if anchor:
            raise UserError("DFlash 2 checkpoint with sample_from_anchor true: the pinned runtime's selector "
                            "walks in-place slots only (slot 0 holds the last token)")
        if rank:
            raise UserError("DFlash 2 checkpoint with a Markov head: the pinned runtime runs the selector "
                            "on plain DFlash logits only")
        if keys.conv_kernel > block_size:
            raise UserError(f"conv_kernel_size {keys.conv_kernel} exceeds block_size {block_size}: the "
                            "checkpoint is inconsistent")
    return keys


def _attention_layout(config: dict, keys: DFlashKeys, n_layer: int, speculators: bool) -> None:
    """Sliding-window layers and block causality, as the pinned converter writes them."""
    method = config.get("dflash_config") or {}
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layer:
            raise UserError(f"config.json: layer_types must list one type per draft layer ({n_layer}), "
                            f"got {types!r:.80}")
        other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")}, key=str)
        if other:
            raise UserError(f"draft with layer types {other}: the pinned dflash graph runs full and "
                            "sliding-window attention layers only")
    use_swa = bool(method.get("use_swa", False))
    window = method.get("swa_window_size") or config.get("sliding_window")
    if (config.get("use_sliding_window") or use_swa) and window:
        window = get_int({"sliding_window": window}, "sliding_window")
        if window < 1:
            raise UserError("config.json: sliding_window must be positive")
        keys.swa_window = window
        keys.swa_pattern = [True] * n_layer if use_swa else [t == "sliding_attention" for t in types or []]
        if not any(keys.swa_pattern):
            keys.swa_window, keys.swa_pattern = None, None
        elif len(keys.swa_pattern) != n_layer:
            raise UserError("config.json sets a sliding window but no layer_types: which draft layers "
                            "slide cannot be known")
    elif types and "sliding_attention" in types and speculators:
        window = config.get("sliding_window")
        if not window:
            raise UserError("config.json has sliding_attention layers but no sliding_window")
        keys.swa_window = get_int({"sliding_window": window}, "sliding_window")
        keys.swa_pattern = [t == "sliding_attention" for t in types]

    causal = config.get("is_causal")
    if causal is None:
        causal = method.get("causal", config.get("causal"))
    if causal is not None and not isinstance(causal, bool):
        raise UserError(f"config.json: causal must be true or false, got {causal!r:.40}")
    if causal is None and speculators and keys.swa_pattern:
        # speculators: full-attention layers are bidirectional, sliding ones causal unless
        # sliding_window_non_causal; llama.cpp has one causal switch for the whole block
        if not config.get("sliding_window_non_causal", False):
            if not all(keys.swa_pattern):
                raise UserError("draft mixes causal sliding-window layers with bidirectional full-attention "
                                "layers: the pinned runtime has one causal setting per draft, not per layer")
            causal = True
    keys.causal = causal
