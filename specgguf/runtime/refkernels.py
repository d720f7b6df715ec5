"""ggml's reference CPU kernels for one llama.cpp context: the batch-invariant mode's switch.

A CPU backend whose `use_ref` flag is set (ggml's `ggml_backend_cpu_set_use_ref`) computes
flash attention with its vector path only (no split-KV single-token decode past 512 cells, no
tiled path from 64 queries) and matrix products without the tiled K-quant kernel (taken from 8
rows), so a position's logits no longer depend on how many positions its batch held
(docs/machines.md, "Batch invariance"). ggml exports the setter, but llama.cpp creates its
CPU backend inside `llama_init_from_model` and exposes no handle to it. So, for the duration
of one context creation, the CPU device's `init_backend` entry (a function pointer in a
writable static struct, `ggml_backend_device.iface`, slot 5 in the pinned ggml) is replaced by
one that calls the original and sets the flag on what it returns; the entry is restored
before the call returns. Each backend caught is checked with `ggml_backend_is_cpu`, and a
context for which none was caught is refused, so a layout change in another ggml fails loudly
instead of silently computing without the flag.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager
from pathlib import Path

from ..errors import LlamaError

GGML_BACKEND_DEVICE_TYPE_CPU = 0
INIT_BACKEND_SLOT = 5  # get_name, get_description, get_memory, get_type, get_props, init_backend
_INIT_BACKEND = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_lock = threading.Lock()


class _Ggml:
    """The few ggml / ggml-cpu functions the switch needs, from the loaded libllama's folder."""

    def __init__(self, libllama_path: str):
        folder = Path(libllama_path).parent
        registry = ctypes.CDLL(str(_first(folder, "ggml")))  # what llama.cpp asks for its CPU device
        cpu = ctypes.CDLL(str(_first(folder, "ggml-cpu")))
        self.dev_by_type = registry.ggml_backend_dev_by_type
        self.dev_by_type.argtypes, self.dev_by_type.restype = [ctypes.c_int], ctypes.c_void_p
        self.is_cpu = cpu.ggml_backend_is_cpu
        self.is_cpu.argtypes, self.is_cpu.restype = [ctypes.c_void_p], ctypes.c_bool
        self.set_use_ref = cpu.ggml_backend_cpu_set_use_ref
        self.set_use_ref.argtypes, self.set_use_ref.restype = [ctypes.c_void_p, ctypes.c_bool], None


def _first(folder: Path, stem: str) -> Path:
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
        if (folder / name).exists():
            return folder / name
    hits = sorted(folder.glob(f"*{stem}*"))
    if not hits:
        raise LlamaError(f"the batch-invariant mode needs {stem} beside libllama in {folder}, which has none")
    return hits[0]


_ggml: _Ggml | None = None


def functions(libllama_path: str) -> _Ggml:
    global _ggml
    if _ggml is None:
        try:
            _ggml = _Ggml(libllama_path)
        except (OSError, AttributeError) as exc:
            raise LlamaError(f"the batch-invariant mode needs ggml's CPU backend functions ({exc}); "
                             "this llama-cpp-python build does not export them") from None
    return _ggml


@contextmanager
def reference_cpu_kernels(libllama_path: str):
    """Within the block, every CPU backend llama.cpp creates computes with ggml's reference
    kernels; yields a list that receives each such backend (a caller checks it is not empty)."""
    g = functions(libllama_path)
    dev = g.dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if not dev:
        raise LlamaError("the batch-invariant mode needs ggml's CPU device, and this build registers none")
    slots = (ctypes.c_void_p * (INIT_BACKEND_SLOT + 1)).from_address(dev)
    caught: list[int] = []
    with _lock:
        original_ptr = slots[INIT_BACKEND_SLOT]
        original = _INIT_BACKEND(original_ptr)

        def init_backend(device, params):
            backend = original(device, params)
            if backend and g.is_cpu(backend):
                g.set_use_ref(backend, True)
                caught.append(backend)
            return backend

        hook = _INIT_BACKEND(init_backend)
        slots[INIT_BACKEND_SLOT] = ctypes.cast(hook, ctypes.c_void_p).value
        try:
            yield caught
        finally:
            slots[INIT_BACKEND_SLOT] = original_ptr
