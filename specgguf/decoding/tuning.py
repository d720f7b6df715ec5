"""Draft length from costs measured on this machine and acceptance measured on this text.

A round that drafts n tokens costs D(n) (drafting) + V(n) (one target pass over n+1
positions) and commits E(n) = 1 + sum_{i<=n} prod_{j<=i} a_j tokens on average, a_j being the
chance that draft position j is accepted once all before it were. The controller picks the n
(0 included: plain decoding) with the best E(n) / (D(n) + V(n)).

V(n) is a curve through the widths measured by the engine's own rounds (seeded from a
profile cached on disk, profiling.py): on a CPU it is far from a line (the per-position cost
falls as batches grow), on a big GPU it is nearly flat, so it is fitted as measured: a
monotone (isotonic) fit through the measured widths, interpolated piecewise-linearly, and
extended past the widest measured width along its last stretch, but never steeper than the
prior's `PRIOR_ROW` per position: a width nobody has measured must look cheap enough to be
tried once (narrow widths cost more per position than wide ones on a CPU, so their slope
would rule long drafts out for good). Before anything is measured the prior shape stands in
whole, and the first rounds then measure the real curve (docs/loop.md).

Acceptance comes from one of two places:
- a drafter's own confidence (`Drafter.last_confidence`: lookup drafters score every token
  by match length and frequency), calibrated against what verification accepted
  (`Calibration`); lookup drafts cost nothing, so the engine asks for the longest draft the
  drafter has and keeps the prefix that pays (`LengthController.cut`);
- otherwise, per draft position, decayed counts around a prior (`Acceptance`), and the length
  is chosen before drafting (`LengthController.next_length`). When n = 0 wins for a while, a
  short probe round refreshes the estimate, so speculation comes back when the text turns
  repetitive.

Deterministic lengths (`prior_costs`, a seed or `deterministic=True`): the costs are the
prior's shape, frozen, so the chosen lengths depend only on the text and the seed, never on
timing or on a profile that another run may have rewritten (docs/loop.md §2.4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .calibration import LOOKUP_DOUBT_POWER, Calibration

# Prior verify cost of each position beyond the first, as a fraction of a plain pass, while
# nothing is measured: optimistic on purpose (a too-cheap guess is corrected by the round
# that tries it; a too-dear one would never be tried).
PRIOR_ROW = 0.1
EXPLORE_EVERY = 16  # lookup rounds between looks at a longer width than the best guess
SPIKE = 2.0  # a measurement this many times the bound or the cached cost is a stall, not a cost
PER_WIDTH = 1.0  # the trend's weight against a width's own measurements (each weighs 1 .. 9)
# Widths up to this keep their own measured cost beside the trend: the CPU kernels' blocks of
# columns show there (4 positions can cost less than 3). Past it the steps are a few percent,
# under the machine's drift between measurements, and the trend alone is the better guess.
OWN_WIDTHS = 8


def expected_tokens(accept: list[float], n: int) -> float:
    """E(n): tokens committed by a round of n drafts (the target's own token included)."""
    total, run = 1.0, 1.0
    for a in accept[:n]:
        run *= a
        total += run
    return total


def _isotonic(ys: list[float], ws: list[float]) -> list[float]:
    """Non-decreasing least-squares fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for y, w in zip(ys, ws):
        blocks.append([y, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            y2, w2, c2 = blocks.pop()
            b = blocks[-1]
            b[0] = (b[0] * b[1] + y2 * w2) / (b[1] + w2)
            b[1] += w2
            b[2] += c2
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * count)
    return out


def _batched(xs: list[int], ys: list[float], ws: list[float]) -> list[float]:
    """A fit in which each position beyond the plain pass costs, on average, never more in a
    wider batch: (V(n) - V(0)) / n does not rise with n, as a wider batch reads the same
    weights for more rows (the trend, not a law of each width: see OWN_WIDTHS). Measured
    widths are hours apart on a machine whose speed drifts by a third; pooled this way, a
    width measured in a quick minute does not look cheaper per position than the rest (with
    Gemma 3 270M on 2 cores, 28 positions at 6.4 ms each against 8-9.5 ms for 38-57 held
    every later copy at 28)."""
    if len(xs) < 3 or xs[0] != 0:
        return ys
    v0 = ys[0]
    per = [-(y - v0) / x for x, y in zip(xs[1:], ys[1:])]
    pooled = [v0 - p * x for p, x in zip(_isotonic(per, ws[1:]), xs[1:])]
    return _isotonic([v0, *pooled], ws)


@dataclass
class Costs:
    """Seconds per round: V(n) for n drafted tokens, and the draft side (per round and per step)."""

    verify: dict = field(default_factory=dict)  # n -> seconds (running average)
    draft_round: float | None = None  # per drafting round, fixed part
    draft_step: float | None = None  # per drafted token (sequential drafters)
    block: bool = False  # one pass per block (dflash/dspark): no per-token draft cost
    smoothing: float = 0.25
    fresh: set = field(default_factory=set)  # widths measured by this process (not just loaded)
    lookup: float | None = None  # seconds a lookup drafter (ngram, suffix) spends per round
    loaded: dict = field(default_factory=dict)  # n -> seconds as the cache had them
    seen: dict = field(default_factory=dict)  # n -> rounds measured by this process
    frozen: bool = False  # deterministic lengths: observations change nothing (prior_costs)

    def __post_init__(self):
        self._draft_fresh = False  # the draft costs were measured by this process
        self._curve = None  # the V array, rebuilt after observations
        self._curve_list = None
        self._curve_widths = 0
        self._since_fit = 0

    def observe_verify(self, n: int, seconds: float) -> None:
        if self.frozen:
            return
        old = self.verify.get(n)
        # No pass of n+1 positions costs more than n+1 plain passes: more is the process
        # stopped or descheduled mid-pass (a laptop lid, a suspended job), not the width, and
        # kept in the profile it would rule that width out in every later run (never tried
        # again, so never measured again).
        plain = self.verify.get(0)
        if n > 0 and plain is not None:
            seconds = min(seconds, SPIKE * (n + 1) * plain)
        # a width's first measurement here replaces what the cache said: that was another
        # run, maybe on a busier machine (but not SPIKE times busier). Later ones move the
        # average, a spike by at most half the average
        if old is None:
            self.verify[n] = seconds
        elif n not in self.fresh:
            self.verify[n] = min(seconds, SPIKE * old)
        else:
            self.verify[n] = old + self.smoothing * (min(seconds, 1.5 * old) - old)
        new_width = n not in self.fresh
        self.fresh.add(n)
        self.seen[n] = self.seen.get(n, 0) + 1
        self._since_fit += 1
        if new_width or self._since_fit >= 8:  # refits are cheap but not free: batch small drifts
            self._curve = None

    def observe_draft(self, n: int, seconds: float) -> None:
        if n <= 0 or self.frozen:
            return
        per_step = 0.0 if self.block else seconds / (n + 1)
        fixed = seconds - per_step * n
        if self.draft_round is None:
            self.draft_round, self.draft_step = fixed, per_step
        elif not self._draft_fresh:  # the cache's, from another run: replaced, within reason
            self.draft_round = min(fixed, SPIKE * self.draft_round) if self.draft_round > 0 else fixed
            self.draft_step = min(per_step, SPIKE * self.draft_step) if self.draft_step > 0 else per_step
        else:  # a stall moves the average by at most half of it (see observe_verify)
            self.draft_round += self.smoothing * (min(fixed, 1.5 * self.draft_round) - self.draft_round)
            self.draft_step += self.smoothing * (min(per_step, 1.5 * self.draft_step) - self.draft_step)
        self._draft_fresh = True

    def observe_lookup(self, seconds: float) -> None:
        if self.frozen:
            return
        self.lookup = seconds if self.lookup is None else self.lookup + self.smoothing * (seconds - self.lookup)

    # -- the verify curve ------------------------------------------------------------------
    def _knots(self) -> tuple[list[int], list[float], list[float], list[float]]:
        """Measured widths, their measured costs, the weight of each, and the monotone fit.
        Widths only the cache knows are rescaled by how this process's own measurements compare
        with the cache's at shared widths (the machine may be busier or idler now)."""
        ratios = sorted(self.verify[n] / self.loaded[n] for n in self.fresh
                        if n in self.loaded and self.loaded[n] > 0)
        scale = ratios[len(ratios) // 2] if ratios else 1.0
        xs = sorted(self.verify)
        ys = [self.verify[n] if n in self.fresh else self.verify[n] * scale for n in xs]
        if xs[0] == 0:  # a profile written before the bound in observe_verify may break it
            ys = [min(y, (x + 1) * ys[0]) for x, y in zip(xs, ys)]
        ws = [min(self.seen.get(n, 0), 8) + 1.0 if n in self.fresh else 0.5 for n in xs]
        return xs, ys, ws, _batched(xs, _isotonic(ys, ws), ws)

    def curve(self, n_max: int) -> np.ndarray:
        """V(0..n_max) in seconds (in units of a plain pass while nothing is measured)."""
        cached = self._curve
        if cached is not None and len(cached) > n_max and self._curve_widths == len(self.verify):
            return cached
        xs, measured, weights, ys = self._knots() if self.verify else ([], [], [], [])
        own = list(zip(xs, measured, weights))
        width = max(n_max, xs[-1] if xs else 0, 64)
        n = np.arange(width + 1, dtype=np.float64)
        if not xs:
            v = 1.0 + PRIOR_ROW * n
        else:
            if xs[0] != 0:  # no plain round measured: V(0) from the two narrowest widths, else the prior
                v0 = ys[0] / (1.0 + PRIOR_ROW * xs[0])
                if len(xs) > 1 and ys[1] > ys[0]:
                    v0 = max(ys[0] - (ys[1] - ys[0]) / (xs[1] - xs[0]) * xs[0], ys[0] / (xs[0] + 1))
                xs, ys = [0, *xs], [v0, *ys]
            if len(xs) == 1:
                v = ys[0] * (1.0 + PRIOR_ROW * n)
            else:
                v = np.interp(n, xs, ys)
                # past the widest width: along the last stretch (the upper half of the range),
                # at most as steep as the prior (an unmeasured width gets tried, see above)
                last = xs[-1]
                j = max(i for i, x in enumerate(xs) if x <= last / 2 or i == 0)
                slope = min(max((ys[-1] - ys[j]) / (last - xs[j]), 0.0), PRIOR_ROW * ys[0])
                beyond = n > last
                v[beyond] = ys[-1] + slope * (n[beyond] - last)
            # The trend is monotone, the costs are not quite: CPU kernels take the batch in
            # blocks of columns, so a width that fills its blocks can cost less than one
            # narrower (on a 2-core x86 CPU with Gemma 3 270M, verifying 4 positions costs
            # less than 3). A measured narrow width keeps its own cost, leaning on the trend
            # while it has been measured only once or twice (`PER_WIDTH`); wider ones and
            # unmeasured ones follow the trend (`OWN_WIDTHS`).
            for x, y, w in own:
                if x <= OWN_WIDTHS:
                    v[x] = (w * y + PER_WIDTH * v[x]) / (w + PER_WIDTH)
            v = np.clip(v, ys[0], (n + 1) * ys[0])
        self._curve, self._since_fit, self._curve_widths = v, 0, len(self.verify)
        return v

    def curve_list(self, n_max: int) -> list[float]:
        """`curve` as a Python list (cheaper to walk than an array for a few dozen widths)."""
        v = self.curve(n_max)
        cached = self._curve_list
        if cached is None or cached[0] is not v:
            cached = self._curve_list = (v, v.tolist())
        return cached[1]

    def verify_cost(self, n: int) -> float | None:
        """V(n) from the fitted curve; None while nothing at all is measured."""
        if not self.verify:
            return None
        return float(self.curve(n)[n])

    def draft_cost(self, n: int) -> float:
        if n <= 0 or self.draft_round is None:
            return 0.0
        return self.draft_round + (0.0 if self.block else self.draft_step * n)

    def to_dict(self) -> dict:
        return {"verify": {str(k): v for k, v in sorted(self.verify.items())}, "draft_round": self.draft_round,
                "draft_step": self.draft_step, "block": self.block, "lookup": self.lookup}

    @classmethod
    def from_dict(cls, d: dict) -> "Costs":
        verify = {int(k): float(v) for k, v in d.get("verify", {}).items()}
        return cls(verify, d.get("draft_round"), d.get("draft_step"), bool(d.get("block", False)),
                   lookup=d.get("lookup"), loaded=dict(verify))


def prior_costs(draft_step: float = 0.0, block: bool = False) -> Costs:
    """Costs that never change: a plain pass costs 1, each verified position beyond it
    `PRIOR_ROW`, each drafted token `draft_step` (one block pass for block drafters), in units
    of a plain pass. Lengths chosen from them depend only on the acceptance seen on the text,
    so two runs with the same seed draft the same lengths on any machine (a frozen copy of a
    measured profile would not do: any unseeded run may rewrite it between two seeded ones)."""
    costs = Costs({0: 1.0}, draft_round=draft_step if block else 0.0, draft_step=0.0 if block else draft_step,
                  block=block, frozen=True)
    costs.fresh.add(0)
    return costs


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


def best_prefix(costs: Costs, accept, n_avail: int, overhead: float = 0.0,
                draft_cost=None, batch: tuple[int, float] | None = None) -> tuple[int, float]:
    """(n, expected tokens per second) for the best n in 0..n_avail, given acceptance `accept`
    (one conditional rate per position) and `overhead` seconds every round pays anyway.
    draft_cost: D(n) for n = 0..n_avail (None: free). Ties go to the shorter draft.
    batch: (rows, tokens) the other sequences of a shared pass put in it and commit from it
    (decoding/sharedctx.py, decoding/slots.py): the pass then costs V(rows + n) and the rate counted is the whole
    batch's, so a drafted token pays only if its chance beats its row's share of everybody's
    pass; a lone sequence is (0, 0)."""
    rows, tokens = batch or (0, 0.0)
    v = costs.curve_list(n_avail + rows)
    if rows:
        v = v[rows:rows + n_avail + 1]
    if draft_cost is not None:
        v = [a + b for a, b in zip(v, draft_cost)]
    e, run = 1.0 + tokens, 1.0
    best_n, best_rate = 0, e / (v[0] + overhead + 1e-12)
    for n in range(1, n_avail + 1):
        run *= accept[n - 1]
        if run < 1e-4:  # nothing further can pay: E(n) stops growing while V(n) does not fall
            break
        e += run
        rate = e / (v[n] + overhead + 1e-12)
        if rate > best_rate * 1.0001:
            best_n, best_rate = n, rate
    return best_n, best_rate


def choose_length(costs: Costs, accept: list[float], n_max: int, batch: tuple[int, float] | None = None) -> int:
    """The n in 0..n_max with the best expected tokens per second (0 when nothing pays)."""
    if not costs.verify:
        return min(n_max, 2)  # nothing measured yet: a short draft measures both sides
    if 0 not in costs.fresh and batch is None:
        return 0  # then one plain round: the baseline every other length is compared with
    draft = [costs.draft_cost(n) for n in range(n_max + 1)]
    return best_prefix(costs, accept, n_max, draft_cost=draft, batch=batch)[0]


class LengthController:
    """Chooses n each round and learns from what the round cost and accepted."""

    def __init__(self, n_max: int, costs: Costs | None = None, prior: float = 0.6, probe_every: int = 8):
        self.n_max = n_max
        self.costs = costs or Costs()
        self.acceptance = Acceptance(n_max, prior)
        # a lookup drafter's match scores -> acceptance; kept across generations: it describes the drafter
        self.calibration = Calibration(doubt_power=LOOKUP_DOUBT_POWER)
        # a sequential drafter's own confidence (a draft model's probabilities) -> acceptance
        self.draft_calibration = Calibration()
        self.probe_every = probe_every
        self.rebase_every = 32
        self._probe_after = probe_every
        self._idle = self._rounds = self._since_plain = self._lookups = 0
        # parallel sequences: (rows, tokens) of the others in the shared pass (best_prefix), set
        # by the engine every round; None for a lone sequence
        self.batch: tuple[int, float] | None = None

    def reset(self) -> None:
        """A new generation: acceptance is per text, costs and calibration carry over."""
        self.acceptance = Acceptance(self.n_max, self.acceptance.prior)
        self._idle = 0

    # -- lookup drafters: draft everything, keep what pays ----------------------------------
    def value(self, confidence) -> tuple[int, float]:
        """(n, tokens per second) of the best prefix of a draft with these raw confidences."""
        rates = self.calibration.rates(confidence) if len(confidence) else ()
        return best_prefix(self.costs, rates, len(confidence), self.costs.lookup or 0.0, batch=self.batch)

    def cut(self, confidence) -> int:
        """How many tokens of a lookup draft (scored by `confidence`) to verify. None while no
        cost profile knows a plain round: one measures V(0), the baseline every width is
        compared with (it costs one token's time). A profile from an earlier run stands in
        until this run's own rounds measure the widths it uses (Costs._knots rescales it)."""
        self._lookups += 1
        if 0 not in self.costs.verify and self.batch is None:
            return 0
        if not confidence:
            return 0
        n = self.value(confidence)[0]
        if self._lookups % EXPLORE_EVERY == 0 and n < len(confidence) and not self.costs.frozen:
            # now and then a longer prefix than the best guess, where the draft is still
            # likely right: one unlucky measurement must not rule a width out for good
            m = min(len(confidence), 2 * n + 2)
            run, reach = 1.0, 0
            for a in self.calibration.rates(confidence[:m]):
                run *= a
                if run < 0.5:
                    break
                reach += 1
            n = max(n, reach)
        return n

    # -- sequential drafters: choose before drafting --------------------------------------
    def plan(self, n_max: int | None = None) -> tuple[int, float]:
        """(n, tokens per second) of the best length for a sequential draft of at most n_max."""
        n_max = self.n_max if n_max is None else min(n_max, self.n_max)
        draft = [self.costs.draft_cost(n) for n in range(n_max + 1)]
        return best_prefix(self.costs, self.acceptance.rates(), n_max, draft_cost=draft, batch=self.batch)

    def keep_drafting(self, confidence, n_max: int) -> bool:
        """A sequential drafter has drafted len(confidence) tokens of a planned n_max, scored
        by its own confidence: does drafting on pay? Yes while some longer prefix (the tokens
        still to come judged by the acceptance measured per position) has a better expected
        tokens per second than stopping here; so an unsure draft stops early, as llama.cpp's
        --draft-p-min does, with the threshold set by the costs measured here."""
        k = len(confidence)
        if k >= n_max:
            return False
        costs = self.costs
        if not costs.verify:
            return True  # nothing measured yet: the planned length stands
        v = costs.curve_list(n_max)
        e, run = 1.0, 1.0
        for r in self.draft_calibration.rates(confidence):
            run *= r
            e += run
        stop = e / (v[k] + costs.draft_cost(k) + 1e-12)
        for m, a in enumerate(self.acceptance.rates()[k:n_max], start=k + 1):
            run *= a
            e += run
            if e / (v[m] + costs.draft_cost(m) + 1e-12) > stop * 1.0001:
                return True
        return False

    def plan_rate(self, n: int) -> float:
        """Expected tokens per second of a sequential draft of n tokens (the lookup that ran
        anyway included): what a hybrid compares a lookup draft's `value` with."""
        v = self.costs.curve(n)[n] + self.costs.draft_cost(n) + (self.costs.lookup or 0.0)
        return expected_tokens(self.acceptance.rates(), n) / max(v, 1e-12)

    def next_length(self) -> int:
        n = choose_length(self.costs, self.acceptance.rates(), self.n_max, self.batch)
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
        elif self.costs.frozen:  # nothing to measure: no baseline or wider width to look at
            self._idle = 0
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

    def record(self, n_asked: int, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float,
               confidence=None, draft_confidence=None) -> None:
        """One round's outcome. confidence: the raw scores of the verified draft tokens (a
        lookup round), else None (a sequential round, or a plain one). draft_confidence: a
        sequential drafter's own scores of its tokens, if it has any. verify_s: None when the
        pass's time is no measure of its width (the first pass that wide)."""
        if verify_s is not None:
            self.costs.observe_verify(n_drafted, verify_s)
        if confidence is not None:
            self.costs.observe_lookup(draft_s)
            if n_drafted:
                self.calibration.update(confidence[:n_drafted], n_accepted)
        elif n_asked > 0:
            self.costs.observe_draft(max(n_drafted, 1), draft_s)
            self.acceptance.update(n_drafted, n_accepted)
            if draft_confidence and n_drafted:
                self.draft_calibration.update(draft_confidence[:n_drafted], n_accepted)
