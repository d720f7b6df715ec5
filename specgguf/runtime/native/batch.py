"""`Batch`: a `llama_batch_ext` bound to one context, filled with tokens or embeddings."""

from __future__ import annotations

import ctypes

import numpy as np

from ...errors import LlamaError
from ._bindings import (C, _batch_add_embd, _batch_add_token, _batch_set_embd_token, _batch_set_output, _batch_set_pos,
                        _Embd)
from .context import Context
from .owned import _Owned


class Batch(_Owned):
    """A `llama_batch_ext` bound to one context (its capacity is that context's n_batch)."""

    def __init__(self, ctx: Context):
        ptr = C.llama_batch_ext_init(ctx.ptr)
        if not ptr:
            raise LlamaError("llama_batch_ext_init failed")
        self._ptr = ptr
        self.ctx = ctx
        self._adopt_by(ctx)
        self.capacity = ctx.n_batch
        self.n_tokens = self.n_outputs = 0
        self._pos = (C.llama_pos * 4)()
        self._pos_addr = ctypes.addressof(self._pos)
        self._embd = _Embd(None, 1, 0)  # reused for every embedding row

    def _free(self, ptr):
        C.llama_batch_ext_free(ptr)

    def clear(self) -> "Batch":
        C.llama_batch_ext_clear(self.ptr)
        self.n_tokens = self.n_outputs = 0
        return self

    def add_token(self, token: int, pos: int, output: bool = False, seq: int = 0) -> int:
        ptr = self.ptr
        i = C.llama_batch_ext_add_token(ptr, seq, token)
        if i < 0:
            raise LlamaError(_ADD_ERRORS.get(i, f"could not add token {token} ({i})").format(token=token))
        self._pos[0] = pos
        C.llama_batch_ext_set_pos(ptr, i, self._pos)
        if output:
            C.llama_batch_ext_set_output_logits(ptr, i, True)
            self.n_outputs += 1
        self.n_tokens += 1
        return i

    def add_tokens(self, tokens, pos0: int, outputs: str = "none", seq: int = 0) -> None:
        """Add tokens of sequence `seq` at consecutive positions; outputs: 'none', 'last' or 'all'. The batch is
        opaque in the C API (one call per entry and field), so this is three plain-integer calls
        per token and nothing else."""
        ptr, pos, addr = self.ptr, self._pos, self._pos_addr
        add, set_pos, set_output = _batch_add_token, _batch_set_pos, _batch_set_output
        out_from = 0 if outputs == "all" else len(tokens) - 1 if outputs == "last" else len(tokens)
        for j, tok in enumerate(tokens):
            i = add(ptr, seq, tok)
            if i < 0:
                raise LlamaError(_ADD_ERRORS.get(i, f"could not add token {tok} ({i})").format(token=tok))
            pos[0] = pos0 + j
            set_pos(ptr, i, addr)
            if j >= out_from:
                set_output(ptr, i, True)
                self.n_outputs += 1
            self.n_tokens += 1

    def add_embedding(self, row: np.ndarray, pos: int, output: bool = False, token: int | None = None,
                      seq: int = 0) -> int:
        """Add an entry of sequence `seq` carrying an embedding row (and optionally a token id as well)."""
        row = np.ascontiguousarray(row, dtype=np.float32)
        return self._add_embd(row.ctypes.data, row.size, pos, output, token, seq)

    def add_embedding_at(self, addr: int, width: int, pos: int, output: bool = False, token: int | None = None,
                         seq: int = 0) -> int:
        """add_embedding for a float32 row of `width` given by its address (a row of llama.cpp's
        own buffers: Context.embeddings_nextn_addr). The batch copies the row now. A sequential
        draft step makes one entry per token; after the draft's pass a numpy object costs it
        tens of us on a cold cache (docs/loop.md §8)."""
        return self._add_embd(addr, width, pos, output, token, seq)

    def add_embeddings(self, rows: np.ndarray, pos0: int, output: bool = False, tokens=None) -> None:
        """One entry per row of `rows` at positions pos0, pos0 + 1, ... (with tokens[j] as
        well when tokens are given): add_embedding for each row, without a numpy row object
        per entry (batch reads the rows when they are added)."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if rows.ndim != 2:
            raise ValueError("rows must be a 2-D array")
        base, stride, width = rows.ctypes.data, rows.strides[0], rows.shape[1]
        for j in range(len(rows)):
            self._add_embd(base + j * stride, width, pos0 + j, output, None if tokens is None else tokens[j])

    def _add_embd(self, addr: int, width: int, pos: int, output: bool, token: int | None, seq: int = 0) -> int:
        ptr, embd = self.ptr, self._embd
        embd.data, embd.n_embd = addr, width
        if token is None:
            i = _batch_add_embd(ptr, seq, embd)
        else:
            i = _batch_add_token(ptr, seq, token)
            if i >= 0 and not _batch_set_embd_token(ptr, i, embd):
                raise LlamaError(f"embedding of width {width} rejected by the batch")
        if i < 0:
            raise LlamaError(_ADD_ERRORS.get(i, f"could not add embedding ({i})").format(token=token))
        p = self._pos
        p[0] = p[1] = p[2] = pos  # M-RoPE drafts read 4 positions per embedding
        p[3] = 0
        _batch_set_pos(ptr, i, self._pos_addr)
        if output:
            _batch_set_output(ptr, i, True)
            self.n_outputs += 1
        self.n_tokens += 1
        return i


_ADD_ERRORS = {
    -1: "the batch is full",
    -2: "token {token} is not in this model's vocabulary",
    -3: "invalid sequence id",
}
