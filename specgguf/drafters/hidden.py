"""What eagle3, dflash and dspark drafts share: a draft context linked to the target
(`ctx_other`, which lends the target's embeddings and head when the draft has none), the
target's layer-input extraction switched on for the draft's layer ids, and features
gathered after every target decode (docs/loop.md §4.3-4.5)."""

from __future__ import annotations

import numpy as np

from ..runtime import native
from ..runtime.compat import check_hidden_state_pair
from .base import Drafter


class HiddenStateDrafter(Drafter):
    kind = "hidden"

    def __init__(self, info, target, n_threads: int | None = None, n_gpu_layers: int = 0,
                 p_min: float = 0.0, n_min: int = 0, shared=None):
        """shared: a model.SharedDraft when `target` is a slot of a parallel target: its model,
        and a context of this drafter's own whose passes run on the target's decode thread."""
        check_hidden_state_pair(target.info, info, self.kind, p_min)  # before llama.cpp sees the pair
        self.info, self.target = info, target
        self.p_min, self.n_min = float(p_min), int(n_min)
        self.shared_draft = shared
        self.model = native.Model(info.path, n_gpu_layers=n_gpu_layers) if shared is None else shared.use()
        try:
            # a slot's SeqContext lends the shared native context (the target's weights)
            other = getattr(target.ctx, "native", target.ctx)
            self.ctx = native.Context(self.model, n_ctx=target.n_ctx, n_batch=target.ctx.n_batch,
                                      n_threads=n_threads, ctx_other=other)
            if shared is not None:
                self.ctx.runner = target.pool.shared.run
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.close()
            raise
        self.layer_ids = self.model.target_layer_ids or list(info.target_layers)
        # Must happen before the target's first decode: the prompt's features are needed.
        for lid in self.layer_ids:
            target.ctx.set_layer_input(lid, True)

    def features(self, n_rows: int) -> np.ndarray:
        """[n_rows, K * n_embd_target]: the target layer inputs of the last target decode,
        one row per batch entry, layers side by side in the draft's order. One copy, from
        llama.cpp's buffers into a buffer this drafter reuses: valid until the next call."""
        tctx = self.target.ctx
        width = len(self.layer_ids) * tctx.model.n_embd
        buf = getattr(self, "_features", None)
        if buf is None or len(buf) < n_rows:
            buf = self._features = np.empty((max(n_rows, 64), width), dtype=np.float32)
        out = buf[:n_rows]
        np.concatenate([tctx.layer_input_view(lid, n_rows) for lid in self.layer_ids], axis=1, out=out)
        return out

    def describe(self) -> str:
        return (f"{self.kind} draft {self.info.path.name} reading target layers {self.layer_ids}"
                f"{' (own head)' if self.info.has_tensor('output.weight') else ' (target head)'}")

    reads_target = True  # features come from the target's passes
    reads_hidden = True  # ...from its layer inputs, extracted in every pass

    def reset(self) -> None:
        self.ctx.clear()

    def resume(self, n: int) -> int:
        # the cell at position p was written from the target's features at p alone
        if n <= 0 or not self.ctx.can_resume_at(n):
            self.reset()
            return 0
        self.ctx.seq_rm(n)
        return n

    def save(self):
        return self.ctx.state_bytes()

    def restore(self, state) -> bool:
        self.ctx.load_state_bytes(state)
        return True

    def rollback(self, pos: int) -> None:
        self.ctx.seq_rm(pos)

    def close(self) -> None:
        target = getattr(self, "target", None)
        if target is not None and not target.ctx.closed:
            for lid in getattr(self, "layer_ids", []):
                target.ctx.set_layer_input(lid, False)
        self._close_handles("batch", "ctx")
