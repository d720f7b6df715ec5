"""Where a checkpoint is, what its config says, and which kind of draft it is.

A checkpoint is given as a local directory or as a Hugging Face repo id. Repo ids go
through `huggingface_hub` so that its cache (~/.cache/huggingface) and progress bars are
the ones users already know; without network, a cached copy is used, and a missing one
becomes a one-line error that says what to do.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from specgguf.errors import UserError, missing_path

# DeepSpec model classes (docs/gguf-formats.md §1) and the llama.cpp arch they become.
DEEPSPEC_DSPARK = {"Qwen3DSparkModel": "qwen3", "Gemma4DSparkModel": "gemma4"}
# Other DFlash-family exports the pinned converter maps to arch `dflash` (conversion/qwen.py,
# DFlashModel and DSparkModel), by layout (docs/gguf-formats.md §8): all Qwen3-style blocks.
COMMUNITY_DFLASH = {
    "DSparkDraftModel": "specforge",  # SpecForge / SGLang: DeepSpec weights, keys in dflash_config
    "DSparkSpeculator": "speculators",  # vLLM speculators: nested transformer_layer_config
    "Lfm2DSparkDraftModel": "lfm2",  # LiquidAI: interleaved RoPE, keys in dflash_config
    "LingDSparkModel": "ling",  # DeepSpec's Ling drafts: a Qwen3DSparkModel by another name
    "DFlashDraftModel": "zlab",  # z-lab DFlash: in-place slots, keys in dflash_config
    "DFlash2DraftModel": "dflash2",  # z-lab DFlash 2: + grouped dynamic conv and a top-K selector
}
DEEPSPEC_EAGLE3 = {"Qwen3Eagle3Model": "qwen3", "Gemma4Eagle3Model": "gemma4"}
# Standard EAGLE-3 exports that llama.cpp's own converter recognises (conversion/llama.py:17-30).
EAGLE3_ARCHS = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator",
                "Eagle3DraftModel"}

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# Only what a conversion reads: configs and safetensors weights (never optimizer state).
_ALLOW = ["*.json", "*.safetensors"]


@dataclass(frozen=True)
class Kind:
    """What a checkpoint is: its family, llama.cpp arch and backbone."""

    family: str  # "deepspec-dspark", "dflash" (community layouts), "deepspec-eagle3" or "eagle3"
    backbone: str  # "qwen3", "gemma4" or "llama"
    name: str  # shown to users: "dflash", "dspark", "dflash2", "eagle3", "deepspec-eagle3"
    layout: str = "deepspec"  # for family "dflash": a value of COMMUNITY_DFLASH


def locate(spec: str, *, offline: bool = False) -> Path:
    """A local checkpoint directory for `spec`: a path, or an HF repo id (downloaded)."""
    path = Path(spec).expanduser()
    if path.is_symlink() and not path.exists():
        raise UserError(missing_path(path, "checkpoint"))
    if path.exists():
        if not path.is_dir():
            raise UserError(f"checkpoint must be a directory with config.json and *.safetensors, "
                            f"not a file: {path}")
        return path
    if not _REPO_ID.match(spec) or spec.startswith((".", "/", "~")):
        raise UserError(f"checkpoint not found: {spec} (give a directory or a Hugging Face repo id "
                        "such as deepseek-ai/dspark_qwen3_8b_block7)")
    return _download(spec, offline=offline)


def _download(repo_id: str, *, offline: bool) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError,
                                            RepositoryNotFoundError)
    except ImportError:  # pragma: no cover - a dependency of specgguf
        raise UserError("huggingface_hub is not installed: pip install huggingface_hub, "
                        "or pass a local checkpoint directory") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_ALLOW, local_files_only=offline))
    except LocalEntryNotFoundError:
        raise UserError(f"cannot download {repo_id}: no network and no cached copy; connect, or "
                        "download it elsewhere (huggingface-cli download) and pass the directory") from None
    except GatedRepoError:
        raise UserError(f"{repo_id} is gated: accept its license on huggingface.co and log in "
                        "with `huggingface-cli login`") from None
    except RepositoryNotFoundError:
        raise UserError(f"no Hugging Face repo {repo_id} (or it is private): check the id, "
                        "see `specgguf models`") from None
    except OSError as exc:  # connection errors, disk full, ...
        raise UserError(f"cannot download {repo_id}: {str(exc).splitlines()[0][:160]}") from None


def load_config(directory: Path) -> dict:
    """The checkpoint's config.json, as a dict."""
    path = Path(directory) / "config.json"
    if path.is_symlink() and not path.exists():
        raise UserError(missing_path(path, "config file"))
    if not path.is_file():
        raise UserError(f"no config.json in {directory}: not a Hugging Face checkpoint directory "
                        "(it must hold config.json and model*.safetensors)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"config.json in {directory} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"config.json in {directory} is not a JSON object")
    return config


