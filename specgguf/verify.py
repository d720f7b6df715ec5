"""Acceptance rules: which drafted tokens to keep, and which token the target adds.

Pure numpy and no model, so that each rule is unit-tested in isolation. Each rule reads
the target lazily, one position at a time (`argmax_at(i)` / `p_at(i)`), because the first
rejection ends a round: positions after it need no softmax at all.

A round verifies `draft = [d1..dn]` at target positions 0..n (position i predicts the token
after d_i). Every rule returns `ids`, k + 1 tokens: the k accepted drafts, then one token
from the target (a correction at the first rejection, or the bonus after all n). As in
llama.cpp (`sampling.cpp:687-699`), an accepted end-of-generation token ends the round.

- `greedy`: keep d_i while it equals the target's arg-max. Temperature 0, every rule.
- `exact` (llama.cpp's rule at T > 0): sample t_i from p_i; keep d_i while t_i == d_i.
  Exactly one draw per emitted token, so with a deterministic draft the output equals plain
  sampled decoding with the same seed. Acceptance of d_i is p_i(d_i).
- `ratio` (Leviathan et al. 2023, Chen et al. 2023): keep d_i with probability
  min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from max(0, p_i - q_i),
  normalised. Output is distributed as p; acceptance is sum(min(p_i, q_i)), which is higher
  than exact's when the drafter samples from q. q_i = None is a point mass on d_i (a greedy
  or deterministic drafter): acceptance p_i(d_i), residual p_i without d_i.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .sampling import sample_from


def greedy(argmax_at: Callable[[int], int], draft: Sequence[int], is_eog: Callable[[int], bool]) -> list[int]:
    """The longest prefix of `draft` equal to the target's arg-max, plus its next arg-max."""
    ids = []
    n = len(draft)
    for i in range(n + 1):
        tok = argmax_at(i)
        ids.append(tok)
        if i == n or tok != draft[i] or is_eog(tok):
            break
    return ids


def exact(p_at: Callable[[int], np.ndarray], draft: Sequence[int], rng: np.random.Generator,
          is_eog: Callable[[int], bool]) -> list[int]:
    """Sample the target at each position; keep drafts while they equal the sample."""
    ids = []
    n = len(draft)
    for i in range(n + 1):
        tok = sample_from(p_at(i), rng.random())
        ids.append(tok)
        if i == n or tok != draft[i] or is_eog(tok):
            break
    return ids


def ratio(p_at: Callable[[int], np.ndarray], qs: Sequence[np.ndarray | None] | None, draft: Sequence[int],
          rng: np.random.Generator, is_eog: Callable[[int], bool]) -> list[int]:
    """Speculative sampling: accept d_i with probability min(1, p(d_i)/q(d_i)), else resample.

    `qs[i]` is the distribution d_i was drawn from (None, or `qs` None: a point mass on d_i).
    """
    ids: list[int] = []
    for i, tok in enumerate(draft):
        p = p_at(i)
        q = qs[i] if qs is not None else None
        qx = 1.0 if q is None else float(q[tok])
        # u < p/q without dividing: q(x) = 0 (a drafter that drew an impossible token)
        # then accepts iff p(x) > 0, which is the limit of min(1, p/q).
        if rng.random() * qx < p[tok]:
            ids.append(tok)
            if is_eog(tok):
                return ids
            continue
        ids.append(sample_from(residual(p, q, tok), rng.random()))
        return ids
    ids.append(sample_from(p_at(len(draft)), rng.random()))  # bonus: all n were kept
    return ids


def residual(p: np.ndarray, q: np.ndarray | None, tok: int) -> np.ndarray:
    """max(0, p - q) (unnormalised; sampling normalises). q None: the point mass on `tok`.

    If rounding leaves no mass (p == q up to float error, where a rejection has probability
    ~0 anyway), fall back to p rather than sample from nothing.
    """
    if q is None:
        r = p.copy()
        r[tok] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    return r if r.sum() > 0 else p
