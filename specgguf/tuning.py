"""Draft length from costs measured on this machine and acceptance measured on this text.

A round that drafts n tokens costs D(n) (drafting) + V(n) (one target pass over n+1
positions) and commits E(n) = 1 + sum_{i<=n} prod_{j<=i} a_j tokens on average, a_j being the
chance that draft position j is accepted once all before it were. The controller picks the n
(0 included: plain decoding) with the best E(n) / (D(n) + V(n)) each round. Costs are
running averages of the engine's own timings, seeded from a profile cached on disk
(profiling.py); acceptance is a decayed count per position around a prior. When n = 0 wins
for a while, a short probe round refreshes the acceptance estimate, so speculation comes
back when the text turns repetitive.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(accept: list[float], n: int) -> float:
    """E(n): tokens committed by a round of n drafts (the target's own token included)."""
    total, run = 1.0, 1.0
    for a in accept[:n]:
        run *= a
        total += run
    return total


@dataclass
class Costs:
    """Seconds per round: V(n) for n drafted tokens, and the draft side (per round and per step)."""

    verify: dict = field(default_factory=dict)  # n -> seconds (running average)
    draft_round: float | None = None  # per drafting round, fixed part
    draft_step: float | None = None  # per drafted token (sequential drafters)
    block: bool = False  # one pass per block (dflash/dspark): no per-token draft cost
    smoothing: float = 0.25

    def observe_verify(self, n: int, seconds: float) -> None:
        old = self.verify.get(n)
        self.verify[n] = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe_draft(self, n: int, seconds: float) -> None:
        if n <= 0:
            return
        per_step = 0.0 if self.block else seconds / (n + 1)
        fixed = seconds - per_step * n
        if self.draft_round is None:
            self.draft_round, self.draft_step = fixed, per_step
        else:
            self.draft_round += self.smoothing * (fixed - self.draft_round)
            self.draft_step += self.smoothing * (per_step - self.draft_step)

    def verify_cost(self, n: int) -> float | None:
        """Measured V(n), else a straight line through the measured widths (V grows with n on
        CPUs, where every verified position pays the output layer; it is flat on big GPUs)."""
        if n in self.verify:
            return self.verify[n]
        if not self.verify:
            return None
        pts = sorted(self.verify.items())
        if len(pts) == 1:
            return pts[0][1]
        lo = max((p for p in pts if p[0] < n), default=pts[0], key=lambda p: p[0])
        hi = min((p for p in pts if p[0] > n), default=pts[-1], key=lambda p: p[0])
        if lo[0] == hi[0]:  # beyond the measured range: extend the last segment's slope
            (x0, y0), (x1, y1) = (pts[-2], pts[-1]) if n > pts[-1][0] else (pts[0], pts[1])
            return max(y0 + (y1 - y0) * (n - x0) / (x1 - x0), 0.0)
        return lo[1] + (hi[1] - lo[1]) * (n - lo[0]) / (hi[0] - lo[0])

    def draft_cost(self, n: int) -> float:
        if n <= 0 or self.draft_round is None:
            return 0.0
        return self.draft_round + (0.0 if self.block else self.draft_step * n)

    def to_dict(self) -> dict:
        return {"verify": {str(k): v for k, v in sorted(self.verify.items())}, "draft_round": self.draft_round,
                "draft_step": self.draft_step, "block": self.block}

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        return cls({int(k): float(v) for k, v in d.get("verify", {}).items()}, d.get("draft_round"),
                   d.get("draft_step"), bool(d.get("block", False)))


class Acceptance:
    """Per-position acceptance estimates: decayed counts around a prior (a pseudo-count)."""

    def __init__(self, n_max: int, prior: float = 0.5, weight: float = 2.0, decay: float = 0.9):
        self.prior, self.weight, self.decay = prior, weight, decay
        self.tried = [0.0] * n_max
        self.accepted = [0.0] * n_max

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """A round drafted n tokens and k were accepted: positions 1..k accepted, k+1 rejected,
        positions after it were never tested."""
        if n_drafted <= 0:
            return
        for i in range(len(self.tried)):
            self.tried[i] *= self.decay
            self.accepted[i] *= self.decay
        for i in range(min(n_accepted + 1, n_drafted, len(self.tried))):
            self.tried[i] += 1.0
            self.accepted[i] += 1.0 if i < n_accepted else 0.0

    def rates(self) -> list[float]:
        return [(a + self.weight * self.prior) / (t + self.weight) for a, t in zip(self.accepted, self.tried)]


def choose_length(costs: Costs, accept: list[float], n_max: int) -> int:
    """The n in 0..n_max with the best expected tokens per second (0 when nothing pays)."""
    if not costs.verify:
        return min(n_max, 2)  # nothing measured yet: a short draft measures both sides
    if 0 not in costs.verify:
        return 0  # then one plain round: the baseline every other length is compared with
    best_n, best_rate = 0, 1.0 / costs.verify[0]
    for n in range(1, n_max + 1):
        cost = costs.verify_cost(n) + costs.draft_cost(n)
        rate = expected_tokens(accept, n) / cost if cost > 0 else float("inf")
        if rate > best_rate * 1.0001:  # ties go to the shorter draft
            best_n, best_rate = n, rate
    return best_n


class LengthController:
    """Chooses n each round and learns from what the round cost and accepted."""

    def __init__(self, n_max: int, costs: Costs | None = None, prior: float = 0.5, probe_every: int = 16):
        self.n_max = n_max
        self.costs = costs or Costs()
        self.acceptance = Acceptance(n_max, prior)
        self.probe_every = probe_every
        self._idle = 0

    def reset(self) -> None:
        """A new generation: acceptance is per text, costs carry over."""
        self.acceptance = Acceptance(self.n_max, self.acceptance.prior)
        self._idle = 0

    def next_length(self) -> int:
        n = choose_length(self.costs, self.acceptance.rates(), self.n_max)
        if n == 0:
            self._idle += 1
            if self._idle >= self.probe_every:  # a cheap look at whether drafting pays again
                self._idle = 0
                return min(2, self.n_max)
        else:
            self._idle = 0
        return n

    def record(self, n_asked: int, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float) -> None:
        self.costs.observe_verify(n_drafted, verify_s)
        if n_asked > 0:
            self.costs.observe_draft(max(n_drafted, 1), draft_s)
            self.acceptance.update(n_drafted, n_accepted)
