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


def target_tensor(target, name: str):
    """A [rows, cols] float32 copy of one of the target GGUF's tensors (any ggml type numpy can
    decode), or None when it has no such tensor. Used where a draft must carry a table the
    checkpoint does not ship (a patched embedding table, --head own for drafts without one)."""
    if name not in target.tensors:
        return None
    import gguf
    import numpy as np

    try:
        reader = gguf.GGUFReader(target.path)
        t = next(t for t in reader.tensors if t.name == name)
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        values = gguf.quants.dequantize(np.asarray(t.data), qtype)
    except (NotImplementedError, ValueError, KeyError, StopIteration) as exc:
        raise UserError(f"cannot read {name} from the target GGUF ({str(exc)[:80] or type(exc).__name__}): "
                        "use a target GGUF with F32/F16/BF16/Q8_0/K-quant weights") from None
    rows = int(np.prod([int(d) for d in t.shape[1:]], dtype=np.int64)) if len(t.shape) > 1 else 1
    return np.ascontiguousarray(values.reshape(rows, int(t.shape[0])), dtype=np.float32)
