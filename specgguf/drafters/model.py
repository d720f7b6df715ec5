"""`model`: a small stand-alone GGUF that shares the target's tokenizer (llama.cpp draft-simple).

The draft context mirrors the target: every target batch is decoded into it as well
(`process`), so before a round it holds exactly the committed tokens. Drafting decodes
id_last and then each greedy draft token; the caller rolls those cells back right away and
`process` re-evaluates the verified batch (docs/loop.md §2.2, §4.1).

With parallel sequences (decoding/sharedctx.py, decoding/slots.py) the slots' drafters share one `SharedDraft`:
one draft model (for every kind), and for this kind one context holding a sequence per slot;
each drafter works in its slot's sequence, and the draft steps that several slots ask for at
the same moment share a pass.
"""

from __future__ import annotations

from ..decoding.sharedctx import PendingRows, SeqContext, SharedContext
from ..runtime import native
from ..runtime.compat import check_shared_vocab
from .base import top10_prob
from .base import Drafter


class SharedDraft:
    """The draft of the slots of a parallel target (a `parallel.Slot`'s parent), loaded once.
    For a plain draft model (kind 'model') also one context with a sequence per slot, whose
    passes run on the target's decode thread and start as soon as the context is free, with
    every draft row asked for meanwhile; the drafts that read the target's hidden states keep a
    context per slot (drafters/hidden.py, drafters/mtp.py). Closed by its last drafter."""

    def __init__(self, info, slot, kind: str, n_gpu_layers: int = 0, n_threads: int | None = None):
        target = slot.parent
        if kind == "model":
            check_shared_vocab(target.info, info)  # before llama.cpp touches the pair
        self.info, self.kind, self.users = info, kind, 0
        self.model = native.Model(info.path, n_gpu_layers=n_gpu_layers)
        self.ctx = self.batch = self.shared = None
        self.n_ctx = target.n_ctx
        if kind != "model":
            return
        try:
            n = target.n_parallel
            self.ctx = native.Context(self.model, n_ctx=target.n_ctx * n, n_batch=target.ctx.n_batch,
                                      n_threads=n_threads, ctx_other=target.ctx, n_seq_max=n)
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.model.close()
            raise
        self.shared = SharedContext(self.ctx, self.batch, wait_for_all=False, runner=slot.pool.shared)

    def use(self) -> native.Model:
        """The model, for one more drafter (each calls release() when it closes)."""
        self.users += 1
        return self.model

    def view(self, seq: int):
        """(context, batch) of sequence `seq`, for one drafter (kind 'model')."""
        self.use()
        return SeqContext(self.shared, seq, self.n_ctx), PendingRows(self.batch.capacity)

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            for obj in (self.batch, self.ctx, self.model):
                if obj is not None:
                    obj.close()


