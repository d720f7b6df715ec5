"""The keyword arguments of `SpecGGUF(...)`: llama_cpp.Llama's names where they apply, checked.

An app that swaps `Llama(model_path=..., n_ctx=..., ...)` for `SpecGGUF(...)` keeps its keywords.
Each of Llama's constructor keywords is one of three things here:

- honoured: mapped onto the target (model_path, n_ctx, n_threads, n_threads_batch, n_gpu_layers,
  n_batch, flash_attn (False by default, as in Llama; None: llama.cpp's auto),
  seed: the default seed of sampled requests, verbose, last_n_tokens_size: the
  penalties' window, logits_all: accepted, logprobs work either way, chat_format=None);
- accepted only at Llama's default value (LLAMA_DEFAULTS: llama.cpp runs with that default here,
  so saying it changes nothing); any other value is refused, never silently dropped;
- not a Llama keyword at all: TypeError, as Python itself answers an unknown keyword.

Every message names the Python argument (the CLI checks its own flags in cli/options.py).
"""

from __future__ import annotations

import os

from ..errors import RequestError

# Llama's default seed (LLAMA_DEFAULT_SEED) and -1 both mean "a random seed".
RANDOM_SEEDS = (-1, 0xFFFFFFFF)

# Llama keywords that SpecGGUF does not pass on: accepted at exactly these values only.
LLAMA_DEFAULTS = {
    "split_mode": 1, "main_gpu": 0, "tensor_split": None, "vocab_only": False, "use_mmap": True,
    "use_mlock": False, "kv_overrides": None, "n_ubatch": 512, "rope_scaling_type": -1, "pooling_type": -1,
    "attention_type": -1, "rope_freq_base": 0.0, "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0,
    "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0,
    "embedding": False, "offload_kqv": True, "op_offload": None, "swa_full": None, "no_perf": False,
    "lora_base": None, "lora_scale": 1.0, "lora_path": None, "numa": False, "chat_handler": None,
    "draft_model": None, "tokenizer": None, "type_k": None, "type_v": None, "spm_infill": False,
}

_HINTS = {
    "draft_model": "pass draft='ngram' (prompt lookup) or draft='draft.gguf' instead",
    "chat_handler": "SpecGGUF renders chats with the GGUF's own chat template",
}


def _bad(name: str, value, want: str, code: str = "invalid_value") -> RequestError:
    return RequestError(f"{name} must be {want} (got {value!r})"[:300], param=name, code=code)


def whole(name: str, value, low: int | None = None, none_ok: bool = False, extra=()):
    """`value` as a whole number >= low (None passes when none_ok); bool and float are refused."""
    if value is None and none_ok:
        return None
    want = "a whole number" + (f" >= {low}" if low is not None else "") + (" or None" if none_ok else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, value, want, "invalid_type")
    if value in extra:
        return value
    if low is not None and value < low:
        raise _bad(name, value, want)
    return value


def number(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _bad(name, value, f"a number in [{low}, {high}]",
                   "invalid_type" if not isinstance(value, (int, float)) or isinstance(value, bool) else "invalid_value")
    return float(value)


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, value, "True or False", "invalid_type")
    return value


def path_like(name: str, value):
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _bad(name, value, "a path to a GGUF file", "invalid_type")
    return value


def as_value_error(exc: Exception) -> Exception:
    """A UserError from loading (bad n_ctx, missing file, ...) as a RequestError, which is a
    ValueError too (what llama_cpp.Llama raises), keeping its message and the argument it names."""
    if isinstance(exc, ValueError):
        return exc
    return RequestError(str(exc), param=getattr(exc, "param", None))


def check_extra(options: dict) -> None:
    """Refuse what SpecGGUF does not honour among the keywords it does not name itself."""
    for name, value in options.items():
        if name in LLAMA_DEFAULTS:
            default = LLAMA_DEFAULTS[name]
            if value == default and type(value) is type(default):
                continue
            hint = _HINTS.get(name, f"SpecGGUF runs llama.cpp's default ({default!r}); leave it out")
            raise RequestError(f"{name}={value!r} is not supported by SpecGGUF: {hint}"[:300], param=name,
                               code="unsupported_parameter")
        if name in _HINTS:
            raise RequestError(f"{name} is not supported by SpecGGUF: {_HINTS[name]}", param=name,
                               code="unsupported_parameter")
        raise TypeError(f"SpecGGUF() got an unexpected keyword argument {name!r}")


MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS: past it llama.cpp aborts (GGML_ASSERT, or std::bad_alloc)
MAX_BATCH = 1 << 20  # n_batch: llama.cpp uses min(n_batch, n_ctx), held in a uint32
MAX_CTX = 1 << 24  # n_ctx: 16M tokens, beyond any model's trained context (checked against it too)


def check_resources(n_ctx, n_threads, n_threads_batch, n_batch) -> None:
    """Upper bounds on what llama.cpp allocates per unit (threads, batch, context): a value
    past them aborts the process inside llama.cpp instead of raising, so it is refused here
    (the lower bounds and the trained context are checked where the target loads)."""
    for name, value, limit in (("n_threads", n_threads, MAX_THREADS), ("n_threads_batch", n_threads_batch,
                                                                        MAX_THREADS),
                               ("n_batch", n_batch, MAX_BATCH), ("n_ctx", n_ctx, MAX_CTX)):
        if value is None:
            continue
        whole(name, value, 0 if name == "n_ctx" else 1)
        if value > limit:
            raise RequestError(f"{name} must be at most {limit} (got {value})", param=name, code="invalid_value")


def check_init(target, model_path, draft, draft_max, draft_kind, draft_p_min, n_threads_batch, n_batch, seed,
               verbose, chat_format, last_n_tokens_size, logits_all, flash_attn):
    """Check the named constructor arguments (n_ctx, n_threads and n_gpu_layers are the target's
    to check: target.check_settings); returns (target path or None, seed or None)."""
    from ..drafters import KINDS, DraftSpec

    if target is not None and model_path is not None:
        raise RequestError("give the target once: target or model_path, not both", param="model_path")
    target = target if target is not None else model_path
    if target is not None:
        path_like("model_path" if model_path is not None else "target", target)
    if draft is not None and not isinstance(draft, DraftSpec):
        path_like("draft", draft)
    if draft_max != "auto":
        whole("draft_max", draft_max, 1)
    if draft_kind is not None and draft_kind not in KINDS:
        raise _bad("draft_kind", draft_kind, "None or one of " + ", ".join(KINDS))
    if draft_kind is not None and draft_kind != "ngram" and draft is None:
        raise RequestError(f"draft_kind={draft_kind!r} needs a draft GGUF: pass draft='draft.gguf'", param="draft")
    number("draft_p_min", draft_p_min, 0.0, 1.0)
    whole("n_threads_batch", n_threads_batch, 1, none_ok=True)
    whole("n_batch", n_batch, 1)
    seed = whole("seed", seed, 0, none_ok=True, extra=RANDOM_SEEDS)
    flag("verbose", verbose)
    flag("logits_all", logits_all)
    if flash_attn is not None:
        flag("flash_attn", flash_attn)
    whole("last_n_tokens_size", last_n_tokens_size, 0)
    if chat_format is not None:
        raise RequestError(f"chat_format={chat_format!r} is not supported: SpecGGUF renders chats with the "
                           "GGUF's own chat template (or a plain transcript when it has none); leave "
                           "chat_format out", param="chat_format", code="unsupported_parameter")
    return target, None if seed in RANDOM_SEEDS else seed
