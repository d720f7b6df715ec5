"""The target model: the GGUF whose output speculative decoding must reproduce."""

from __future__ import annotations

import threading

from . import native
from .compat import check_loadable
from ..errors import UserError
from .ggufinfo import GGUFInfo, read_gguf


class BusyError(UserError, RuntimeError):
    """A second generation was started on a context that is still generating in this thread
    (another thread's generation is waited for instead)."""


DEFAULT_CTX = 4096


def _whole(name: str, value, low: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"{name} must be {meaning} (got {value!r})", param=name)
    return value


def check_settings(info: GGUFInfo, n_ctx, n_threads, n_gpu_layers) -> int:
    """The context, thread and offload settings, refused (never clamped) when llama.cpp
    cannot honour them; returns the context size (None: the default; 0: the trained one)."""
    if n_threads is not None:
        _whole("n_threads", n_threads, 1, "a whole number >= 1 (None: all usable cores)")
    _whole("n_gpu_layers", n_gpu_layers, -1, "a whole number of layers >= 0 (-1: all)")
    trained = info.n_ctx_train
    if n_ctx is None:  # the default: 4096, or the trained context when that is smaller
        return min(DEFAULT_CTX, trained or DEFAULT_CTX)
    _whole("n_ctx", n_ctx, 0, "a whole number of tokens (0: the model's trained context)")
    if n_ctx == 0:
        return trained or 4096
    if n_ctx < 16:
        raise UserError(f"n_ctx must be at least 16 tokens (got {n_ctx})", param="n_ctx")
    if trained and n_ctx > trained:
        raise UserError(f"n_ctx {n_ctx} is larger than the {trained} tokens {info.path.name} was trained for: "
                        f"use at most {trained}", param="n_ctx")
    return n_ctx


def offload_devices(rpc_servers, n_gpu_layers: int) -> list[int] | None:
    """Where offloaded target layers go: None (llama.cpp's choice: this machine's GPUs), or the
    devices of the llama.cpp RPC servers in `rpc_servers` ('HOST:PORT,...') followed by this
    machine's GPUs, as llama.cpp's own --rpc orders them. Every server is greeted first
    (specgguf/runtime/rpc.py): llama.cpp would abort the process on one it cannot reach."""
    if rpc_servers is None:
        return None
    from . import rpc
    from .building import command

    endpoints = rpc.parse_endpoints(rpc_servers)
    if not native.supports_rpc():
        raise UserError(f"this llama.cpp build has no RPC backend (GGML_RPC): build one with "
                        f"`{command(patched=False, rpc=True)}` (add --patched for DeepSpec Eagle3 drafts)",
                        param="rpc_servers")
    if n_gpu_layers == 0:
        raise UserError("n_gpu_layers is 0, so no target layer would go to the RPC servers: give the number "
                        "of layers to offload (99 = all)", param="n_gpu_layers")
    for endpoint in endpoints:
        rpc.greet(endpoint)
    return native.rpc_devices(endpoints) + native.local_gpu_devices()


