"""llama-cpp-python's bindings of llama.cpp (`C`), the extended API it leaves unbound
(`ext`, C++ names), private fast function objects for the per-round calls, and llama.cpp's log."""

from __future__ import annotations

import ctypes
import sys


from ...errors import LlamaError

try:
    import llama_cpp as _llama_cpp_pkg
    from llama_cpp import llama_cpp as C
except Exception as exc:  # pragma: no cover - an install problem, reported as such
    raise ImportError(f"specgguf needs llama-cpp-python==0.3.36 ({exc})") from exc

LLAMA_CPP_PYTHON_VERSION = getattr(_llama_cpp_pkg, "__version__", "unknown")
_lib = C._lib

# --------------------------------------------------------------------------------------
# Logging: llama.cpp prints to stderr through a callback; we keep it quiet by default.
# --------------------------------------------------------------------------------------
_verbose = False


@C.llama_log_callback
def _log_callback(level, text, user_data):  # pragma: no cover - exercised with --verbose
    if _verbose and text:
        sys.stderr.write(text.decode("utf-8", "replace"))


def set_verbose(verbose: bool) -> None:
    """Show (True) or hide (False, the default) llama.cpp's own log on stderr."""
    global _verbose
    _verbose = bool(verbose)


C.llama_log_set(_log_callback, ctypes.c_void_p(0))
C.llama_backend_init()

# --------------------------------------------------------------------------------------
# llama-ext bindings (C++ names: plain first, then Itanium and MSVC manglings)
# --------------------------------------------------------------------------------------


class _Ext:
    """Lazily bound llama-ext functions; a missing symbol is a clear error, not a crash.
    Float buffers come back as plain addresses (c_void_p: an int), which Context._view turns
    into numpy views kept per address: no ctypes pointer object per call."""

    _TABLE = {
        "set_embeddings_layer_inp": (
            ["llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
             "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"],
            [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None),
        "get_embeddings_layer_inp": (
            ["llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
             "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"],
            [ctypes.c_void_p, ctypes.c_uint32], ctypes.c_void_p),
        "model_target_layer_ids": (
            ["llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model",
             "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z"],
            [ctypes.c_void_p], ctypes.POINTER(ctypes.c_int32)),
        "model_target_layer_ids_n": (
            ["llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model",
             "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z"],
            [ctypes.c_void_p], ctypes.c_uint32),
        "set_embeddings_nextn": (
            ["llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb",
             "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"],
            [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
        "get_embeddings_nextn": (
            ["llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context",
             "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"],
            [ctypes.c_void_p], ctypes.c_void_p),
        "get_embeddings_nextn_ith": (
            ["llama_get_embeddings_nextn_ith", "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
             "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z"],
            [ctypes.c_void_p, ctypes.c_int32], ctypes.c_void_p),
        "get_ctx_other": (
            ["llama_get_ctx_other", "_Z19llama_get_ctx_otherP13llama_context",
             "?llama_get_ctx_other@@YAPEAUllama_context@@PEAU1@@Z"],
            [ctypes.c_void_p], ctypes.c_void_p),
    }

    def __getattr__(self, name):
        if name not in self._TABLE:
            raise AttributeError(name)
        names, argtypes, restype = self._TABLE[name]
        for sym in names:
            try:
                fn = _lib[sym]  # a private function object: these argtypes are ours alone
            except AttributeError:
                fn = None
            if fn is not None:
                fn.argtypes, fn.restype = argtypes, restype
                setattr(self, name, fn)
                return fn
        raise LlamaError(
            f"the installed llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} does not export "
            f"{names[0]}; specgguf needs llama-cpp-python==0.3.36 "
            "(pip install --force-reinstall llama-cpp-python==0.3.36)")


ext = _Ext()


class _Embd(ctypes.Structure):
    """`struct llama_embd` with its data pointer as a plain address, so that a row of a numpy
    array is passed without building a ctypes pointer object per row."""
    _fields_ = [("data", ctypes.c_void_p), ("n_rows", ctypes.c_size_t), ("n_embd", ctypes.c_size_t)]


def _fast(name: str, argtypes, restype):
    """A private function object for `name` (llama-cpp-python's keeps its own argtypes) taking
    plain integers where it can: the per-token batch calls of every round go through these."""
    fn = _lib[name]
    fn.argtypes, fn.restype = argtypes, restype
    return fn


_VP, _I32 = ctypes.c_void_p, ctypes.c_int32
_batch_add_token = _fast("llama_batch_ext_add_token", [_VP, _I32, _I32], _I32)
_batch_add_embd = _fast("llama_batch_ext_add_embd", [_VP, _I32, _Embd], _I32)
_batch_set_embd_token = _fast("llama_batch_ext_set_embd_token", [_VP, _I32, _Embd], ctypes.c_bool)
_batch_set_pos = _fast("llama_batch_ext_set_pos", [_VP, _I32, _VP], ctypes.c_bool)  # const llama_pos *
_batch_set_output = _fast("llama_batch_ext_set_output_logits", [_VP, _I32, ctypes.c_bool], ctypes.c_bool)
_get_logits_ith = _fast("llama_get_logits_ith", [_VP, _I32], _VP)  # an address (int), or None
_get_logits = _fast("llama_get_logits", [_VP], _VP)
