"""`dflash` and `dspark`: block drafters that denoise a whole block in one pass.

Target features are injected into the draft's KV cache at the target positions
(`process`); drafting decodes one non-causal block [id_last, mask, mask, ...] at pos0 and
reads a draft token from every slot. Two slot rules (docs/loop.md §4.4):
in-place (z-lab DFlash: slots 1..n, block n+1 long) and sample-from-anchor (DSpark and
every DeepSpec file: slots 0..n-1, block n long). DSpark's Markov head runs in the graph;
its confidence head can cut the draft short (`p_min`). Mirrors spec.cpp:940-1330.

DFlash 2 (a file with `dflash.selector_top_k` > 0: dynamic convolutions and a top-K candidate
selector, docs/loop.md §4.4.1) reads no logits: the graph packs a lattice of candidates and
pairwise scores into the nextn rows, and the draft is the greedy walk through it
(`walk_lattice`, as spec.cpp's is_dflash2 branch).
"""

from __future__ import annotations

import numpy as np

from .base import top10_prob
from .hidden import HiddenStateDrafter


def walk_lattice(rows: np.ndarray, top_k: int, p_min: float = 0.0) -> list[int]:
    """The draft of one DFlash 2 block from its nextn rows (src/models/dflash.cpp
    build_dflash2_selector, walked as common/speculative.cpp does): row 0 (the anchor) is
    unused; row i holds the K candidate ids of block position i (as floats), then K x K scores,
    predecessor-major: scores[j*K + c] rates candidate c after the predecessor j chosen at
    position i - 1 (position 1: after the anchor, every j alike). From j = 0, each position
    takes its best candidate c, which becomes the next predecessor; with p_min > 0 the walk
    stops where softmax(scores) at c, 1 / sum(exp(s - s_c)), is below it."""
    out: list[int] = []
    j = 0
    for i in range(1, len(rows)):
        row = rows[i]
        scores = row[top_k + j * top_k:top_k + (j + 1) * top_k]
        j = int(scores.argmax())  # the first of equal maxima, as std::max_element
        if p_min > 0 and 1.0 / float(np.exp(scores - scores[j]).sum()) < p_min:
            break
        out.append(int(row[j]))
    return out


class DFlashDrafter(HiddenStateDrafter):
    block = True

    def __init__(self, info, target, kind: str, draft_max: int | str = 8, **options):
        self.kind = kind
        super().__init__(info, target, **options)
        meta = self.model.meta
        self.block_size = int(meta("dflash.block_size") or 16)
        anchor_key = meta("dflash.sample_from_anchor")
        # llama.cpp: DSpark defaults to sample-from-anchor; an explicit key decides for a
        # markov-less file too (DeepSpec DFlash files carry true, spec.cpp reads slots 1.. for
        # them unless run as draft-dspark).
        self.sample_from_anchor = (anchor_key != "false") if kind == "dspark" else (anchor_key == "true")
        self.mask = self.model.mask
        n_cap = self.block_size if self.sample_from_anchor else self.block_size - 1
        # A fixed --draft-max sets every block's length, as in llama.cpp; with "auto" each
        # round's chosen length does (up to the trained block).
        self.fixed_length = draft_max != "auto"
        self.n_max = min(int(draft_max), n_cap) if self.fixed_length else n_cap
        self.max_length = self.n_max
        # DFlash 2 (spec.cpp: llama_model_dflash_selector_top_k > 0, which is this key): the
        # lattice comes back unmasked, one nextn row per block token, and no logits are read
        self.selector_top_k = int(meta("dflash.selector_top_k") or 0)
        self.dflash2 = self.selector_top_k > 0
        # masked: one nextn (confidence) row per output
        self.ctx.set_embeddings_nextn(True, not self.dflash2)
        self.ctx.set_causal(meta("dflash.attention.causal") == "true")
        self.n_embd = self.model.n_embd

    def describe(self) -> str:
        rule = "sample-from-anchor" if self.sample_from_anchor else "in-place"
        selector = f", DFlash 2 selector (top {self.selector_top_k})" if self.dflash2 else ""
        return super().describe() + f", block {self.block_size}, {rule} slots{selector}"

    def process(self, tokens, pos0: int) -> None:
        feats = self.features(len(tokens))
        ctx, b = self.ctx, self.batch
        for start in range(0, len(tokens), ctx.n_ubatch):
            b.clear()
            # each row writes K/V at its token's own position
            b.add_embeddings(feats[start:start + ctx.n_ubatch], pos0 + start)
            ctx.decode(b)

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        # The block length follows the configured n_max, not this round's cap: attention in
        # the block is non-causal, so its length changes every slot's prediction. The engine
        # truncates to the cap.
        n_drafts = self.n_max if self.fixed_length else min(n_max, self.n_max)
        n_block = n_drafts + (0 if self.sample_from_anchor else 1)
        n_block = min(n_block, self.ctx.n_ctx - pos0)
        if n_block < 1 + (0 if self.sample_from_anchor else 1):
            return []
        ctx, b = self.ctx, self.batch
        block_tokens = [id_last] + [self.mask] * (n_block - 1)
        if self.dflash2:
            # as spec.cpp: no logits asked for; the walk always starts after the anchor slot
            b.clear().add_tokens(block_tokens, pos0, "none")
            ctx.decode(b)
            rows = ctx.embeddings_nextn(n_block, self.n_embd, copy=False)
            out = walk_lattice(rows, self.selector_top_k, self.p_min)
            return out if len(out) >= self.n_min else []
        b.clear().add_tokens(block_tokens, pos0, "all")
        ctx.decode(b)
        first = 0 if self.sample_from_anchor else 1
        if self.kind == "dspark" and self.p_min > 0:
            conf = ctx.embeddings_nextn(n_block, self.n_embd, copy=False)[:, 0]
            n_ok = next((i for i in range(first, n_block) if conf[i] < self.p_min), n_block)
        else:
            n_ok = n_block
        # every slot asked for logits: one view of the block, arg-maxed in one call (16 rows of
        # 152k: ~10% faster than row by row, and no Python per row) unless each row is judged
        block = ctx.logits_block(n_block)
        if self.kind == "dflash" and self.p_min > 0:
            out: list[int] = []
            for i in range(first, n_ok):
                row = block[i]
                tok = int(row.argmax())
                if top10_prob(row, tok) < self.p_min:
                    break
                out.append(tok)
        else:
            out = block[first:n_ok].argmax(axis=1).tolist() if n_ok > first else []
        return out if len(out) >= self.n_min else []
