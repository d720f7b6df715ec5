"""Shared by the hybrid writers (lfm2.py, qwen35.py): matrix quantisation and the counting
head, the same rules qwen3.py applies inline (kept there unchanged)."""

from __future__ import annotations

import numpy as np

from .qwen3 import head_for, successor

# never quantised, as llama.cpp's own quantiser (src/llama-quant.cpp) leaves them: ggml_ssm_conv
# takes an F32 kernel, and a type with 1-element blocks (F16, BF16) would otherwise convert them
KEEP_F32 = ("ssm_conv1d", "shortconv.conv.weight")


def quantise(weights: dict, quant: str | None) -> dict:
    """Store the 2-D matrices as `quant` (a GGML type name such as "Q8_0") by gguf's numpy
    quantiser; rows whose length the type's block does not divide, vectors, 1-row tensors and
    the conv kernels (KEEP_F32) stay F32 (llama.cpp's own quantiser leaves norms and small
    tensors F32 too)."""
    if quant is None:
        return weights
    import gguf
    from gguf import quants

    qtype = gguf.GGMLQuantizationType[quant]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    out = {}
    for k, v in weights.items():
        if (isinstance(v, np.ndarray) and v.ndim == 2 and v.shape[0] > 1 and v.shape[-1] % block == 0
                and not any(s in k for s in KEEP_F32)):
            out[k] = (quants.quantize(v, qtype), quant)
        else:
            out[k] = v
    return out


def file_type(quant: str | None) -> int:
    """general.file_type for weights stored as `quant` (llama.cpp prints it as the model's type):
    the LlamaFileType named MOSTLY_<quant>, or 0 (all F32) for F32 weights or a type it lacks."""
    if quant is None:
        return 0
    import gguf

    ft = getattr(gguf.LlamaFileType, f"MOSTLY_{quant}", None)
    return int(ft) if ft is not None else 0


def make_counting(weights: dict, n_vocab: int, out_projections: tuple[str, ...], mix: float) -> None:
    """Turn `weights` into a counting target in place: an untied head mapping each token to its
    successor (qwen3.successor) and every branch's output projection scaled by `mix`, so the
    layers only sometimes tip a near-tie of the head."""
    weights["output.weight"] = head_for(weights["token_embd.weight"], successor(n_vocab), 4.0)
    for k in weights:
        if k.endswith(out_projections):
            weights[k] = (weights[k] * mix).astype(np.float32)
