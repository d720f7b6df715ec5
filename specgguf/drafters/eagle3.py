"""`eagle3`: an EAGLE-3 head that drafts token by token from the target's hidden states.

After every target decode the K target layer inputs of each token (K = 3 for classic
EAGLE-3, 5 for DeepSpec Eagle3 on the patched build) are encoded (`fc`, input width
K x target width) into one row g per token; the one-layer decoder's KV cell at position P is built from the
pair (token at P+1, g_P). The token at P+1 of the batch's last position is not known yet,
so every `process` leaves one cell unwritten and remembers it (the deferred boundary):
the next prefill chunk completes it (bridge), or the next draft's seed step does, with
id_last. `accept` moves the boundary back to the last committed position.
Mirrors llama.cpp's draft-eagle3 driver, spec.cpp:486-876 (docs/loop.md §4.3).
"""

from __future__ import annotations

import numpy as np

from ..runtime import native
from .base import top10_prob
from .hidden import HiddenStateDrafter


class Eagle3Drafter(HiddenStateDrafter):
    kind = "eagle3"

    def __init__(self, info, target, **options):
        super().__init__(info, target, **options)
        self.n_embd_dec = self.model.n_embd
        self.ctx.set_embeddings_nextn(True, True)  # encoder output g, decoder pre-norm state h
        self.enc_batch = native.Batch(self.ctx)  # embedding rows of encoder width only
        self._reset_state()
        self.marks: dict[int, np.ndarray] = {}

    MARKS = 4  # prompt ends whose boundary is kept (a recurrent target's checkpoints are there)

    def _reset_state(self) -> None:
        self.pending_pos = -1
        self.pending_g = np.zeros(self.n_embd_dec, dtype=np.float32)
        self.verify_g = self.pending_g[None, :]
        self.verify_pos_first = 0

    def reset(self) -> None:
        super().reset()
        self._reset_state()
        self.marks: dict[int, np.ndarray] = {}  # n -> the deferred g at n - 1, at the ends of prompts

    def begin(self, history) -> None:
        super().begin(history)
        if self.pending_pos == len(history) - 1 >= 0:
            self.marks[len(history)] = self.pending_g.copy()
            while len(self.marks) > self.MARKS:
                del self.marks[min(self.marks)]

    def resume(self, n: int) -> int:
        # the cell at P is built from the token at P+1, the first one the new prompt may
        # change: keep the cells before n - 1; the boundary at n - 1 needs its g, which the
        # last pass or a prompt's end may have left (else the target re-decodes n - 1)
        g = self.pending_g if n >= 1 and self.pending_pos == n - 1 else self.marks.get(n)
        kept = super().resume(n - 1) if n > 1 else super().resume(0)
        self._reset_state()
        self.marks = {m: v for m, v in self.marks.items() if m <= n}
        if g is not None and kept == n - 1:
            self.pending_pos, self.pending_g = n - 1, g.copy()
            return n
        return kept

    def save(self):
        return super().save(), self.pending_pos, self.pending_g.copy()

    def restore(self, state) -> bool:
        super().restore(state[0])
        self._reset_state()
        self.marks = {}  # another conversation's
        self.pending_pos, self.pending_g = state[1], state[2].copy()
        return True

    def _encode(self, feats: np.ndarray) -> np.ndarray:
        """g rows for feature rows, in chunks of n_ubatch (the encoder ignores positions, but
        llama.cpp still wants them to continue the draft's cache)."""
        ctx, b = self.ctx, self.enc_batch
        out = np.empty((len(feats), self.n_embd_dec), dtype=np.float32)
        for start in range(0, len(feats), ctx.n_ubatch):
            chunk = feats[start:start + ctx.n_ubatch]
            pos = ctx.pos_max() + 1
            b.clear().add_embeddings(chunk, pos, True)
            ctx.encode(b)
            out[start:start + len(chunk)] = ctx.embeddings_nextn(len(chunk), self.n_embd_dec, copy=False)
        return out

    def process(self, tokens, pos0: int) -> None:
        n = len(tokens)
        g = self._encode(self.features(n))
        ctx, b = self.ctx, self.batch
        b.clear()
        if self.pending_pos >= 0 and self.pending_pos + 1 == pos0 and self.pending_pos > ctx.pos_max():
            b.add_embedding(self.pending_g, self.pending_pos, token=tokens[0])  # the bridge
        if n > 1:
            b.add_embeddings(g[:n - 1], pos0, tokens=tokens[1:])
        if b.n_tokens:
            ctx.decode(b)
        self.verify_pos_first, self.pending_pos = pos0, pos0 + n - 1
        self.verify_g, self.pending_g = g, g[n - 1].copy()

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        ctx, b = self.ctx, self.batch
        pos = self.pending_pos
        ctx.seq_rm(pos)
        b.clear().add_embedding(self.pending_g, pos, True, token=id_last)
        ctx.decode(b)
        out: list[int] = []
        self.last_confidence = conf = []
        scored = self.p_min > 0 or self.chooser is not None  # a top-10 softmax is a vocabulary scan
        width = self.n_embd_dec
        while True:
            logits = ctx.logits(0)
            tok = int(logits.argmax())
            p_tok = top10_prob(logits, tok) if scored else 1.0
            if self.p_min > 0 and p_tok < self.p_min:
                break
            h = ctx.embeddings_nextn_addr(0)  # the decoder state, copied into the batch before the next decode
            out.append(tok)
            conf.append(p_tok)
            if not self.keep_drafting(conf, n_max):
                break
            b.clear().add_embedding_at(h, width, pos + len(out), True, token=tok)
            ctx.decode(b)
        if len(out) < self.n_min:
            self.last_confidence = out = []
        return out

    def accept(self, n_accepted: int) -> None:
        r = min(n_accepted, len(self.verify_g) - 1)
        self.pending_pos = self.verify_pos_first + r
        self.pending_g = self.verify_g[r].copy()

    def close(self) -> None:
        if getattr(self, "enc_batch", None) is not None:
            self.enc_batch.close()
        super().close()
