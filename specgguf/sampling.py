"""Sampler settings and the one transform from logits to a probability vector.

The same `Sampler.probs` turns the target's logits into p and the draft's logits into q,
at every position, with the same token history: the acceptance rules in `verify.py` are
only lossless when p and q come out of one and the same transform.

Order of the transforms (llama.cpp's default chain, `common.h` `samplers`, minus the
samplers we do not offer: DRY, top-n-sigma, typical, XTC):

    1. penalties   over the last `penalty_last_n` tokens of the text (prompt and output,
                   as llama-server feeds its sampler): a logit l of a token seen c > 0 times
                   becomes l * r if l <= 0 else l / r (r = repeat_penalty), then
                   l - c * frequency_penalty - presence_penalty
    2. top-k       keep the k highest logits (0: off)
    3. top-p       keep the smallest set of most likely tokens whose probability (softmax
                   of the logits so far, temperature NOT yet applied) reaches top_p (1: off)
    4. min-p       keep tokens with probability >= min_p * the highest one (0: off)
    5. temperature divide the logits by T, softmax over the tokens kept. T = 0: all mass on
                   the arg-max (greedy), as llama.cpp's temperature sampler does.

Where we differ from llama.cpp: the defaults are neutral (greedy, no truncation, no
penalty) instead of llama-cli's top-k 40 / top-p 0.95 / min-p 0.05 / T 0.8, so that the
CLI's default stays the target's greedy output; top-k/top-p ties at the boundary are cut by
numpy's partition order instead of std::partial_sort's (deterministic either way, and the
same for p and q); the random draw is numpy's PCG64, not llama.cpp's mt19937, so a seed
gives other tokens than llama.cpp's `--seed` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from .errors import UserError

ACCEPT_RULES = ("auto", "exact", "ratio")


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings; the defaults are greedy decoding. Invalid values raise UserError.

    accept: "exact" (llama.cpp: sample the target, keep a draft token only if it is the
    sample), "ratio" (Leviathan/Chen: keep with probability min(1, p/q), else resample from
    the residual), or "auto" (ratio when temperature > 0). At temperature 0 every rule is
    the greedy arg-max comparison.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    accept: str = "auto"

    def __post_init__(self):
        # Messages name the CLI flags: that is where a user meets them.
        def bad(flag, value, want):
            raise UserError(f"--{flag} must be {want} (got {value!r})")

        def number(flag, value, integer=False):
            ok = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float, np.number))
            if isinstance(value, bool) or not ok or (not integer and not np.isfinite(value)):
                bad(flag, value, "a whole number" if integer else "a finite number")

        for flag, name in (("temperature", "temperature"), ("top-p", "top_p"), ("min-p", "min_p"),
                           ("repeat-penalty", "repeat_penalty"), ("presence-penalty", "presence_penalty"),
                           ("frequency-penalty", "frequency_penalty")):
            number(flag, getattr(self, name))
        for flag, name in (("top-k", "top_k"), ("penalty-last-n", "penalty_last_n")):
            number(flag, getattr(self, name), integer=True)
        if self.temperature < 0:
            bad("temperature", self.temperature, ">= 0, 0 = greedy")
        if self.top_k < 0:
            bad("top-k", self.top_k, ">= 0, 0 = off")
        if not 0 < self.top_p <= 1:
            bad("top-p", self.top_p, "in (0, 1], 1 = off")
        if not 0 <= self.min_p <= 1:
            bad("min-p", self.min_p, "in [0, 1], 0 = off")
        if self.repeat_penalty <= 0:
            bad("repeat-penalty", self.repeat_penalty, "> 0, 1 = off")
        if self.penalty_last_n < -1:
            bad("penalty-last-n", self.penalty_last_n, ">= -1, -1 = the whole text, 0 = off")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            bad("seed", self.seed, "a whole number >= 0")
        if self.accept not in ACCEPT_RULES:
            bad("accept", self.accept, "exact or ratio")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (self.repeat_penalty != 1 or self.presence_penalty != 0
                                             or self.frequency_penalty != 0)

    @property
    def rule(self) -> str:
        """The acceptance rule that runs: 'greedy', 'exact' or 'ratio'."""
        if self.greedy:
            return "greedy"
        return "ratio" if self.accept == "auto" else self.accept

    def to_dict(self) -> dict:
        return asdict(self)


class Sampler:
    """SamplingParams plus the random generator of one generation (seeded: reproducible)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    @property
    def samples_drafts(self) -> bool:
        """Whether drafters should sample their tokens from q (only the ratio rule gains)."""
        return self.params.rule == "ratio"

    def window(self, history: Sequence[int], id_last: int) -> list[int]:
        """The text the penalties look at, up to and including `id_last` (the newest token);
        empty when they are off, so that callers can always pass `window + drafted`."""
        prm = self.params
        if not prm.penalized:
            return []
        if prm.penalty_last_n < 0:
            return [*history, id_last]
        return [*history[-prm.penalty_last_n:], id_last][-prm.penalty_last_n:]

    # -- the transform ---------------------------------------------------------------------
    def penalize(self, logits: np.ndarray, recent: Sequence[int]) -> np.ndarray:
        """Step 1 on a float64 copy of `logits`; `recent` is the text so far (newest last)."""
        x = np.array(logits, dtype=np.float64)
        prm = self.params
        if not prm.penalized or not len(recent):
            return x
        window = recent if prm.penalty_last_n < 0 else recent[-prm.penalty_last_n:]
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        ids_ok = (ids >= 0) & (ids < x.size)
        ids, counts = ids[ids_ok], counts[ids_ok]
        v = x[ids]
        v = np.where(v <= 0, v * prm.repeat_penalty, v / prm.repeat_penalty)
        x[ids] = v - counts * prm.frequency_penalty - prm.presence_penalty
        return x

    def probs(self, logits: np.ndarray, recent: Sequence[int] = ()) -> np.ndarray:
        """The probability vector (float64, full vocabulary, zeros outside the kept set).

        Runs once per verified position and per sampled draft token, on vocabularies of up to
        262k: truncations work on a short list of candidates (`ids`) found by one vectorised
        comparison, never by sorting or fancy-indexing the whole vocabulary.
        """
        prm = self.params
        x = self.penalize(logits, recent)
        out = np.zeros(x.size, dtype=np.float64)
        if prm.greedy:
            out[int(x.argmax())] = 1.0
            return out
        ids = None  # None: every token is still in
        if 0 < prm.top_k < x.size:
            ids = _above(x, prm.top_k)
            ids = ids[np.argpartition(-x[ids], prm.top_k - 1)[:prm.top_k]] if ids.size > prm.top_k else ids
        if prm.top_p < 1:
            ids = _top_p(x, ids, prm.top_p)
        if prm.min_p > 0:
            lx = x if ids is None else x[ids]
            keep = lx >= lx.max() + np.log(prm.min_p)
            ids = np.flatnonzero(keep) if ids is None else ids[keep]
        z = (x if ids is None else x[ids]) / prm.temperature
        e = np.exp(z - z.max())
        e /= e.sum()
        if ids is None:
            return e
        out[ids] = e
        return out

    def argmax(self, logits: np.ndarray, recent: Sequence[int] = ()) -> int:
        """The greedy token: truncation never drops the arg-max, only penalties move it."""
        if not self.params.penalized:
            return int(np.asarray(logits).argmax())
        return int(self.penalize(logits, recent).argmax())

    # -- drawing -----------------------------------------------------------------------------
    def sample(self, p: np.ndarray) -> int:
        """One token from p, with exactly one uniform draw (keeps runs reproducible)."""
        return sample_from(p, self.rng.random())

    def propose(self, logits: np.ndarray, recent: Sequence[int] = ()) -> tuple[int, np.ndarray | None]:
        """A draft token and the q it was drawn from (None: a point mass, drafted greedily)."""
        if self.samples_drafts:
            q = self.probs(logits, recent)
            return self.sample(q), q
        return self.argmax(logits, recent), None