class ModelDrafter(Drafter):
    kind = "model"
    samples = True  # takes the sampler: coupled/ratio draw, ratio's q lands in last_q
    # lazy (auto mode only): fixed lengths keep llama.cpp's eager order, bit for bit
    supports_lazy = True

    def __init__(self, info, target, n_gpu_layers: int = 0, n_threads: int | None = None,
                 p_min: float = 0.0, n_min: int = 0, shared: SharedDraft | None = None):
        """shared: draft in slot `target.seq` of that SharedDraft (target is a parallel.Slot)."""
        self.info = info
        self.p_min, self.n_min = float(p_min), int(n_min)
        self._pending = []
        self._kv_end = 0
        self._checkpoint: tuple[int, bytes] | None = None  # a recurrent draft's state before drafting
        self.shared_draft = shared
        if shared is not None:
            self.model = shared.model
            self.ctx, self.batch = shared.view(target.seq)
            return
        check_shared_vocab(target.info, self.info)  # before llama.cpp touches the pair
        self.model = native.Model(self.info.path, n_gpu_layers=n_gpu_layers)
        try:
            self.ctx = native.Context(self.model, n_ctx=target.n_ctx, n_batch=target.ctx.n_batch,
                                      n_threads=n_threads, ctx_other=target.ctx)
            self.batch = native.Batch(self.ctx)
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        return f"model draft {self.info.path.name} ({self.info.arch}, {self.info.file_type})"

    def reset(self) -> None:
        self.ctx.clear()
        self._checkpoint = None
        self._pending: list[tuple[int, int]] = []  # (token, position) not yet in the draft cache
        self._kv_end = 0  # one past the highest position in the draft's cache

    def resume(self, n: int) -> int:
        # the cache holds the committed tokens up to the first queued one (lazy mode)
        in_cache = min(n, self.ctx.pos_max() + 1)
        if n <= 0 or not self.ctx.can_resume_at(in_cache):  # (a recurrent draft: no cut at all)
            self.reset()
            return 0
        self.rollback(n)
        self._catch_up()  # a queue left by lazy mode goes in first, in order
        return min(n, self.ctx.pos_max() + 1)

    def save(self):
        self._catch_up()
        return self.ctx.state_bytes(), self._kv_end

    def restore(self, state) -> bool:
        self._pending = []
        self.ctx.load_state_bytes(state[0])
        self._kv_end = state[1]
        return True

    def process(self, tokens, pos0: int) -> None:
        if self.lazy:
            self._pending.extend((t, pos0 + i) for i, t in enumerate(tokens))
            return
        self._decode_plain(list(tokens), pos0)

    def _decode_plain(self, tokens: list[int], pos0: int) -> None:
        # Only the KV cache matters here: no outputs, so no lm_head pass over the vocabulary.
        b = self.batch
        for start in range(0, len(tokens), b.capacity):
            b.clear().add_tokens(tokens[start:start + b.capacity], pos0 + start, "none")
            self.ctx.decode(b)
        self._kv_end = max(self._kv_end, pos0 + len(tokens))

    def _catch_up(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._decode_plain([t for t, _ in pending], pending[0][1])

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        """Greedy (llama.cpp's draft-simple) without a sampler; with one, each token comes from
        `sampler.propose` for its absolute position (pos0 + 1 + index): under coupled the
        Gumbel-max sample of q with the target's noise of that position, under ratio a sample
        of q (q kept in `last_q`), under exact the arg-max of the penalised logits."""
        self._catch_up()
        ctx, b = self.ctx, self.batch
        if ctx.rollback != "trim":
            # a recurrent draft: its drafted tokens go in one pass each, which no snapshot reaches
            # back over, so the state before them is saved and put back (decoding/rollback.py)
            self._checkpoint = (pos0, ctx.partial_state_bytes())
        b.clear().add_token(id_last, pos0, True)
        ctx.decode(b)
        self._kv_end = max(self._kv_end, pos0 + max(n_max, 1) + 1)  # an upper bound is enough
        out: list[int] = []
        qs: list = []
        self.last_confidence = conf = []
        scored = self.p_min > 0 or self.chooser is not None
        recent = sampler.window(history, id_last) if sampler is not None else []
        self.last_q = None
        while True:
            try:
                logits = ctx.logits(0)
                # p_min judges the draft's top candidate BEFORE any draw: stopping on a drawn
                # token would skew the proposals away from the q that `ratio` is told about
                top = int(logits.argmax())
                # a top-10 softmax per token costs a vocabulary scan: only where someone reads it
                p_top = top10_prob(logits, top) if scored else 1.0
                if self.p_min > 0 and p_top < self.p_min:
                    break
                if sampler is None:
                    tok, q = top, None
                else:
                    tok, q = sampler.propose(logits, recent + out, pos0 + 1 + len(out))
            finally:
                ctx.outputs_read()  # a shared draft context's next pass may overwrite them now
            out.append(tok)
            qs.append(q)
            # the confidence of the draft's top candidate, again not of a drawn token (the
            # decision to draft on may depend on tokens drafted, never on one it discards)
            conf.append(p_top)
            if not self.keep_drafting(conf, n_max):
                break
            b.clear().add_token(tok, pos0 + len(out), True)
            ctx.decode(b)
        if len(out) < self.n_min:
            self.last_confidence = []
            return []
        if any(q is not None for q in qs):
            self.last_q = qs
        return out

    def rollback(self, pos: int) -> None:
        pending = self._pending
        while pending and pending[-1][1] >= pos:  # positions ascend: trim from the end
            pending.pop()
        if self._kv_end > pos:  # skip the call when the cache holds nothing from pos on
            checkpoint, self._checkpoint = self._checkpoint, None
            if self.ctx.rollback != "trim" and pos <= self.ctx.pos_max():
                if checkpoint is None or checkpoint[0] != pos:
                    raise RuntimeError(f"a recurrent draft state cannot go back to position {pos}")
                self.ctx.load_partial_state_bytes(checkpoint[1])
            self.ctx.seq_rm(pos)
            self._kv_end = pos

    def close(self) -> None:
        # a SharedDraft's context and batch are views of its own (it closes them with the model)
        self._close_handles(*(() if self.shared_draft is not None else ("batch", "ctx")))
