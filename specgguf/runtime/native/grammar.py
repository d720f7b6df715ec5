"""`Grammar`: llama.cpp's GBNF grammar sampler on a model's vocabulary."""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile

import numpy as np

from ...errors import UserError
from ._bindings import C
from .model import Model
from .owned import _Owned


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class Grammar(_Owned):
    """llama.cpp's GBNF grammar sampler on a model's vocabulary (docs/structured-output.md).

    `allowed(ids)` says which tokens the grammar accepts next (llama_sampler_apply sets the
    others' logits to -inf); `accept(token)` advances it (only ever with an allowed token:
    llama.cpp aborts otherwise); `clone()` is an independent copy of the current state."""

    def __init__(self, model: Model, gbnf: str, root: str = "root"):
        # the parser prints its complaint to stderr itself (not through the log callback): catch
        # it there, so that it becomes the error's message instead of noise on the terminal
        with tempfile.TemporaryFile() as err:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                ptr = C.llama_sampler_init_grammar(model.vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            said = err.read(4096).decode("utf-8", "replace")
        if not ptr:
            why = next((line.split("error parsing grammar:", 1)[1].strip() for line in said.splitlines()
                        if "error parsing grammar:" in line), None)
            why = why or f"a syntax error, an undefined rule, left recursion, or no rule named {root!r}"
            raise UserError(f"llama.cpp's GBNF parser refused the grammar: {why}"[:400], param="grammar")
        self._init(model, ptr)

    def _init(self, model: Model, ptr) -> None:
        self._ptr, self.model = ptr, model
        self._adopt_by(model)
        self._buf = None

    def _free(self, ptr):
        C.llama_sampler_free(ptr)

    def clone(self) -> "Grammar":
        g = Grammar.__new__(Grammar)
        g._init(self.model, C.llama_sampler_clone(self.ptr))
        return g

    def accept(self, token: int) -> None:
        C.llama_sampler_accept(self.ptr, int(token))

    def allowed(self, ids=None) -> np.ndarray:
        """A bool per token of `ids` (None: the whole vocabulary, in id order)."""
        if ids is None:
            if self._buf is None:
                self._buf = np.zeros(self.model.n_vocab, dtype=_TOKEN_DATA)
                self._buf["id"] = np.arange(self.model.n_vocab, dtype=np.int32)
            buf = self._buf
            buf["logit"] = 0.0
        else:
            buf = np.zeros(len(ids), dtype=_TOKEN_DATA)
            buf["id"] = ids
        arr = C.llama_token_data_array(buf.ctypes.data_as(C.llama_token_data_p), buf.size, -1, False)
        C.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        return buf["logit"] == 0.0

    def allows(self, token: int) -> bool:
        return bool(self.allowed(np.array([token], dtype=np.int32))[0])