class Target:
    """A target GGUF with one context and one batch; owns all three (close() frees them)."""

    def __init__(self, path, n_ctx: int | None = None, n_batch: int = 512, n_threads: int | None = None,
                 n_gpu_layers: int = 0, info: GGUFInfo | None = None, rpc_servers=None,
                 flash_attn: bool | None = False, batch_invariant: bool = False, n_parallel: int = 1,
                 n_rs_seq: int = 0, load_mtp: bool = False):
        """batch_invariant: ggml's reference CPU kernels, flash attention on, no repacked weights,
        and `verify_width` measured (runtime/invariance.py); the target must run on the CPU.
        n_parallel: sequences the context holds at once, each with n_ctx cells of its own
        (decoding/sharedctx.py, decoding/slots.py drives them); 1: the one sequence of every other use.
        n_rs_seq: recurrent-state snapshots per sequence (a hybrid or recurrent target whose arch
        llama.cpp can roll back so: decoding/rollback.py); ignored for every other model.
        load_mtp: load the model's own MTP (NextN) layers, for a `--draft mtp` drafter."""
        self.info = info or read_gguf(path, "target")  # validated before llama.cpp sees it
        check_loadable(self.info, "target")
        n_ctx = check_settings(self.info, n_ctx, n_threads, n_gpu_layers)
        self.n_parallel = _whole("n_parallel", n_parallel, 1, "a whole number of sequences >= 1")
        if batch_invariant and (n_gpu_layers or rpc_servers):
            raise UserError("the batch-invariant mode runs the target on the CPU (ggml's reference kernels are a "
                            "CPU backend switch): drop --gpu-layers/--rpc, or the mode", param="batch_invariant")
        self.model = native.Model(self.info.path, n_gpu_layers=n_gpu_layers,
                                  devices=offload_devices(rpc_servers, n_gpu_layers),
                                  extra_bufts=not batch_invariant, load_mtp=load_mtp)
        try:
            # flash_attn: off by default, as llama_cpp.Llama has it (docs/machines.md: lossless past 512
            # cells on the CPU); None lets llama.cpp choose (auto); True forces it on. The batch-invariant
            # mode needs it on: its vector path is the one kernel that is the same at every width
            self.ctx = native.Context(self.model, n_ctx=n_ctx * n_parallel, n_batch=n_batch, n_threads=n_threads,
                                      flash_attn=1 if batch_invariant else None if flash_attn is None
                                      else int(flash_attn), reference_kernels=batch_invariant,
                                      n_seq_max=n_parallel, n_rs_seq=n_rs_seq)
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.close()
            raise
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = int(n_threads or native.default_threads())
        self.batch_invariant = batch_invariant
        self.kernels = "batch-invariant" if batch_invariant else None  # part of the cost profile's key
        # where offloaded layers run changes every cost: part of the cost profile's key
        self.rpc_servers = None
        if rpc_servers is not None:
            from . import rpc

            self.rpc_servers = rpc.parse_endpoints(rpc_servers)
        # one generation at a time on the one context: llama.cpp aborts (or silently mixes
        # two KV caches) when two decode on it at once
        self._lock = threading.Lock()
        self._owner: int | None = None
        self.active = None  # the generation holding the lock, if any
        # what the KV cache holds between generations is decoding/promptcache.py's to know
        # the widest verify batch whose logits equal one-token decoding's (None: not measured,
        # no limit): the batch-invariant mode's measurement, which the engine never exceeds
        self.verify_width: int | None = None
        if batch_invariant:
            from . import invariance

            try:
                self.verify_width = invariance.verify_width(self)
            except BaseException:
                self.close()
                raise

    def acquire(self, generation) -> None:
        """Hold the context for `generation`: wait while another thread's generation runs;
        refuse (BusyError) a second one started by the thread that already holds it, where
        waiting would never end (an unfinished stream() iterated beside another one)."""
        me = threading.get_ident()
        if not self._lock.acquire(blocking=False):
            if self._owner == me:
                raise BusyError("this model is already generating in this thread (an unfinished stream): "
                                "finish or close() that generation first; one generation at a time per model")
            self._lock.acquire()
        if self.ctx.closed:
            self._lock.release()
            raise UserError("the model was closed: create a new one to generate again")
        self._owner, self.active = me, generation

    def release(self) -> None:
        self._owner = self.active = None
        self._lock.release()

    @property
    def n_ctx(self) -> int:
        """The context window of one sequence."""
        return self.ctx.n_ctx // self.n_parallel

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def close(self) -> None:
        """Free the batch, context and model; waits for another thread's generation to end,
        and ends an unfinished one of this thread first."""
        lock = getattr(self, "_lock", None)
        if lock is not None:
            active = self.active
            if active is not None and self._owner == threading.get_ident():
                active.close("cancelled")  # runs its cleanup, which releases the lock
            with lock:
                self._close_handles()
        else:
            self._close_handles()

    def _close_handles(self) -> None:
        for name in ("batch", "ctx", "model"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
