"""The target model: the GGUF whose output speculative decoding must reproduce."""

from __future__ import annotations

from . import native
from .ggufinfo import GGUFInfo, read_gguf


class Target:
    """A target GGUF with one context and one batch; owns all three (close() frees them)."""

    def __init__(self, path, n_ctx: int = 4096, n_batch: int = 512, n_threads: int | None = None,
                 n_gpu_layers: int = 0, info: GGUFInfo | None = None):
        self.info = info or read_gguf(path, "target")  # validated before llama.cpp sees it
        self.model = native.Model(self.info.path, n_gpu_layers=n_gpu_layers)
        try:
            n_ctx = min(int(n_ctx), self.info.n_ctx_train or int(n_ctx))
            self.ctx = native.Context(self.model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.close()
            raise
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = int(n_threads or native.default_threads())

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special=add_special, parse_special=True)

    def close(self) -> None:
        for name in ("batch", "ctx", "model"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