def sample_from(p: np.ndarray, u: float) -> int:
    """The token whose cumulative interval holds u * sum(p); never a zero-probability one."""
    cdf = np.cumsum(p)
    i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if i >= p.size or p[i] <= 0:  # u * total rounded onto the top: take the last nonzero
        i = int(np.flatnonzero(p)[-1])
    return i


def _above(x: np.ndarray, at_least: int) -> np.ndarray:
    """Indices of every logit within some distance of the maximum, at least `at_least` of
    them: a superset of the top `at_least` found by comparisons alone (no sort)."""
    top = x.max()
    for width in (4.0, 8.0, 16.0, 32.0):
        ids = np.flatnonzero(x >= top - width)
        if ids.size >= at_least:
            return ids
    return np.arange(x.size)


def _top_p(x: np.ndarray, ids: np.ndarray | None, top_p: float) -> np.ndarray:
    """The smallest most-likely subset of `ids` (None: all) whose softmax mass reaches top_p.

    Every token above a logit threshold comes before every token below it in the sorted
    order, so once the tokens above a threshold hold top_p of the mass, sorting just those
    gives the exact cut. The threshold is lowered until they do (a flat distribution ends
    up sorting everything, as llama.cpp's widening partial sort does).
    """
    lx = x if ids is None else x[ids]
    top = lx.max()
    e = np.exp(lx - top)
    total = e.sum()
    for width in (4.0, 8.0, 16.0, 32.0, np.inf):
        cand = np.flatnonzero(lx >= top - width)
        if e[cand].sum() >= top_p * total or width == np.inf:
            break
    order = cand[np.argsort(-lx[cand], kind="stable")]
    cum = np.cumsum(e[order])
    cut = min(int(np.searchsorted(cum, top_p * total, side="left")) + 1, order.size)
    kept = order[:cut]
    return kept if ids is None else ids[kept]