def detect_kind(config: dict) -> Kind:
    """Classify a draft checkpoint from `architectures` and, failing that, its DeepSpec keys."""
    archs = config.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UserError(f"config.json: architectures must be a list of class names, got {archs!r}")
    arch = archs[0] if archs else None
    if arch in DEEPSPEC_DSPARK:
        return _dspark_kind(config, DEEPSPEC_DSPARK[arch])
    if arch in COMMUNITY_DFLASH:
        return _community_kind(config, COMMUNITY_DFLASH[arch])
    if arch in DEEPSPEC_EAGLE3:
        return Kind("deepspec-eagle3", DEEPSPEC_EAGLE3[arch], "deepspec-eagle3")
    if arch in EAGLE3_ARCHS or ("draft_vocab_size" in config and config.get("num_hidden_layers") == 1):
        return Kind("eagle3", "llama", "eagle3")
    if arch is not None:  # a class we do not know: its backbone could be anything
        raise UserError(f"unknown checkpoint architecture {arch!r}: specgguf converts DeepSpec DFlash/"
                        "DSpark/Eagle3 (Qwen3DSparkModel, Gemma4DSparkModel, Qwen3Eagle3Model), "
                        "community DFlash/DSpark drafts (DSparkDraftModel, DSparkSpeculator, DFlashDraftModel, "
                        "DFlash2DraftModel, ...) and standard EAGLE-3 drafts (LlamaForCausalLMEagle3)")
    # No class name at all: DeepSpec keys still identify the family, model_type the backbone.
    model_type = str(config.get("model_type", ""))
    backbone = {"qwen3": "qwen3", "gemma4": "gemma4", "gemma4_text": "gemma4"}.get(model_type)
    family = ("deepspec-dspark" if {"target_layer_ids", "block_size", "mask_token_id"} <= config.keys()
              else "deepspec-eagle3" if {"target_layer_ids", "ttt_length"} <= config.keys() else None)
    if family is not None and backbone is None:
        raise UserError(f"checkpoint without architectures and with model_type {model_type or 'none'!r}: "
                        "DeepSpec drafts have a qwen3 or gemma4 backbone; set architectures in config.json")
    if family == "deepspec-dspark":
        return _dspark_kind(config, backbone)
    if family == "deepspec-eagle3":
        return Kind("deepspec-eagle3", backbone, "deepspec-eagle3")
    raise UserError("checkpoint config.json has no architectures and no DeepSpec keys: specgguf converts "
                    "DeepSpec DFlash/DSpark/Eagle3 and standard EAGLE-3 drafts")


def _dspark_kind(config: dict, backbone: str) -> Kind:
    rank = config.get("markov_rank") or 0
    return Kind("deepspec-dspark", backbone, "dspark" if rank else "dflash")


def _community_kind(config: dict, layout: str) -> Kind:
    flat = flatten(config)
    if layout == "dflash2" or method_value(flat, "conv_kernel_size") is not None:
        return Kind("dflash", "qwen3", "dflash2", layout)
    rank = method_value(flat, "markov_rank") or 0
    return Kind("dflash", "qwen3", "dspark" if rank else "dflash", layout)


# -- community DFlash/DSpark configs (read further by community.py) -------------------------

def flatten(config: dict) -> dict:
    """The config with a speculators `transformer_layer_config` merged over its top level."""
    nested = config.get("transformer_layer_config")
    method = config.get("dflash_config")
    if method is not None and not isinstance(method, dict):
        raise UserError(f"config.json: dflash_config must be an object, got {method!r:.60}")
    if nested is None:
        return config
    if not isinstance(nested, dict):
        raise UserError(f"config.json: transformer_layer_config must be an object, got {nested!r:.60}")
    keep = {k: config[k] for k in ("architectures", "_name_or_path") if k in config}
    return {**config, **nested, **keep}


def method_value(config: dict, key: str, default=None):
    """A draft setting: `dflash_config[key]`, else the top-level key, else `default`."""
    method = config.get("dflash_config") or {}
    if method.get(key) is not None:
        return method[key]
    if config.get(key) is not None:
        return config[key]
    return default


# Sizes and counts: a zero would divide by zero or describe an empty model.
_POSITIVE = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "draft_num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "num_global_key_value_heads", "head_dim",
    "global_head_dim", "vocab_size", "draft_vocab_size", "max_position_embeddings",
    "num_target_layers", "target_hidden_size",
})
_INT_MAX = 2**31 - 1  # GGUF stores these as 32-bit values; llama.cpp reads most as int32


def get_int(config: dict, key: str, *alts: str, default=None) -> int:
    """An integer hyper-parameter; a missing, non-integer or out-of-range one is a UserError
    (negative never, zero not for sizes and counts)."""
    for k in (key, *alts):
        if k in config and config[k] is not None:
            value = config[k]
            if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                    or int(value) != value):
                raise UserError(f"config.json: {k} must be an integer, got {value!r}")
            value = int(value)
            low = 1 if k in _POSITIVE else 0
            if not low <= value <= _INT_MAX:
                raise UserError(f"config.json: {k} is {value}, outside {low}..{_INT_MAX}: the config is damaged")
            return value
    if default is not None:
        return default
    raise UserError(f"config.json lacks {key}: the checkpoint config is incomplete")


def get_float(config: dict, key: str, default=None) -> float:
    """A positive, finite float hyper-parameter (epsilons, RoPE bases and factors)."""
    value = config.get(key, default)
    if value is None:
        raise UserError(f"config.json lacks {key}: the checkpoint config is incomplete")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"config.json: {key} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"config.json: {key} must be a positive finite number, got {value!r}")
    return float(value)


# RoPE numbers the converters read; each must be a positive finite number when present.
_ROPE_NUMBERS = ("rope_theta", "factor", "partial_rotary_factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings")


def rope_parameters(config: dict, layer_type: str = "full_attention") -> dict:
    """RoPE settings in transformers-5 (`rope_parameters`) or older (`rope_theta`) form."""
    for key in ("rope_parameters", "rope_scaling"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise UserError(f"config.json: {key} must be an object, got {config[key]!r}")
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]  # Gemma-style per-layer-type table
    params = dict(params)
    if "rope_theta" not in params and "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    for key in _ROPE_NUMBERS:
        if params.get(key) is not None:
            get_float(params, key)
    return params
