"""Near-ties: where a drafted answer on a quantised target may part from plain decoding.

On a quantised CPU target a verify batch (and cells written by another batch shape) moves the
logits slightly (README, "Same output"; docs/loop.md §6.4); which near-ties flip depends on the
CPU's kernels (AVX2, AVX-512, AMX each flip others). A test of such a target asks for what
holds everywhere: the answer is the target's own greedy answer, or parts from it only at a
position where the target's two best tokens are within `nats` and the runner-up was taken.
"""

from __future__ import annotations

import numpy as np

from specgguf.decoding.promptcache import PromptCache

NEAR_TIE_NATS = 1.5


def top_two(llm, tokens: list[int]) -> tuple[int, int, float]:
    """(best, runner-up, logit gap) of the target's next token after `tokens` (one pass)."""
    target = llm.target
    ctx, batch = target.ctx, target.batch
    ctx.clear()
    PromptCache.of(target).forget()  # used directly: the prompt cache must not trust the context
    step = ctx.n_batch
    for start in range(0, len(tokens), step):
        chunk = tokens[start:start + step]
        batch.clear().add_tokens(chunk, start, "last" if start + step >= len(tokens) else "none")
        ctx.decode(batch)
    row = np.asarray(ctx.logits(len(chunk) - 1), dtype=np.float64)
    a, b = np.argsort(row)[-2:][::-1]
    return int(a), int(b), float(row[a] - row[b])


def assert_same_or_near_tie(llm, prompt: list[int], got: list[int], want: list[int],
                            nats: float = NEAR_TIE_NATS) -> None:
    """`got` (a drafted run's tokens) equals `want` (plain greedy decoding's), or parts from it
    at a near-tie of the target (`llm`, which is left with an unknown cache) and took the
    runner-up there."""
    if got == want:
        return
    j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert j < len(want), ("the target ended where the drafted answer went on", j, got, want)
    best, second, gap = top_two(llm, list(prompt) + want[:j])
    assert gap <= nats, (f"parted at {j} where the target's top two are {gap:.3f} nats apart", got, want)
    if j < len(got):
        assert got[j] in (best, second), (j, got[j], best, second)
