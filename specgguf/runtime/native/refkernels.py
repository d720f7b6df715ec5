"""ggml's reference CPU kernels for one llama.cpp context: the batch-invariant mode's switch."""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager


from ...errors import LlamaError
from .system import _ggml

# --------------------------------------------------------------------------------------
# ggml's reference CPU kernels for one llama.cpp context: the batch-invariant mode's switch.
#
# A CPU backend whose `use_ref` flag is set (ggml's `ggml_backend_cpu_set_use_ref`) computes
# flash attention with its vector path only (no split-KV single-token decode past 512 cells, no
# tiled path from 64 queries) and matrix products without the tiled K-quant kernel (taken from 8
# rows), so a position's logits no longer depend on how many positions its batch held
# (docs/machines.md, "Batch invariance"). ggml exports the setter, but llama.cpp creates its
# CPU backend inside `llama_init_from_model` and exposes no handle to it. So, for the duration
# of one context creation, the CPU device's `init_backend` entry (a function pointer in a
# writable static struct, `ggml_backend_device.iface`, slot 5 in the pinned ggml) is replaced by
# one that calls the original and sets the flag on what it returns; the entry is restored
# before the call returns. Each backend caught is checked with `ggml_backend_is_cpu`, and a
# context for which none was caught is refused, so a layout change in another ggml fails loudly
# instead of silently computing without the flag.
# --------------------------------------------------------------------------------------
GGML_BACKEND_DEVICE_TYPE_CPU = 0
INIT_BACKEND_SLOT = 5  # get_name, get_description, get_memory, get_type, get_props, init_backend
_INIT_BACKEND = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_ref_lock = threading.Lock()


class _RefKernelFunctions:
    """The ggml / ggml-cpu functions the switch needs (resolved through libllama, as `_ggml` does)."""

    def __init__(self):
        self.dev_by_type = _ggml("ggml_backend_dev_by_type", [ctypes.c_int], ctypes.c_void_p)
        self.is_cpu = _ggml("ggml_backend_is_cpu", [ctypes.c_void_p], ctypes.c_bool)
        self.set_use_ref = _ggml("ggml_backend_cpu_set_use_ref", [ctypes.c_void_p, ctypes.c_bool], None)


_ref_functions: _RefKernelFunctions | None = None


def _ref_kernel_functions() -> _RefKernelFunctions:
    global _ref_functions
    if _ref_functions is None:
        _ref_functions = _RefKernelFunctions()
    return _ref_functions


@contextmanager
def reference_cpu_kernels():
    """Within the block, every CPU backend llama.cpp creates computes with ggml's reference
    kernels; yields a list that receives each such backend (a caller checks it is not empty)."""
    g = _ref_kernel_functions()
    dev = g.dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    if not dev:
        raise LlamaError("the batch-invariant mode needs ggml's CPU device, and this build registers none")
    slots = (ctypes.c_void_p * (INIT_BACKEND_SLOT + 1)).from_address(dev)
    caught: list[int] = []
    with _ref_lock:
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


def reference_kernels_state() -> str:
    """"available", or why the batch-invariant mode cannot reach the reference kernels here."""
    try:
        g = _ref_kernel_functions()
    except LlamaError as exc:
        return f"unavailable ({exc})"
    return "available" if g.dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) else "unavailable: no CPU device registered"
