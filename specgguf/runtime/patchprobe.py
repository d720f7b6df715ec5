"""Does the loaded libllama carry specgguf's eagle3 patches (specgguf.patches; `specgguf build-llama --patched`)?

DeepSpec Eagle3 drafts read 5 target layers and normalise q/k per head (patches 0001, 0002),
and the Gemma-4 ones also have Gemma's decoder layer (0003, docs/patches.md); the stock eagle3
loader refuses all of it. The patches add no symbol to look for, so we ask the library itself:
a tiny eagle3 GGUF with 5 target layers and q/k norm tensors (plus, for `gemma=True`, the
Gemma-4 layer's keys and tensors) is loaded in a *subprocess* (a library that misbehaves on it
must never take the user's process down). Two levels, because a build made with 0001-0002
alone still runs Qwen3 drafts. Each answer is cached per library file (path, mtime, size) and
level in the user cache, so a probe runs once per install, not once per run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import cache_dir, read_json, write_json

BUILD_COMMAND = "specgguf build-llama --patched"  # building.command(); --cuda/--metal/--cpu pick the backend
PROBE_LAYERS = (1, 2, 3, 4, 5)  # 5, as DeepSpec reads: != 3 is what the stock loader refuses
_memo: dict[str, bool] = {}

# Loads the probe with the same libllama (LLAMA_CPP_LIB_PATH) and reports by exit code:
# 0 loaded (patched), 3 refused (stock). llama.cpp's own log goes to the null stderr.
_CHILD = """
import sys
from llama_cpp import llama_cpp as C
C.llama_backend_init()
m = C.llama_model_load_from_file(sys.argv[1].encode(), C.llama_model_default_params())
sys.exit(0 if m else 3)
"""


def cache_file() -> Path:
    return cache_dir(create=False) / "eagle3-patch.json"


def _key(lib: str, gemma: bool) -> str | None:
    try:
        st = os.stat(lib)
    except OSError:
        return None
    return f"{os.path.realpath(lib)}|{st.st_mtime_ns}|{st.st_size}{'|gemma4' if gemma else ''}"


def has_eagle3_patch(lib: str | None = None, gemma: bool = False) -> bool:
    """True when `lib` (default: the libllama this process loaded) runs K-layer eagle3
    drafts with q/k norms and, with `gemma`, the Gemma-4 layer too. SPECGGUF_EAGLE3_PATCHED=0/1
    overrides the probe (tests, or a library the probe cannot run)."""
    forced = os.environ.get("SPECGGUF_EAGLE3_PATCHED")
    if forced in ("0", "1"):
        return forced == "1"
    if lib is None:
        from . import native

        lib = native.library_path()
    key = _key(lib, gemma) if lib else None
    if key is None:
        return False
    if key in _memo:
        return _memo[key]
    cached = _read_cache()
    if key in cached:
        _memo[key] = bool(cached[key])
        return _memo[key]
    answer = _probe(lib, gemma) if gemma else _probe(lib)
    if answer is not None:  # a crash or timeout is not an answer: do not remember it
        _memo[key] = answer
        cached[key] = answer
        _write_cache(cached)
    return bool(answer)


def _probe(lib: str, gemma: bool = False) -> bool | None:
    from ..synthetic.qwen3 import DraftShape, QwenShape, write_eagle3

    with tempfile.TemporaryDirectory(prefix="specgguf-probe-") as tmp:
        path = Path(tmp) / "probe-eagle3.gguf"
        target = QwenShape(n_layer=6, n_embd=32, n_merges=8)
        shape = DraftShape(n_head=2, n_head_kv=1, head_dim=16, n_ff=32, n_embd=32)
        write_eagle3(path, target, layers=PROBE_LAYERS, shape=shape, qk_norm=True, gemma_layer=gemma)
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": os.path.dirname(os.path.realpath(lib))}
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], env=env, timeout=120,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return {0: True, 3: False}.get(proc.returncode)


def _read_cache() -> dict:
    return read_json(cache_file())


def _write_cache(data: dict) -> None:
    write_json(cache_file(), data)
