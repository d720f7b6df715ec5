"""`Context`: an inference context (KV cache, compute buffers) on a `Model`, and the reads of
what a pass computed (logits, hidden states, layer inputs) as numpy views."""

from __future__ import annotations

import ctypes

import numpy as np

from ...errors import LlamaError
from ._bindings import C, _get_logits, _get_logits_ith, ext
from .model import Model
from .owned import _Owned
from .refkernels import reference_cpu_kernels
from .system import default_threads, library_path

_PROCESS_ERRORS = {
    1: "no KV cache slot for the batch: the context is full (use a larger --ctx)",
    2: "the computation was aborted",
    -1: "llama.cpp rejected the batch (invalid input: positions or sizes)",
    -2: "llama.cpp could not allocate memory for the batch",
    -3: "llama.cpp failed to compute the batch",
}


class Context(_Owned):
    """An inference context (KV cache, compute buffers) on a `Model`. Its KV calls name one
    sequence (`seq`, 0 by default); a context made with n_seq_max > 1 holds that many, in one
    unified cache so that a batch mixing them is one pass (decoding/sharedctx.py, decoding/slots.py)."""

    def __init__(self, model: Model, n_ctx: int = 4096, n_batch: int = 512, n_ubatch: int | None = None,
                 n_threads: int | None = None, n_outputs_max: int = 0, ctx_other: "Context | None" = None,
                 embeddings: bool = False, swa_full: bool = False, flash_attn: int | None = None,
                 mtp: bool = False, reference_kernels: bool = False, n_seq_max: int = 1,
                 n_outputs_max_per_seq: int | None = None, n_rs_seq: int = 0):
        """n_rs_seq: recurrent-state snapshots kept per sequence, so that a recurrent or hybrid
        model (qwen35, lfm2, nemotron_h, ...) can take back up to that many trailing tokens of its
        last pass like a KV trim (llama.cpp ignores it for archs without this rollback; 0: none;
        decoding/rollback.py).
        n_outputs_max_per_seq: how many outputs of one sequence a pass may have when a sampler
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
        params.n_rs_seq = int(n_rs_seq)
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
        # how this cache takes back positions: "trim" (KV cells), "snapshots" (a recurrent state
        # rolled back up to n_rs_seq tokens) or "checkpoint" (saved and restored: decoding/rollback.py)
        self.n_rs_seq = int(C.llama_n_rs_seq(ptr)) if model.recurrent and not mtp else 0
        # (common_context_can_seq_rm's answers; "none": no memory at all, nothing to take back)
        # an MTP context keeps a plain KV cache for the NextN layer, even on a hybrid model
        self.rollback = ("none" if not self._mem else "trim" if not model.recurrent or mtp
                         else "snapshots" if self.n_rs_seq else "checkpoint")
        # seq -> how many trailing positions a snapshot can take back now: the graph keeps the
        # states of the last pass's tokens only (slot s = s tokens back, s < its width), and one
        # rollback spends them until the sequence's next pass (llama_memory_recurrent::seq_rm)
        self._reach: dict[int, int] = {}
        self._one_seq = n_seq_max == 1
        self._layer_inp: set[int] = set()
        # llama.cpp reserves one output row per sequence when it creates the context
        self.widest_outputs, self.cold = 1, False  # see _process
        self._logits_view = None  # (address, [rows, n_vocab] view) for logits_block
        self._logits_rows = {}  # address -> the [n_vocab] view there, for logits(i)
        # runner(fn): where llama_process runs (None: the calling thread). A draft context beside
        # a parallel target runs its passes on the target's decode thread (decoding/sharedctx.py, decoding/slots.py).
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
    def decode(self, batch) -> None:
        self._process(C.LLAMA_PROCESS_TYPE_DECODE, batch)

    def encode(self, batch) -> None:
        self._process(C.LLAMA_PROCESS_TYPE_ENCODE, batch)

    def _process(self, kind: int, batch) -> None:
        # the first pass with more outputs than any before grows llama.cpp's output buffer
        # (tens of MB for a wide vocabulary, touched page by page): its time says nothing
        # about that width's steady cost, so the cost model skips it (`cold`)
        self.cold = batch.n_outputs > self.widest_outputs
        if self.cold:
            self.widest_outputs = batch.n_outputs
        ptr, batch_ptr = self.ptr, batch.ptr

        def process() -> int:
            # wait for the pass here, on the thread that ran it: a device backend computes
            # asynchronously, and the wait submits to its queue; left to the first logits read,
            # it would run on whichever thread reads, beside another context's pass on the same
            # device (Vulkan queues are not thread-safe: two slots hung on lavapipe). On the
            # CPU the pass is done already and this costs nothing
            rc = C.llama_process(ptr, kind, batch_ptr)
            C.llama_synchronize(ptr)
            return rc

        rc = process() if self.runner is None else self.runner(process)
        if rc != 0:
            raise LlamaError(_PROCESS_ERRORS.get(rc, f"llama_process failed with code {rc}"))
        if self._one_seq and self.rollback == "snapshots":
            self.note_pass(0, batch.n_tokens)  # a shared context's passes are noted by its sequences

    def note_pass(self, seq: int, n_tokens: int) -> None:
        """Sequence `seq` had `n_tokens` in the pass just run: its snapshots reach that far back."""
        if self.rollback == "snapshots":
            self._reach[seq] = min(n_tokens - 1, self.n_rs_seq)

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
        sequences waits for that before its next pass: decoding/sharedctx.py, decoding/slots.py); nothing here."""

    # -- KV cache -------------------------------------------------------------------------
    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        """Remove cells of sequence `seq` at positions [p0, p1) (p1 < 0: to the end)."""
        if not C.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise LlamaError(f"could not remove KV cells from position {p0}")
        self._reach.pop(seq, None)

    def try_seq_rm(self, p0: int, seq: int = 0) -> bool:
        """Remove the cells at positions >= p0; False where the cache cannot (a recurrent
        state, which keeps no per-position cells), leaving it to the caller to clear."""
        done = bool(C.llama_memory_seq_rm(self.mem, seq, p0, -1))
        if done:
            self._reach.pop(seq, None)
        return done

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
        back = self.pos_max(seq) + 1 - n
        if back > 0 and self.rollback != "trim" and back > self._reach.get(seq, 0):
            return False  # a recurrent state: only as far back as its snapshots reach
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
        self._reach.pop(seq, None)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if C.llama_state_seq_set_data(self.ptr, buf, len(data), seq) != len(data):
            self.clear(seq)
            raise LlamaError("llama.cpp could not restore a saved state (context too small?)")

    def partial_state_bytes(self, seq: int = 0) -> bytes:
        """Sequence `seq`'s recurrent (and sliding-window) state alone, without the full-attention
        KV cells: the checkpoint llama.cpp's own loop saves before a verify pass."""
        flags = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = C.llama_state_seq_get_size_ext(self.ptr, seq, flags)
        buf = (ctypes.c_uint8 * size)()
        n = C.llama_state_seq_get_data_ext(self.ptr, buf, size, seq, flags)
        if n != size:
            raise LlamaError(f"llama.cpp wrote {n} of {size} partial-state bytes")
        return bytes(buf)

    def load_partial_state_bytes(self, data: bytes, seq: int = 0) -> None:
        """Put back a `partial_state_bytes` checkpoint of sequence `seq`; its attention cells are
        left as they are (the caller removes those past the checkpoint)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        flags = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        self._reach.pop(seq, None)
        if C.llama_state_seq_set_data_ext(self.ptr, buf, len(data), seq, flags) != len(data):
            self.clear(seq)
            raise LlamaError("llama.cpp could not restore a recurrent-state checkpoint")

    def clear(self, seq: int | None = None) -> None:
        """Empty the cache (seq None) or one sequence's cells."""
        if seq is None or C.llama_n_seq_max(self.ptr) == 1:
            self._reach.clear()
            C.llama_memory_clear(self.mem, True)
        else:
            self._reach.pop(seq, None)
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
