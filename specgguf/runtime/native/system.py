"""What this build and machine offer: threads, quantisation, system info, the AMX verdict,
the library's path, RPC and GPU devices, and a clean exit when llama.cpp aborts."""

from __future__ import annotations

import ctypes
import os
import sys


from ...errors import LlamaError, UserError
from .. import amx
from ._bindings import C, _lib

def default_threads() -> int:
    """Threads for decoding: the CPUs this process may use (llama.cpp's C++ default is the
    number of physical cores; on the 2-core machines we test on these agree)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------------------
# Quantisation (used for the benchmark's real plain draft and for K-quant conversions)
# --------------------------------------------------------------------------------------

FTYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10,
          "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16,
          "q5_k_m": 17, "q6_k": 18, "iq2_xxs": 19, "iq3_xxs": 23, "iq1_s": 24, "iq4_nl": 25,
          "bf16": 32}


def quantize(src: str | os.PathLike, dst: str | os.PathLike, ftype: str,
             allow_requantize: bool = False, n_threads: int = 0) -> None:
    """llama_model_quantize: write `src` re-encoded as `ftype` (e.g. 'q4_k_m') to `dst`."""
    if ftype not in FTYPES:
        raise UserError(f"unknown quantisation type {ftype!r}; use one of {', '.join(FTYPES)}")
    params = C.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = bool(allow_requantize)
    params.nthread = int(n_threads)
    rc = C.llama_model_quantize(os.fspath(src).encode(), os.fspath(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise LlamaError(f"llama_model_quantize failed for {src} -> {ftype} (code {rc}); "
                         "run with --verbose to see why")


def system_info() -> str:
    """llama.cpp's own line of backends and CPU features (`llama_print_system_info`)."""
    return (C.llama_print_system_info() or b"").decode("utf-8", "replace")


_amx_verdict: amx.Verdict | None = None


def amx_verdict() -> amx.Verdict:
    """Whether models load with the build's AMX buffers on this CPU (runtime/amx.py), decided
    once per process before the first model load."""
    global _amx_verdict
    if _amx_verdict is None:
        _amx_verdict = amx.decide(library_path(), system_info())
    return _amx_verdict


def guard_llama_cpp_python() -> None:
    """Make `llama_cpp.Llama` objects built in this process load as specgguf's models do: on a
    build whose AMX kernels crash here, without the extra buffers (tests and benchmarks that
    put specgguf beside `llama_cpp.Llama` call this; specgguf itself never needs it)."""
    if not amx_verdict().fallback or getattr(C.llama_model_default_params, "_specgguf_guard", False):
        return
    plain = C.llama_model_default_params

    def guarded():
        params = plain()
        params.use_extra_bufts = False
        return params

    guarded._specgguf_guard = True
    C.llama_model_default_params = guarded
    import llama_cpp  # the package re-exports the name: code calling llama_cpp.llama_model_default_params

    if getattr(llama_cpp, "llama_model_default_params", None) is plain:
        llama_cpp.llama_model_default_params = guarded


def library_path() -> str:
    """The libllama file this process loaded (profiles are keyed by it: a rebuilt library,
    CPU or GPU, has other costs)."""
    return getattr(_lib, "_name", "") or ""


# --------------------------------------------------------------------------------------
# RPC devices: llama.cpp's RPC backend (a GGML_RPC build) and `ggml-rpc-server` processes
# on other machines. specgguf/runtime/rpc.py greets each server first: llama.cpp aborts on one it
# cannot reach.
# --------------------------------------------------------------------------------------

_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type


def supports_rpc() -> bool:
    """True when the loaded libllama was built with GGML_RPC."""
    return bool(C.llama_supports_rpc())


