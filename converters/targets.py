"""Checks of a draft against the target GGUF it will run with (read by specgguf.runtime.ggufinfo).

They run before any weight is converted, so a wrong pairing costs a second, not a conversion.
"""

from __future__ import annotations

from specgguf.errors import UserError

# Target archs whose graph exposes per-layer inputs in the pinned llama.cpp (src/models/*.cpp
# that set t_layer_inp, mapped to arch names through src/llama-model.cpp). Any other target
# aborts the process on the first decode once extraction is enabled (llama-graph.cpp:1384).
FEEDING_ARCHS = frozenset({
    "bailingmoe3", "deepseek4", "gemma4", "gpt-oss", "hunyuan-dense", "hunyuan_vl", "lfm2", "llama",
    "llama-embed", "mimo2", "minimax-01", "minimax-m2", "muse-glimmer", "nanbeige", "nemotron_h",
    "nemotron_h_moe", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp",
})


def check_vocab(n_vocab: int, target, what: str) -> None:
    if not target.n_vocab:
        raise UserError(f"target GGUF {target.path.name} has no tokenizer: the draft needs the "
                        "target's tokenizer; use the target model's own GGUF")
    if n_vocab != target.n_vocab:
        raise UserError(f"{what} is {n_vocab} but the target GGUF has {target.n_vocab} tokens: "
                        "this draft was trained for a different target")


def check_width(width: int, target, what: str) -> None:
    if width != target.n_embd:
        raise UserError(f"{what} is {width} but the target's hidden size is {target.n_embd}: "
                        "pair the draft with the target it was trained on")


def check_target_layers(gguf_ids, target, *, allow_nextn: bool, shown=None) -> None:
    """llama.cpp ids must name layer inputs that exist (eagle3 may also name the final output)."""
    limit = target.n_layer + (1 if allow_nextn else 0)
    bad = [i for i in gguf_ids if not 0 <= i < limit]
    if bad:
        raise UserError(f"target layers {shown if shown is not None else list(gguf_ids)} do not fit a "
                        f"target with {target.n_layer} layers: pair the draft with its own target")


def warn_if_cannot_feed(target, warn) -> None:
    if target.arch not in FEEDING_ARCHS:
        warn(f"target arch {target.arch!r} cannot feed hidden states to eagle3/dflash drafts in the "
             "pinned llama.cpp (its graph exposes no layer inputs); this draft will not run with it")
