"""A drafter's own confidence, mapped to the acceptance verification actually shows.

Lookup drafters score each drafted token (how long the match behind it is, how often the text
went on that way), a draft model by its probabilities (drafters/base.py, `last_confidence`).
Those raw scores are guesses of uneven honesty; `Calibration` learns, per bin of the raw
score, how often tokens so scored were accepted, and the draft-length chooser (tuning.py)
reads the calibrated rates. It is saved with the cost profile (profiling.py), so a new
process starts calibrated.
"""

from __future__ import annotations

from math import log2 as _log2

# A lookup drafter's raw score is Laplace's rule on its match (a match of m tokens: 1 - 1/(m+1)),
# which undersells copying: in the side-by-side benchmark's calibrations (Gemma 3 270M, copy,
# edit, JSON and prose prompts), tokens scored 0.75 or more were accepted 95-100% of the time,
# and 0.6-0.7 about 82%. A first run that takes the raw score at its word drafts 14 tokens
# where 57 would all be accepted, and grows its drafts over four rounds (each first wider
# pass is a slow one, docs/loop.md §2.3). The lookup prior squares the raw doubt (1 - raw):
# 0.67 -> 0.89, 0.75 -> 0.94, 0.94 -> 0.996, while a weak score stays weak (0.3 -> 0.51);
# verified tokens outweigh the prior within a few rounds either way.
LOOKUP_DOUBT_POWER = 2.0



class Calibration:
    """A drafter's raw confidence -> the acceptance verification actually shows, by bins of
    the raw value: decayed counts around a prior (a pseudo-count) that is the raw value itself,
    or for lookup drafters a surer one (`LOOKUP_DOUBT_POWER`), so an honest drafter is trusted from
    the start and a boastful one is corrected within a few rounds.

    The bins are even in log(1 - raw), `PER_HALVING` for each halving of the doubt, so they
    are fine where long drafts are decided: over 64 tokens, an acceptance of 0.99 per token
    keeps half the draft and 0.999 keeps nearly all of it, and a lookup match of 30 tokens
    (raw 0.97) is not a match of 300 (raw 0.997). Plain Python on purpose: it runs every
    round on a few dozen numbers."""

    PER_HALVING = 3
    SCALE = "log2-doubt/3"  # the binning, saved with the counts: another one is a cache miss

    def __init__(self, bins: int = 30, weight: float = 3.0, decay: float = 0.995, doubt_power: float = 1.0):
        """doubt_power: the prior, before a bin's tokens are verified, takes a raw score r for
        1 - (1 - r) ** doubt_power (1: r as it is)."""
        self.bins, self.weight, self.decay, self.doubt_power = bins, weight, decay, doubt_power
        self.tried = [0.0] * bins
        self.accepted = [0.0] * bins
        self._floor_cache = None

    def to_dict(self) -> dict:
        return {"scale": self.SCALE, "bins": self.bins, "tried": self.tried, "accepted": self.accepted}

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        if d.get("scale") != cls.SCALE:
            raise ValueError("a calibration with other bins")
        c = cls(bins=int(d["bins"]))
        if c.bins < 1:
            raise ValueError("a damaged calibration")
        tried, accepted = [float(x) for x in d["tried"]], [float(x) for x in d["accepted"]]
        if len(tried) != c.bins or len(accepted) != c.bins or \
                any(not 0.0 <= a <= t for a, t in zip(accepted, tried)):
            raise ValueError("a damaged calibration")
        c.tried, c.accepted = tried, accepted
        return c

    def _bin(self, raw: float) -> int:
        if raw <= 0.0:
            return 0
        if raw >= 1.0:
            return self.bins - 1
        return min(int(-_log2(1.0 - raw) * self.PER_HALVING), self.bins - 1)

    def _floors(self) -> list[float]:
        """Per bin, the best estimate of any bin below it that has seen tokens (each at its
        lowest raw value): a surer raw score is never taken for less than a less sure one, so
        what the first rounds learn about 30-token matches lifts the 60-token ones, not yet
        seen, too."""
        floors = self._floor_cache
        if floors is None:
            floors, best, w = [], 0.0, self.weight
            for b in range(self.bins):
                floors.append(best)
                if self.tried[b] >= 1.0:
                    lo = 1.0 - 2.0 ** (-b * self.doubt_power / self.PER_HALVING)
                    best = max(best, (self.accepted[b] + w * lo) / (self.tried[b] + w))
            self._floor_cache = floors
        return floors

    def rates(self, raw) -> list[float]:
        tried, accepted, w, top = self.tried, self.accepted, self.weight, self.bins - 1
        per, log2, floors, power = self.PER_HALVING, _log2, self._floors(), self.doubt_power
        out = []
        for r in raw:
            if r <= 0.0:
                r, b = 0.0, 0
            elif r >= 1.0:
                r, b = 1.0, top
            else:
                b = int(-log2(1.0 - r) * per)
                if b > top:
                    b = top
            own = (accepted[b] + w * (1.0 - (1.0 - r) ** power)) / (tried[b] + w)
            out.append(own if own > floors[b] else floors[b])
        return out

    def update(self, raw, n_accepted: int) -> None:
        """Tokens 1..k were accepted, k+1 rejected, the rest never tested."""
        tested = min(n_accepted + 1, len(raw))
        if tested <= 0:
            return
        d = self.decay
        self._floor_cache = None
        self.tried = tried = [t * d for t in self.tried]
        self.accepted = accepted = [a * d for a in self.accepted]
        for i in range(tested):
            b = self._bin(raw[i])
            tried[b] += 1.0
            if i < n_accepted:
                accepted[b] += 1.0