def _ggml(name: str, argtypes, restype):
    fn = getattr(_lib, name, None)
    if fn is None:
        raise LlamaError(f"the loaded libllama does not export {name}; specgguf needs llama-cpp-python==0.3.36")
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def rpc_devices(endpoints: list[str]) -> list[int]:
    """The devices of the RPC servers at `endpoints` (HOST:PORT), in order, as handles for
    `Model(devices=...)`. They are not registered globally, so a draft model stays local."""
    reg = _ggml("ggml_backend_reg_by_name", [ctypes.c_char_p], ctypes.c_void_p)(b"RPC")
    if not reg:
        raise LlamaError("the loaded libllama has no RPC backend (it was built without GGML_RPC)")
    addr = _ggml("ggml_backend_reg_get_proc_address", [ctypes.c_void_p, ctypes.c_char_p],
                 ctypes.c_void_p)(reg, b"ggml_backend_rpc_add_server")
    if not addr:
        raise LlamaError("the loaded libllama's RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(addr)
    count = _ggml("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t)
    get = _ggml("ggml_backend_reg_dev_get", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p)
    _exit_on_abort()
    devices = []
    for endpoint in endpoints:
        server = add_server(endpoint.encode())
        if not server or not count(server):
            raise UserError(f"RPC server {endpoint} offers no devices", param="rpc_servers")
        devices += [get(server, i) for i in range(count(server))]
    return devices


def local_gpu_devices() -> list[int]:
    """This machine's GPUs as llama.cpp picks them by default: discrete ones, else integrated."""
    n = _ggml("ggml_backend_dev_count", [], ctypes.c_size_t)()
    get = _ggml("ggml_backend_dev_get", [ctypes.c_size_t], ctypes.c_void_p)
    kind = _ggml("ggml_backend_dev_type", [ctypes.c_void_p], ctypes.c_int)
    devs = [get(i) for i in range(n)]
    gpus = [d for d in devs if kind(d) == _DEV_GPU]
    return gpus or [d for d in devs if kind(d) == _DEV_IGPU][:1]


def backends() -> list[dict]:
    """llama.cpp's registered backends (ggml_backend_reg_*) in order: name and device names.
    A backend compiled in but with no usable device (Vulkan with no driver, or only a CPU-type
    Vulkan device not named in GGML_VK_VISIBLE_DEVICES) is listed with no devices."""
    count = _ggml("ggml_backend_reg_count", [], ctypes.c_size_t)
    get = _ggml("ggml_backend_reg_get", [ctypes.c_size_t], ctypes.c_void_p)
    name = _ggml("ggml_backend_reg_name", [ctypes.c_void_p], ctypes.c_char_p)
    n_dev = _ggml("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t)
    dev = _ggml("ggml_backend_reg_dev_get", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p)
    dev_name = _ggml("ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p)
    out = []
    for i in range(count()):
        reg = get(i)
        out.append({"name": (name(reg) or b"").decode("utf-8", "replace"),
                    "devices": [(dev_name(dev(reg, j)) or b"").decode("utf-8", "replace")
                                for j in range(n_dev(reg))]})
    return out


_DEV_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type


def devices() -> list[dict]:
    """Every device llama.cpp's loaded backends offer: name, description, kind, memory (MiB)."""
    n = _ggml("ggml_backend_dev_count", [], ctypes.c_size_t)()
    get = _ggml("ggml_backend_dev_get", [ctypes.c_size_t], ctypes.c_void_p)
    kind = _ggml("ggml_backend_dev_type", [ctypes.c_void_p], ctypes.c_int)
    name = _ggml("ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p)
    desc = _ggml("ggml_backend_dev_description", [ctypes.c_void_p], ctypes.c_char_p)
    memory = _ggml("ggml_backend_dev_memory", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                               ctypes.POINTER(ctypes.c_size_t)], None)
    out = []
    for i in range(n):
        d = get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(d, ctypes.byref(free), ctypes.byref(total))
        out.append({"name": (name(d) or b"").decode("utf-8", "replace"),
                    "description": (desc(d) or b"").decode("utf-8", "replace"),
                    "kind": _DEV_KINDS.get(kind(d), str(kind(d))), "memory_mib": total.value >> 20})
    return out


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_abort(message):  # pragma: no cover - runs only when llama.cpp gives up
    text = " ".join((message or b"").decode("utf-8", "replace").split())
    hint = " (an RPC server stopped or the network failed: restart it and run again)" if "RPC" in text else ""
    sys.stderr.write(f"error: llama.cpp stopped: {text}{hint}\n")
    sys.stderr.flush()
    os._exit(3)


def _exit_on_abort() -> None:
    """With RPC devices, a server that goes away mid-run makes llama.cpp abort the process
    from its network thread; end it with one line and exit code 3 instead of a core dump."""
    _ggml("ggml_set_abort_callback", [ctypes.c_void_p], ctypes.c_void_p)(ctypes.cast(_on_abort, ctypes.c_void_p))
