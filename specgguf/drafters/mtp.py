"""`mtp`: multi-token-prediction heads, two ways (docs/loop.md §4.9):

- `MTPDrafter`: Gemma 4's assistant (arch `gemma4-assistant`), a GGUF of its own beside its target;
- `NextNDrafter`: the target's own NextN block (Qwen3.5 / 3.6 `qwen35`, `qwen35moe`: `--draft mtp`),
  loaded with the target (load_mtp) and run in an MTP context with a KV cache of its own.

Gemma 4's assistant, in detail:

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


# archs whose single NextN block the pinned llama.cpp runs as an MTP context with a cache of its
# own ("neither shared nor chained" in common/speculative.cpp's draft-mtp; others: not yet)
NEXTN_ARCHS = ("qwen35", "qwen35moe")


def check_nextn_target(info) -> None:
    """A target that can draft with its own NextN block, on metadata alone (before llama.cpp)."""
    from ..errors import UserError

    name = f"{info.path.name} ({info.arch})"
    n = info.metadata.get(f"{info.arch}.nextn_predict_layers", 0)
    if info.arch not in NEXTN_ARCHS:
        raise UserError(f"--draft mtp drafts with a target's own MTP layers, which specgguf runs for "
                        f"{', '.join(NEXTN_ARCHS)} targets; {name} is not one: use --draft ngram, suffix or a "
                        "GGUF drafter", param="draft")
    if not isinstance(n, int) or n < 1:
        raise UserError(f"{name} has no MTP layers ({info.arch}.nextn_predict_layers is {n}): it was converted "
                        "without them; use a GGUF with its MTP block, or --draft ngram / a GGUF drafter", param="draft")
    if n != 1:
        raise UserError(f"{name} has {n} MTP layers; the pinned llama.cpp runs one for this arch", param="draft")


class NextNDrafter(MTPDrafter):
    """The target's own NextN (MTP) block: an MTP context on the target's model, with a KV cache
    of its own for that block (common/speculative.cpp's draft-mtp for qwen35).

    Its entry at position p pairs the token at p with the target's hidden state at p - 1 (the
    final state, `embeddings_nextn`). After every target pass it decodes the kept rows so paired
    (catch-up, no outputs); a draft step decodes (token, h) at the next position with an output,
    takes the arg-max and, as the next step's h, the block's own state for that row. The draft's
    cells are removed before verification (rollback), and the verified rows are decoded again
    with the target's states (process), as llama.cpp's loop does."""

    kind = "mtp"
    reads_target = True

    def __init__(self, target, draft_max: int | str = 8, n_threads: int | None = None, p_min: float = 0.0,
                 n_min: int = 0):
        from ..errors import UserError

        check_nextn_target(target.info)
        if hasattr(target, "parent"):  # a slot of a parallel target
            raise UserError("--draft mtp runs one sequence for now: use it without --parallel / n_parallel",
                            param="draft")
        self.info, self.target = target.info, target
        self.p_min, self.n_min = float(p_min), int(n_min)
        self.seq = 0
        self.model = target.model  # the target's own weights: never closed here
        self.ctx = native.Context(target.model, n_ctx=target.n_ctx, n_batch=target.ctx.n_batch, n_threads=n_threads,
                                  ctx_other=target.ctx, mtp=True)
        try:
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.ctx.close()
            raise
        self.width = target.model.n_embd
        self.max_length = int(draft_max) if draft_max != "auto" else 8
        self.ctx.set_embeddings_nextn(True, True)  # the block's own state at each output row
        target.ctx.set_embeddings_nextn(True, False)  # the target's state at every row
        self.reset()

    def describe(self) -> str:
        return f"mtp: the MTP layer of {self.info.path.name} ({self.info.arch})"

    MARKS = 4  # prompt ends whose state is kept, as many as the target's prompt checkpoints

    def reset(self) -> None:
        self.ctx.clear()
        self.pending = np.zeros(self.width, dtype=np.float32)  # the target's state before the next row
        self.rows, self.rows_pos0 = self.pending[None, :], 0  # the last pass's kept states and their position
        self.marks: dict[int, np.ndarray] = {}  # n -> the target's state at n - 1, at the ends of prompts

    def begin(self, history) -> None:
        # a later prompt may go on from this one's end (the prompt cache's checkpoints are there)
        self.marks[len(history)] = self.pending
        while len(self.marks) > self.MARKS:
            del self.marks[min(self.marks)]

    def resume(self, n: int) -> int:
        # the cell at p holds token p and the target's state at p - 1; going on at m needs the
        # state at m - 1: from the last pass's rows, or from a prompt's end
        pos0, rows = self.rows_pos0, self.rows
        n = min(n, self.ctx.pos_max() + 1)
        options = {m: rows[m - 1 - pos0] for m in range(max(pos0 + 1, 1), min(n, pos0 + len(rows)) + 1)}
        options.update({m: h for m, h in self.marks.items() if 0 < m <= n})
        if not options:
            self.reset()
            return 0
        m = max(options)
        self.ctx.seq_rm(m)
        self.pending = options[m]
        self.marks = {k: h for k, h in self.marks.items() if k <= m}
        return m

    def process(self, tokens, pos0: int) -> None:
        n = len(tokens)
        if n == 0:
            return
        rows = self.target.ctx.embeddings_nextn(n, self.width)  # a copy: kept past the next decode
        paired = np.concatenate([self.pending[None, :], rows[:-1]])  # row j pairs with the state at j - 1
        b, cap = self.batch, self.batch.capacity
        for start in range(0, n, cap):
            b.clear()
            for j in range(start, min(n, start + cap)):
                b.add_embedding(paired[j], pos0 + j, False, token=int(tokens[j]))
            self.ctx.decode(b)
        self.rows, self.rows_pos0 = rows, pos0
        self.pending = rows[-1]

    def accept(self, n_accepted: int) -> None:
        pass  # process had the kept rows only: its last row's state is the one to go on from

    def rollback(self, pos: int) -> None:
        if self.ctx.pos_max() >= pos:
            self.ctx.seq_rm(pos)

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        ctx, b = self.ctx, self.batch
        out: list[int] = []
        self.last_confidence = conf = []
        width = self.width
        pending = np.ascontiguousarray(self.pending, dtype=np.float32)
        tok, h = id_last, pending.ctypes.data  # the batch copies the state when the entry is added
        scored = self.p_min > 0 or self.chooser is not None
        while len(out) < n_max:
            b.clear().add_embedding_at(h, width, pos0 + len(out), True, token=tok)
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
            h = ctx.embeddings_nextn_addr(0)
        if len(out) < self.n_min:
            self.last_confidence = out = []
        return out

    def close(self) -> None:
        target = getattr(self, "target", None)
        if target is not None and not target.ctx.closed:
            target.ctx.set_embeddings_nextn(False, False)
        self.model = None  # the target's: its owner closes it
        self._close_handles("batch", "ctx")
