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
    fresh: set = field(default_factory=set)  # widths measured by this process (not just loaded)

    def observe_verify(self, n: int, seconds: float) -> None:
        old = self.verify.get(n)
        # a width's first measurement here replaces what the cache said: that was another
        # run, maybe on a busier machine
        self.verify[n] = seconds if old is None or n not in self.fresh else old + self.smoothing * (seconds - old)
        self.fresh.add(n)
        self._fit = None

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
        """V(n) from a straight line fitted through the measured widths, V(0) measured
        directly. A line is what the hardware does (on a CPU every verified position adds the
        output layer's cost; on a big GPU the line is flat), and fitting one averages out the
        noise of single widths, extrapolates to widths never tried, and keeps one busy moment
        from making a length look too dear to try again. Clamped to V(0) <= V(n) <= (n+1) V(0)."""
        base = self.verify.get(0)
        if n == 0 or not self.verify:
            return base if n == 0 else None
        line = self._line()
        v = line[0] + line[1] * n if line else next(iter(self.verify.values()))
        if base is None:
            return v
        return min(max(v, base), (n + 1) * base)

    def _line(self):
        """(intercept, slope) of the least-squares line through the measured widths; None
        with fewer than two widths. Cached until the next observation (asked every round)."""
        if getattr(self, "_fit", None) is None:
            self._fit = (self._fit_line(),)
        return self._fit[0]

    def _fit_line(self):
        pts = sorted(self.verify.items())
        mine = [p for p in pts if p[0] in self.fresh]
        if len(mine) >= 2:  # once this process has its own widths, the cache's stop counting
            pts = mine
        if len(pts) < 2:
            return None
        xs = [float(x) for x, _ in pts]
        ys = [y for _, y in pts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        return my - slope * mx, max(slope, 0.0)

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
        """Each position's estimate leans on the one before it (acceptance is strongly
        correlated along a draft), the first on the prior: untested positions inherit."""
        out, lean = [], self.prior
        for a, t in zip(self.accepted, self.tried):
            lean = (a + self.weight * lean) / (t + self.weight)
            out.append(lean)
        return out


def choose_length(costs: Costs, accept: list[float], n_max: int) -> int:
    """The n in 0..n_max with the best expected tokens per second (0 when nothing pays)."""
    if not costs.verify:
        return min(n_max, 2)  # nothing measured yet: a short draft measures both sides
    if 0 not in costs.fresh:
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

    def __init__(self, n_max: int, costs: Costs | None = None, prior: float = 0.6, probe_every: int = 8):
        self.n_max = n_max
        self.costs = costs or Costs()
        self.acceptance = Acceptance(n_max, prior)
        self.probe_every = probe_every
        self.rebase_every = 32
        self._probe_after = probe_every
        self._idle = self._rounds = self._since_plain = 0

    def reset(self) -> None:
        """A new generation: acceptance is per text, costs carry over."""
        self.acceptance = Acceptance(self.n_max, self.acceptance.prior)
        self._idle = 0

    def next_length(self) -> int:
        n = choose_length(self.costs, self.acceptance.rates(), self.n_max)
        self._rounds += 1
        if n == 0:
            self._since_plain = 0
            self._idle += 1
            if self._idle >= self._probe_after:  # a cheap look at whether drafting pays again
                self._idle = 0
                # If even certain acceptance would not pay, costs (not the text) rule drafting
                # out: look again ever more rarely. Otherwise the text may turn repetitive:
                # keep looking at the base rate.
                certain = choose_length(self.costs, [1.0] * self.n_max, self.n_max) > 0
                self._probe_after = self.probe_every if certain else min(2 * self._probe_after, 512)
                return min(2, self.n_max)
        else:
            self._idle = 0
            self._since_plain += 1
            if self._since_plain >= self.rebase_every:  # re-measure the baseline V(0) now and then
                self._since_plain = 0
                return 0
            # now and then one step longer than the best guess, while that width has not been
            # measured in this process: costs learned elsewhere get checked, not trusted
            if n < self.n_max and (n + 1) not in self.costs.fresh and self._rounds % 4 == 0:
                return n + 1
        return n

    def record(self, n_asked: int, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float) -> None:
        self.costs.observe_verify(n_drafted, verify_s)
        if n_asked > 0:
            self.costs.observe_draft(max(n_drafted, 1), draft_s)
            self.acceptance.update(n_drafted, n_accepted)
