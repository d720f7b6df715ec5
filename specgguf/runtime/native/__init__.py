"""The only package that touches ctypes: owned llama.cpp handles and the bindings we add.

llama-cpp-python binds llama.cpp's C API; its extended API (`src/llama-ext.h`: per-layer
input extraction, target layer ids of a draft) is C++ and exported under mangled names,
and llama-cpp-python binds only some of it. We bind the rest here, once, and fail with a
message that names the installed llama-cpp-python when a symbol is missing.

Every C resource has an owner (`Model`, `Context`, `Batch`) whose `close()` frees it exactly
once; they are context managers too. Return codes become `LlamaError`s. llama.cpp's own log is
silenced unless `set_verbose(True)` is called.

Modules, by job: `_bindings` (the C functions: llama-cpp-python's `C`, our `ext`, fast private
function objects, the log), one module per handle (`owned`: their base; `model`, `context`,
`batch`, `grammar`), `system` (threads,
quantisation, the build's facts, AMX, RPC and GPU devices), `refkernels` (the batch-invariant
mode's switch to ggml's reference CPU kernels). Callers import this package only.
"""

from ._bindings import LLAMA_CPP_PYTHON_VERSION, C, ext, set_verbose
from .batch import Batch
from .context import Context
from .grammar import Grammar
from .model import Model
from .refkernels import reference_cpu_kernels, reference_kernels_state
from .system import (FTYPES, amx_verdict, default_threads, devices, guard_llama_cpp_python, library_path,
                     local_gpu_devices, quantize, rpc_devices, supports_rpc, system_info)

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "C", "ext", "set_verbose", "Batch", "Context", "Grammar", "Model",
           "reference_cpu_kernels", "reference_kernels_state", "FTYPES", "amx_verdict", "default_threads", "devices",
           "guard_llama_cpp_python", "library_path", "local_gpu_devices", "quantize", "rpc_devices", "supports_rpc",
           "system_info"]
