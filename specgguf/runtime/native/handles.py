"""Owned llama.cpp handles: `Model`, `Context`, `Batch` and `Grammar`, each freeing its C
resource exactly once."""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
import threading
import weakref
from functools import cached_property

import numpy as np

from ...errors import LlamaError, UserError
from ._bindings import (C, _batch_add_embd, _batch_add_token, _batch_set_embd_token, _batch_set_output, _batch_set_pos,
                        _Embd, _get_logits, _get_logits_ith, ext)
from .refkernels import reference_cpu_kernels
from .system import amx_verdict, default_threads, library_path

# --------------------------------------------------------------------------------------
# Owned handles
# --------------------------------------------------------------------------------------


class _Owned:
    """Base for objects that own one C pointer and free it exactly once.

    Ownership: a child (a context on a model, a batch on a context, a draft context linked
    to a target context through ctx_other) holds a reference to its parent, so the parent
    outlives it, and registers with it, so that closing the parent closes the child first.
    Every access goes through `ptr`, which raises a clear error once the handle is closed
    instead of handing llama.cpp a freed pointer; close() is idempotent."""

    _ptr = None

    def _free(self, ptr):  # pragma: no cover - overridden
        raise NotImplementedError

    def _adopt_by(self, parent: "_Owned") -> None:
        kids = parent.__dict__.setdefault("_children", weakref.WeakSet())
        kids.add(self)

    @property
    def ptr(self):
        if self._ptr is None:
            raise LlamaError(f"this {type(self).__name__.lower()} is closed (it was freed by close())")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        for child in list(self.__dict__.get("_children", ())):
            child.close()
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Model(_Owned):
    """A loaded GGUF model (weights and vocabulary)."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: int = 0, vocab_only: bool = False,
                 devices: list[int] | None = None, extra_bufts: bool = True):
        """extra_bufts=False: weights stay out of the CPU repack (and AMX) buffers, whose gemm
        takes rows in groups of 4 (docs/machines.md: batch invariance)."""
        params = C.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.vocab_only = bool(vocab_only)
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


class Context(_Owned):
    """An inference context (KV cache, compute buffers) on a `Model`. Its KV calls name one
    sequence (`seq`, 0 by default); a context made with n_seq_max > 1 holds that many, in one
    unified cache so that a batch mixing them is one pass (decoding/parallel.py)."""

    def __init__(self, model: Model, n_ctx: int = 4096, n_batch: int = 512, n_ubatch: int | None = None,
                 n_threads: int | None = None, n_outputs_max: int = 0, ctx_other: "Context | None" = None,
                 embeddings: bool = False, swa_full: bool = False, flash_attn: int | None = None,
                 mtp: bool = False, reference_kernels: bool = False, n_seq_max: int = 1,
                 n_outputs_max_per_seq: int | None = None):
        """n_outputs_max_per_seq: how many outputs of one sequence a pass may have when a sampler
        runs in the graph (`sample_in_graph`; llama.cpp's default allows 1).
        flash_attn: 0 off, 1 on, None llama.cpp's auto; a draft context (ctx_other given) left at
        None takes ctx_other's setting, as llama.cpp's speculative driver gives its draft the
        target's -fa (docs/loop.md §6.4)."""
        if flash_attn is None and ctx_other is not None:
            flash_attn = ctx_other.flash_attn
        params = C.llama_context_default_params()
        params.n_ctx = int(n_ctx)
        params.n_batch = int(n_batch)
        params.n_ubatch = int(n_ubatch or n_batch)
        params.n_seq_max = int(n_seq_max)
        # unified: a batch holding rows of several sequences, of any lengths, is one ubatch
        # (a split cache would cut it into equal shares per sequence, one pass each)
        params.kv_unified = n_seq_max > 1
        params.n_outputs_max = int(n_outputs_max)  # 0 = n_batch: always safe (docs/loop.md §6.1)
        threads = int(n_threads or default_threads())
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        if n_outputs_max_per_seq is not None:
            params.n_outputs_max_per_seq = int(n_outputs_max_per_seq)
        params.swa_full = bool(swa_full)
        params.embeddings = bool(embeddings)
        if flash_attn is not None:
            params.flash_attn_type = int(flash_attn)
        if ctx_other is not None:
            params.ctx_other = ctx_other.ptr
        if mtp:  # a multi-token-prediction draft context (e.g. gemma4-assistant, sharing ctx_other's KV)
            params.ctx_type = C.LLAMA_CONTEXT_TYPE_MTP
        if reference_kernels:  # the batch-invariant mode (reference_cpu_kernels below)
            params.op_offload = False  # a GPU build would otherwise run wide batches' matmuls there
            with reference_cpu_kernels() as caught:
                ptr = C.llama_init_from_model(model.ptr, params)
            if ptr and not caught:
                C.llama_free(ptr)
                raise LlamaError("the batch-invariant mode could not reach llama.cpp's CPU backend "
                                 f"in this build ({library_path()}); run without it")
        else:
            ptr = C.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise LlamaError(f"llama.cpp could not create a context for {model.path} "
                             f"(n_ctx={n_ctx}); try a smaller --ctx, or --verbose to see why")
        self._ptr = ptr
        self.model, self.other = model, ctx_other  # parents outlive the context
        self.flash_attn = flash_attn  # as asked (None: auto): a draft context beside this one takes it
        self._adopt_by(model)
        if ctx_other is not None:
            self._adopt_by(ctx_other)  # a draft context reads the target's: freed before it
        self._mem = C.llama_get_memory(ptr)
        # llama.cpp pads the cache (to 256 cells): the context honours the size asked for
        self.n_ctx = min(int(n_ctx), C.llama_n_ctx(ptr))
        self.n_batch = C.llama_n_batch(ptr)
        self.n_ubatch = C.llama_n_ubatch(ptr)
        self.n_vocab = model.n_vocab
        self._layer_inp: set[int] = set()
        # llama.cpp reserves one output row per sequence when it creates the context
        self.widest_outputs, self.cold = 1, False  # see _process
        self._logits_view = None  # (address, [rows, n_vocab] view) for logits_block
        self._logits_rows = {}  # address -> the [n_vocab] view there, for logits(i)
        # runner(fn): where llama_process runs (None: the calling thread). A draft context beside
        # a parallel target runs its passes on the target's decode thread (decoding/parallel.py).
        self.runner = None
        self._samplers: list = []  # sampler chains set with sample_in_graph: freed after the context

    def _free(self, ptr):
        C.llama_free(ptr)
        for chain in getattr(self, "_samplers", ()):
            C.llama_sampler_free(chain)
        self._samplers = []

    # -- backend sampling: measured by scripts/probe_backend_sampling.py, not used by the loop
    # (docs/loop.md §8: on the pinned build's CPU backend it is slower and its ids are not the
    # logits' arg-max)
    def sample_in_graph(self, seq: int = 0) -> None:
        """Arg-max in llama.cpp's graph for sequence `seq` (a greedy chain set with
        llama_set_sampler): after a pass, `sampled_token(i)` is each output's token and the
        logits are no longer copied out."""
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
        if not C.llama_set_sampler(self.ptr, seq, chain):
            C.llama_sampler_free(chain)
            raise LlamaError(f"llama.cpp refused a sampler in the graph for sequence {seq}")
        self._samplers.append(chain)

    def sampled_token(self, i: int) -> int:
        """The token the graph's sampler chose for output entry `i` of the last pass."""
        tok = C.llama_get_sampled_token_ith(self.ptr, i)
        if tok < 0:
            raise LlamaError(f"no sampled token for batch entry {i}")
        return int(tok)

    @property
    def mem(self):
        self.ptr  # noqa: B018  (raises once the context is closed)
        return self._mem

    def set_threads(self, n_threads: int, n_threads_batch: int | None = None) -> None:
        C.llama_set_n_threads(self.ptr, n_threads, n_threads_batch or n_threads)

    # -- evaluation ------------------------------------------------------------------------
    def decode(self, batch: "Batch") -> None:
        self._process(C.LLAMA_PROCESS_TYPE_DECODE, batch)

    def encode(self, batch: "Batch") -> None:
        self._process(C.LLAMA_PROCESS_TYPE_ENCODE, batch)

    def _process(self, kind: int, batch: "Batch") -> None:
        # the first pass with more outputs than any before grows llama.cpp's output buffer
        # (tens of MB for a wide vocabulary, touched page by page): its time says nothing
        # about that width's steady cost, so the cost model skips it (`cold`)
        self.cold = batch.n_outputs > self.widest_outputs
        if self.cold:
            self.widest_outputs = batch.n_outputs
        if self.runner is None:
            rc = C.llama_process(self.ptr, kind, batch.ptr)
        else:
            ptr, batch_ptr = self.ptr, batch.ptr
            rc = self.runner(lambda: C.llama_process(ptr, kind, batch_ptr))
        if rc != 0:
            raise LlamaError(_PROCESS_ERRORS.get(rc, f"llama_process failed with code {rc}"))

    def logits(self, i: int) -> np.ndarray:
        """A view of the logits of output entry `i` (valid until the next decode)."""
        addr = _get_logits_ith(self.ptr, i)
        row = self._logits_rows.get(addr)  # a sequential draft reads one row per step, mostly the same
        if row is None:
            if not addr:
                raise LlamaError(f"no logits for batch entry {i} (was its output flag set?)")
            if len(self._logits_rows) > 64:
                self._logits_rows.clear()
            row = self._logits_rows[addr] = self._view(addr, 1, self.n_vocab)[0]
        return row

    def argmax(self, i: int) -> int:
        return int(self.logits(i).argmax())

    def logits_block(self, n_rows: int) -> np.ndarray:
        """A view [n_rows, n_vocab] of the logits of the last decode's first n_rows outputs, in
        batch order when every entry asked for logits (valid until the next decode)."""
        addr = _get_logits(self.ptr)
        if not addr:
            raise LlamaError("no logits: the last decode asked for none")
        # a view per address, widened when more rows are asked for: building one costs ~20 us
        view = self._logits_view
        if view is None or view[0] != addr or len(view[1]) < n_rows:
            view = self._logits_view = (addr, self._view(addr, n_rows, self.n_vocab))
        return view[1][:n_rows]

    def synchronize(self) -> None:
        C.llama_synchronize(self.ptr)

    def outputs_read(self, committed: int = 0) -> None:
        """The caller is done with the last pass's outputs (a context shared by parallel
        sequences waits for that before its next pass: decoding/parallel.py); nothing here."""

    # -- KV cache -------------------------------------------------------------------------
    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        """Remove cells of sequence `seq` at positions [p0, p1) (p1 < 0: to the end)."""
        if not C.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise LlamaError(f"could not remove KV cells from position {p0}")

    def try_seq_rm(self, p0: int, seq: int = 0) -> bool:
        """Remove the cells at positions >= p0; False where the cache cannot (a recurrent
        state, which keeps no per-position cells), leaving it to the caller to clear."""
        return bool(C.llama_memory_seq_rm(self.mem, seq, p0, -1))

    def pos_max(self, seq: int = 0) -> int:
        return C.llama_memory_seq_pos_max(self.mem, seq)

    def pos_min(self, seq: int = 0) -> int:
        """The oldest position the cache still holds (-1: empty); a sliding-window cache
        forgets cells that fell out of the window."""
        return C.llama_memory_seq_pos_min(self.mem, seq)

    def can_resume_at(self, n: int, seq: int = 0) -> bool:
        """Whether the cache still holds what a decode at position n reads after the cells
        from n on are removed: every cell when the model attends to all of them, the last
        n_swa before n when its layers slide a window (llama-server's own check)."""
        if n <= 0:
            return True
        pos_min = self.pos_min(seq)
        return 0 <= pos_min <= max(0, n - self.model.n_swa)

    # -- saved states (the prompt cache beyond the live context) -----------------------
    def state_bytes(self, seq: int = 0) -> bytes:
        """Sequence `seq`'s cells (KV or recurrent state) as one byte string."""
        size = C.llama_state_seq_get_size(self.ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        n = C.llama_state_seq_get_data(self.ptr, buf, size, seq)
        if n != size:
            raise LlamaError(f"llama.cpp wrote {n} of {size} state bytes")
        return bytes(buf)

    def load_state_bytes(self, data: bytes, seq: int = 0) -> None:
        """Replace sequence `seq`'s cells by `data` from `state_bytes` of a context on the same model."""
        self.clear(seq)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if C.llama_state_seq_set_data(self.ptr, buf, len(data), seq) != len(data):
            self.clear(seq)
            raise LlamaError("llama.cpp could not restore a saved state (context too small?)")

    def clear(self, seq: int | None = None) -> None:
        """Empty the cache (seq None) or one sequence's cells."""
        if seq is None or C.llama_n_seq_max(self.ptr) == 1:
            C.llama_memory_clear(self.mem, True)
        else:
            C.llama_memory_seq_rm(self.mem, seq, -1, -1)

    # -- hidden-state handover (eagle3 / dflash / dspark) ------------------------------------
    def set_layer_input(self, layer: int, enabled: bool = True) -> None:
        """Ask llama.cpp to keep the input of target layer `layer` (before the first decode)."""
        ext.set_embeddings_layer_inp(self.ptr, layer, enabled)
        (self._layer_inp.add if enabled else self._layer_inp.discard)(layer)

    def layer_input(self, layer: int, n_rows: int) -> np.ndarray:
        """The last decode's inputs of `layer`, one row per batch entry (a copy)."""
        return self.layer_input_view(layer, n_rows).copy()

    def layer_input_view(self, layer: int, n_rows: int) -> np.ndarray:
        """The last decode's inputs of `layer` as a view of llama.cpp's buffer (valid until the
        next decode): what a caller that copies them elsewhere anyway reads."""
        if layer not in self._layer_inp:
            raise LlamaError(f"layer {layer} input was not enabled")  # else llama.cpp aborts
        ptr = ext.get_embeddings_layer_inp(self.ptr, layer)
        if not ptr:
            raise LlamaError(f"no layer input for layer {layer}")
        return self._view(ptr, n_rows, self.model.n_embd)

    def _view(self, addr: int, n_rows: int, width: int) -> np.ndarray:
        """[n_rows, width] float32 rows at address `addr`, a view; views are kept per address and
        width (building one costs a few us) and widened when more rows are asked for."""
        views = self.__dict__.setdefault("_views", {})
        view = views.get((addr, width))
        if view is None or len(view) < n_rows:
            if len(views) > 64:
                views.clear()
            buf = (ctypes.c_float * (int(n_rows) * int(width))).from_address(addr)
            view = views[(addr, width)] = np.frombuffer(buf, dtype=np.float32).reshape(int(n_rows), int(width))
        return view[:n_rows]

    def set_causal(self, causal: bool) -> None:
        C.llama_set_causal_attn(self.ptr, causal)

    def set_embeddings_nextn(self, value: bool, masked: bool = False) -> None:
        ext.set_embeddings_nextn(self.ptr, value, masked)

    def embeddings_nextn_ith(self, i: int, width: int, copy: bool = True) -> np.ndarray:
        """copy=False: a view, valid until the next decode."""
        row = self._view(self.embeddings_nextn_addr(i), 1, width)[0]
        return row.copy() if copy else row

    def embeddings_nextn_addr(self, i: int) -> int:
        """The address of output entry i's nextn row in llama.cpp's buffer (valid until the next
        decode), for Batch.add_embedding_at: a sequential draft step hands its state to the next
        step's batch without a numpy object in between."""
        addr = ext.get_embeddings_nextn_ith(self.ptr, i)
        if not addr:
            raise LlamaError(f"no nextn embedding for batch entry {i}")
        return addr

    def embeddings_nextn(self, n_rows: int, width: int, copy: bool = True) -> np.ndarray:
        """copy=False: a view, valid until the next decode."""
        ptr = ext.get_embeddings_nextn(self.ptr)
        if not ptr:
            raise LlamaError("no nextn embeddings")
        rows = self._view(ptr, n_rows, width)
        return rows.copy() if copy else rows

    def ctx_other(self):
        return ext.get_ctx_other(self.ptr)


_PROCESS_ERRORS = {
    1: "no KV cache slot for the batch: the context is full (use a larger --ctx)",
    2: "the computation was aborted",
    -1: "llama.cpp rejected the batch (invalid input: positions or sizes)",
    -2: "llama.cpp could not allocate memory for the batch",
    -3: "llama.cpp failed to compute the batch",
}


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
