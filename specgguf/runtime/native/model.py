"""`Model`: a loaded GGUF (weights and vocabulary), the parent of every context on it."""

from __future__ import annotations

import ctypes
import os
import threading
from functools import cached_property

from ...errors import LlamaError, UserError
from ._bindings import C, ext
from .owned import _Owned
from .system import amx_verdict


class Model(_Owned):
    """A loaded GGUF model (weights and vocabulary)."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = 0, vocab_only: bool = False,
                 devices: list[int] | None = None, extra_bufts: bool = True, load_mtp: bool = False):
        """extra_bufts=False: weights stay out of the CPU repack (and AMX) buffers, whose gemm
        takes rows in groups of 4 (docs/machines.md: batch invariance).
        load_mtp: load the model's own multi-token-prediction (NextN) layers too, which an MTP
        context on this model runs (drafters/mtp.py: NextNDrafter); llama.cpp skips them otherwise."""
        params = C.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.vocab_only = bool(vocab_only)
        params.load_mtp = bool(load_mtp)
        if not extra_bufts or not vocab_only and amx_verdict().fallback:  # AMX kernels that crash on this CPU
            params.use_extra_bufts = False
        if devices is not None:  # where offloaded layers go (None: every GPU llama.cpp finds)
            self._devices = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)  # NULL-terminated
            params.devices = ctypes.addressof(self._devices)
        self.path = os.fspath(path)
        ptr = C.llama_model_load_from_file(self.path.encode(), params)
        if not ptr:
            raise UserError(f"llama.cpp could not load {self.path}; run with --verbose to see why "
                            "(a GGUF from a newer llama.cpp, or a damaged file)")
        self._ptr = ptr
        self._vocab = C.llama_model_get_vocab(ptr)  # owned by the model: reach it through `vocab`
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        self.n_embd = C.llama_model_n_embd(ptr)
        self.n_layer = C.llama_model_n_layer(ptr)
        self.n_swa = max(0, C.llama_model_n_swa(ptr))  # sliding-window width (0: every layer sees all)
        self.bos = C.llama_vocab_bos(self.vocab)
        self.eos = C.llama_vocab_eos(self.vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self.vocab))
        self.mask = C.llama_vocab_mask(self.vocab)  # -1 when the vocabulary has none
        self._local = threading.local()  # per thread: a piece buffer (the server's threads detokenize at once)
        self._eog_cache: dict[int, bool] = {}

    def _free(self, ptr):
        C.llama_model_free(ptr)

    @property
    def vocab(self):
        self.ptr  # noqa: B018  (raises once the model is closed)
        return self._vocab

    def meta(self, key: str) -> str | None:
        """A scalar metadata value as text (arrays are not readable this way)."""
        buf = ctypes.create_string_buffer(1024)
        n = C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def metadata(self) -> dict[str, str]:
        """Every metadata key with its value as text, as llama.cpp renders it (what
        llama_cpp.Llama.metadata holds)."""
        out = {}
        for i in range(C.llama_model_meta_count(self.ptr)):
            key, val = (self._meta_by_index(fn, i) for fn in (C.llama_model_meta_key_by_index,
                                                              C.llama_model_meta_val_str_by_index))
            if key is not None and val is not None:
                out[key] = val
        return out

    def _meta_by_index(self, fn, i: int) -> str | None:
        size = 1024
        while True:
            buf = ctypes.create_string_buffer(size)
            n = fn(self.ptr, i, buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def chat_template(self) -> str | None:
        tmpl = C.llama_model_chat_template(self.ptr, None)
        return tmpl.decode("utf-8", "replace") if tmpl else None

    @cached_property
    def recurrent(self) -> bool:
        """Whether the model keeps a recurrent state (Mamba, RWKV, hybrids such as qwen35):
        its memory cannot drop the last few positions, so rejected drafts cannot be undone."""
        return bool(C.llama_model_is_recurrent(self.ptr) or C.llama_model_is_hybrid(self.ptr))

    @cached_property
    def target_layer_ids(self) -> list[int]:
        """Target layers an eagle3/dflash draft reads ([] for ordinary models)."""
        n = ext.model_target_layer_ids_n(self.ptr)
        ids = ext.model_target_layer_ids(self.ptr)
        return [ids[i] for i in range(n)] if n and ids else []

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # front ends refuse this first, naming their argument
            raise UserError(f"the text is not valid UTF-8: character {exc.start} is a lone surrogate") from None
        cap = len(data) + 8
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise LlamaError(f"tokenization failed ({n})")
        # in slices: one list() of millions of ids holds the GIL for a fifth of a second, and the
        # server's event loop (its /health) waits that long; between slices other threads run
        out: list[int] = []
        for i in range(0, n, 1 << 16):
            out += buf[i:min(n, i + (1 << 16))]
        return out

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        buf = getattr(self._local, "piece_buf", None)
        if buf is None:
            buf = self._local.piece_buf = ctypes.create_string_buffer(256)
        n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens, special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        hit = self._eog_cache.get(token)
        if hit is None:
            hit = self._eog_cache[token] = bool(C.llama_vocab_is_eog(self.vocab, token))
        return hit

    def token_text(self, token: int) -> str:
        return C.llama_vocab_get_text(self.vocab, token).decode("utf-8", "replace")
