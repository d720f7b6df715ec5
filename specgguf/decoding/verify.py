"""Acceptance rules: which drafted tokens to keep, and which token the target adds.

Pure numpy and no model, so that each rule is unit-tested in isolation. Each rule reads
the target lazily, one position at a time (`argmax_at(i)` / `p_at(i)`, a `sampling.Dist`),
because the first rejection ends a round: positions after it need no work at all.

A round verifies `draft = [d1..dn]` at target positions 0..n (position i predicts the token
after d_i, which sits at absolute position `pos + i`). Every rule returns `ids`, k + 1
tokens: the k accepted drafts, then one token from the target (a correction at the first
rejection, or the bonus after all n). As in llama.cpp (`sampling.cpp:687-699`), an accepted
end-of-generation token ends the round. Random numbers come from `noise.Noise`, keyed by
(seed, absolute position, purpose): no rule draws from a stream, so what one round does
never moves the randomness of another.

- `greedy`: keep d_i while it equals the target's arg-max. Temperature 0, every rule.
- `coupled` and `exact`: the target's token at absolute position t is its keyed Gumbel-max
  sample argmax(log p_t + G_t) (`Dist.sample`, purpose TARGET), whatever was drafted; keep
  d_i while it equals that token. The output is therefore plain sampled decoding's, token
  for token, for every drafter and every draft length. The two differ only in how the
  drafter picks: `exact` (llama.cpp's rule) drafts greedily, acceptance p_i(d_i);
  `coupled` (Daliri et al., "Coupling without communication and drafter-invariant
  speculative decoding") lets a sampling drafter take argmax(log q_t + G_t) with the same
  G_t, which is accepted with probability at least (1 - TV(p, q)) / (1 + TV(p, q)).
  Point-mass drafts (n-gram, hidden-state drafts) are verified the same way by both.
- `ratio` (Leviathan et al. 2023, Chen et al. 2023): keep d_i with probability
  min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from max(0, p_i - q_i),
  normalised. Output is distributed as p; acceptance is sum(min(p_i, q_i)) for a drafter
  that samples from q. q_i = None is a point mass on d_i (a greedy or deterministic
  drafter): acceptance p_i(d_i), residual p_i without d_i. Its tokens depend on where the
  rounds begin (a position is a bonus draw in one schedule, a residual draw in another), so
  with `--draft-max auto` the same seed need not give the same text.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .noise import ACCEPT, RESIDUAL, TARGET, Noise
from .sampling import Dist


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


def coupled(p_at: Callable[[int], Dist], draft: Sequence[int], noise: Noise, pos: int,
            is_eog: Callable[[int], bool]) -> list[int]:
    """The target's keyed sample at each position; keep drafts while they equal it."""
    ids = []
    n = len(draft)
    for i in range(n + 1):
        tok = p_at(i).sample(noise, pos + i, TARGET)
        ids.append(tok)
        if i == n or tok != draft[i] or is_eog(tok):
            break
    return ids


# exact verifies as coupled does; the rules differ in the drafter's tokens (module doc)
exact = coupled


def ratio(p_at: Callable[[int], Dist], qs: Sequence[Dist | None] | None, draft: Sequence[int], noise: Noise,
          pos: int, is_eog: Callable[[int], bool]) -> list[int]:
    """Speculative sampling: accept d_i with probability min(1, p(d_i)/q(d_i)), else resample.

    `qs[i]` is the distribution d_i was drawn from (None, or `qs` None: a point mass on d_i).
    """
    ids: list[int] = []
    for i, tok in enumerate(draft):
        p = p_at(i)
        q = qs[i] if qs is not None else None
        qx = 1.0 if q is None else q.prob(tok)
        # u < p/q without dividing: q(x) = 0 (a drafter that drew an impossible token)
        # then accepts iff p(x) > 0, which is the limit of min(1, p/q).
        if noise.uniform(pos + i, ACCEPT) * qx < p.prob(tok):
            ids.append(tok)
            if is_eog(tok):
                return ids
            continue
        ids.append(residual(p, q, tok).sample(noise, pos + i, RESIDUAL))
        return ids
    ids.append(p_at(len(draft)).sample(noise, pos + len(draft), TARGET))  # bonus: all n were kept
    return ids


def residual(p: Dist, q: Dist | None, tok: int) -> Dist:
    """max(0, p - q) over p's support (where q > p it is 0 anyway). q None: the point mass
    on `tok`.

    If rounding leaves no mass (p == q up to float error, where a rejection has probability
    ~0 anyway), fall back to p rather than sample from nothing.
    """
    ids = p.token_ids()
    r = p.probs().copy()
    if q is None:
        r[ids == tok] = 0.0
    else:
        r = np.maximum(r - q.prob_of(ids), 0.0)
    keep = r > 0
    if not keep.any():
        return p
    with np.errstate(divide="ignore"):
        return Dist(ids[keep], np.log(r[keep]))
