"""`mtp`: Gemma 4's multi-token-prediction assistant (arch `gemma4-assistant`) beside its target.

The assistant owns no KV cache: its context is an MTP context on `ctx_other` = the target's,
and its layers attend to the cache of the target's last sliding and last full layer. Each
draft step decodes one entry that carries both a token and a hidden state of the target's
width: first (id_last, h), where h is the target's post-final-norm state at the token before
id_last, then (drafted token, the assistant's own `nextn` output). All steps sit at position
pos0: the target's cache does not hold the drafted tokens, so they are never written.
After every target decode the target's states of all its rows are kept; `accept(k)` picks
row k, the state that predicted the token the target sampled next. This is the gemma4
(shared-memory) path of llama.cpp's draft-mtp (common/speculative.cpp, see docs/loop.md).
"""

from __future__ import annotations

import numpy as np

from ..runtime import native
from ..runtime.compat import check_mtp_pair
from .base import top10_prob
from .base import Drafter


class MTPDrafter(Drafter):
    kind = "mtp"

    def __init__(self, info, target, draft_max: int | str = 8, n_threads: int | None = None,
                 n_gpu_layers: int = 0, p_min: float = 0.0, n_min: int = 0, shared=None):
        """shared: a model.SharedDraft when `target` is a slot of a parallel target: its model,
        and an MTP context of this drafter's own on the shared target context, whose entries
        name the slot's sequence (they attend to its cells) and whose passes run on the
        target's decode thread."""
        check_mtp_pair(target.info, info)  # before llama.cpp sees the pair
        self.info, self.target = info, target
        self.p_min, self.n_min = float(p_min), int(n_min)
        self.shared_draft = shared
        self.seq = getattr(target, "seq", 0)
        self.model = native.Model(info.path, n_gpu_layers=n_gpu_layers) if shared is None else shared.use()
        try:
            if shared is None:
                self.ctx = native.Context(self.model, n_ctx=target.n_ctx, n_batch=target.ctx.n_batch,
                                          n_threads=n_threads, ctx_other=target.ctx, mtp=True)
            else:
                other = target.ctx.native
                self.ctx = native.Context(self.model, n_ctx=other.n_ctx, n_batch=target.ctx.n_batch,
                                          n_threads=n_threads, ctx_other=other, mtp=True,
                                          n_seq_max=target.parent.n_parallel)
                self.ctx.runner = target.pool.shared.run
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.close()
            raise
        self.width = target.model.n_embd
        self.max_length = int(draft_max) if draft_max != "auto" else 8
        self.ctx.set_embeddings_nextn(True, True)  # one nextn row per output
        target.ctx.set_embeddings_nextn(True, False)  # unmasked: the target's state at every row
        self.pending = np.zeros(self.width, dtype=np.float32)
        self.rows = self.pending[None, :]

    def describe(self) -> str:
        return f"mtp draft {self.info.path.name} ({self.info.arch}, sharing the target's cache)"

    def reset(self) -> None:
        self.pending = np.zeros(self.width, dtype=np.float32)
        self.rows = self.pending[None, :]

    reads_target = True  # the state is the target's hidden state at the last position

    def resume(self, n: int) -> int:
        # the assistant keeps no cells: the target re-decodes position n - 1 for its state
        self.reset()
        return max(n - 1, 0)

    def save(self):
        return ()

    def restore(self, state) -> bool:
        self.reset()
        return True

    def process(self, tokens, pos0: int) -> None:
        self.rows = self.target.ctx.embeddings_nextn(len(tokens), self.width)  # a copy: kept past the next decode
        self.pending = self.rows[-1]

    def accept(self, n_accepted: int) -> None:
        self.pending = self.rows[min(n_accepted, len(self.rows) - 1)]

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        ctx, b = self.ctx, self.batch
        out: list[int] = []
        self.last_confidence = conf = []
        seq, width = self.seq, self.width
        pending = np.ascontiguousarray(self.pending, dtype=np.float32)
        tok, h = id_last, pending.ctypes.data  # the state's address: the batch copies it when added
        scored = self.p_min > 0 or self.chooser is not None  # a top-10 softmax is a vocabulary scan
        while len(out) < n_max:
            b.clear().add_embedding_at(h, width, pos0, True, token=tok, seq=seq)
            ctx.decode(b)
            logits = ctx.logits(0)
            tok = int(logits.argmax())
            p_tok = top10_prob(logits, tok) if scored else 1.0
            if p_tok < self.p_min:
                break
            out.append(tok)
            conf.append(p_tok)
            if not self.keep_drafting(conf, n_max):
                break
            h = ctx.embeddings_nextn_addr(0)  # the assistant's state, copied into the batch before the next decode
        if len(out) < self.n_min:
            self.last_confidence = out = []
        return out

    def close(self) -> None:
        target = getattr(self, "target", None)
        if target is not None and not target.ctx.closed:
            target.ctx.set_embeddings_nextn(False, False)
        self._close_handles("batch", "ctx")
