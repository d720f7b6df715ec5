"""Sampler settings, the one transform from logits to a distribution, and keyed drawing.

The same `Sampler.dist` turns the target's logits into p and the draft's logits into q,
at every position, with the same token history: the acceptance rules in `verify.py` are
only lossless when p and q come out of one and the same transform.

Order of the transforms (llama.cpp's default chain, `common.h` `samplers`, minus the
samplers we do not offer: DRY, top-n-sigma, typical, XTC):

    0. logit_bias  add each given token's bias to its logit (-inf bans it), before anything
                   else, as llama.cpp's logit-bias sampler heads its chain
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

Steps 0-1 edit a few logits (`_edits`: (ids, values) pairs; a new step that edits logits
adds its pairs there); 2-4 shrink the support (`_support`). The result is a `Dist`: the
kept token ids and their logits, never a full-vocabulary probability vector.

Drawing: every random number is keyed by (seed, absolute position, purpose) (noise.py),
never taken from a stream. The token at position t is the Gumbel-max sample
argmax over the kept tokens of (logit / T + G_t(token)): plain sampling, and the `exact`
and `coupled` rules, all pick it this way, so their output is the same for the same seed.

Where we differ from llama.cpp: the defaults are neutral (greedy, no truncation, no
penalty) instead of llama-cli's top-k 40 / top-p 0.95 / min-p 0.05 / T 0.8, so that the
CLI's default stays the target's greedy output; top-k/top-p ties at the boundary are cut by
numpy's partition order instead of std::partial_sort's (deterministic either way, and the
same for p and q); the random draw is a keyed hash and the Gumbel-max trick, not
llama.cpp's mt19937 stream, so a seed gives other tokens than llama.cpp's `--seed` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from . import noise as keyed
from ..errors import UserError

ACCEPT_RULES = ("auto", "coupled", "exact", "ratio")
MIN_TEMPERATURE = 1e-3  # below it (1e-30) logits / T overflowed the Gumbel draw's float arithmetic


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings; the defaults are greedy decoding. Invalid values raise UserError.

    accept: "coupled" (the target's token at each position is its keyed Gumbel-max sample,
    and a sampling drafter draws its tokens with the same noise; a draft token is kept when
    it equals the target's), "exact" (llama.cpp: the same target samples, drafts drafted
    greedily), "ratio" (Leviathan/Chen: keep with probability min(1, p/q), else resample
    from the residual), or "auto" (coupled when temperature > 0: see the README's sampling
    section for why). At temperature 0 every rule is the greedy arg-max comparison.
    coupled and exact emit exactly the tokens of plain sampled decoding with the same seed,
    whatever the drafter and the draft lengths; ratio emits the same distribution, but its
    tokens depend on the draft lengths.

    seed: a whole number in [0, 2**64 - 1]; None: a fresh one is drawn for the run (and
    reported in its stats as `seed`, so that it can be repeated).
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
    logit_bias: tuple = ()  # sorted (token id, bias) pairs (params.logit_bias_value); a dict is taken too

    def __post_init__(self):
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        # Messages name the Python argument (`param`); the CLI shows its flag instead.
        def bad(name, value, want):
            raise UserError(f"{name} must be {want} (got {value!r})", param=name)

        def number(name, integer=False):
            value = getattr(self, name)
            ok = isinstance(value, (int, np.integer)) if integer else isinstance(value, (int, float, np.number))
            if isinstance(value, bool) or not ok or (not integer and not np.isfinite(value)):
                bad(name, value, "a whole number" if integer else "a finite number")

        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
            number(name)
        for name in ("top_k", "penalty_last_n"):
            number(name, integer=True)
        if self.temperature < 0:
            bad("temperature", self.temperature, ">= 0, 0 = greedy")
        if 0 < self.temperature < MIN_TEMPERATURE:  # logits / T past float32's precision: the keyed draw overflowed
            bad("temperature", self.temperature, f"0 (greedy) or >= {MIN_TEMPERATURE}")
        if abs(self.temperature) > 3.4e38:
            bad("temperature", self.temperature, "a finite float32 number (<= 3.4e38)")
        if self.top_k < 0:
            bad("top_k", self.top_k, ">= 0, 0 = off")
        if not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "in (0, 1], 1 = off")
        if not 0 <= self.min_p <= 1:
            bad("min_p", self.min_p, "in [0, 1], 0 = off")
        if self.repeat_penalty <= 0:
            bad("repeat_penalty", self.repeat_penalty, "> 0, 1 = off")
        if self.penalty_last_n < -1:
            bad("penalty_last_n", self.penalty_last_n, ">= -1, -1 = the whole text, 0 = off")
        if self.seed is not None:
            try:
                keyed.check_seed(self.seed)
            except ValueError:
                bad("seed", self.seed, "a whole number in [0, 2**64 - 1]")
        if self.accept not in ACCEPT_RULES:
            bad("accept", self.accept, "auto, coupled, exact or ratio")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.penalty_last_n != 0 and (self.repeat_penalty != 1 or self.presence_penalty != 0
                                             or self.frequency_penalty != 0)

    @property
    def rule(self) -> str:
        """The acceptance rule that runs: 'greedy', 'coupled', 'exact' or 'ratio'."""
        if self.greedy:
            return "greedy"
        return "coupled" if self.accept == "auto" else self.accept

    def to_dict(self) -> dict:
        return asdict(self)


class Dist:
    """A distribution over a support: p(ids[j]) is proportional to exp(z[j] * scale).

    ids None: the whole vocabulary (z then is the logits array itself, not a copy: valid
    until the next decode overwrites llama.cpp's logits; `kept()` makes a Dist that outlives
    it). Sparse supports keep float64 logits of the kept tokens only. Probabilities are
    computed when asked for (the ratio rule, logprobs, tests); drawing a token needs none.
    """

    __slots__ = ("ids", "z", "scale", "_p", "_order")

    def __init__(self, ids: np.ndarray | None, z: np.ndarray, scale: float = 1.0):
        self.ids, self.z, self.scale = ids, z, float(scale)
        self._p = self._order = None

    @classmethod
    def point(cls, tok: int) -> "Dist":
        return cls(np.array([tok], dtype=np.int64), np.zeros(1))

    @classmethod
    def from_probs(cls, p) -> "Dist":
        """The distribution of a (dense, possibly unnormalised) probability vector."""
        p = np.asarray(p, dtype=np.float64)
        ids = np.flatnonzero(p > 0)
        with np.errstate(divide="ignore"):
            return cls(ids, np.log(p[ids]))

    def kept(self) -> "Dist":
        """This distribution, independent of the logits buffer it may view (ratio keeps q
        across the draft's later decodes)."""
        if self.ids is None and self.z.base is not None:
            return Dist(None, self.z.copy(), self.scale)
        return self

    def __len__(self) -> int:
        return len(self.z)

    def token_ids(self) -> np.ndarray:
        return np.arange(len(self.z)) if self.ids is None else self.ids

    def probs(self) -> np.ndarray:
        """The probabilities of `token_ids()`, in that order (float64, sum 1)."""
        if self._p is None:
            z = self.z.astype(np.float64, copy=False)
            e = np.exp((z - z.max()) * self.scale)
            self._p = e / e.sum()
        return self._p

    def prob(self, tok: int) -> float:
        return float(self.prob_of(np.array([tok]))[0])

    def prob_of(self, toks: np.ndarray) -> np.ndarray:
        """p of each token in `toks` (0 outside the support)."""
        toks = np.asarray(toks, dtype=np.int64)
        p = self.probs()
        if self.ids is None:
            ok = (toks >= 0) & (toks < len(p))
            return np.where(ok, p[np.clip(toks, 0, len(p) - 1)], 0.0)
        if self._order is None:
            self._order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[self._order]
        at = np.clip(np.searchsorted(sorted_ids, toks), 0, len(sorted_ids) - 1)
        return np.where(sorted_ids[at] == toks, p[self._order[at]], 0.0)

    def dense(self, n_vocab: int) -> np.ndarray:
        """The full probability vector (tests and reports; the sampled path never builds it)."""
        out = np.zeros(n_vocab, dtype=np.float64)
        out[self.token_ids()] = self.probs()
        return out

    def argmax(self) -> int:
        return int(self.token_ids()[int(np.argmax(self.z))])

    def sample(self, noise: keyed.Noise, pos: int, purpose: int = keyed.TARGET) -> int:
        """The Gumbel-max token with the keyed noise of (pos, purpose)."""
        if len(self.z) == 1:
            return int(self.token_ids()[0])
        j = keyed.gumbel_argmax(self.z, self.scale, self.ids, noise, pos, purpose)
        return j if self.ids is None else int(self.ids[j])


class Sampler:
    """SamplingParams plus the keyed noise of one generation. A generation given no seed
    draws one (`seed`): reporting it lets the same run be repeated."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.seed = keyed.random_seed() if params.seed is None else int(params.seed)
        self.noise = keyed.Noise(self.seed)

    @property
    def samples_drafts(self) -> bool:
        """Whether drafters should sample their tokens (coupled: with the target's noise;
        ratio: from q, which they report). exact compares greedy drafts."""
        return self.params.rule in ("coupled", "ratio")

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
    def _edits(self, n_vocab: int, logits: np.ndarray, recent: Sequence[int]):
        """Steps 0 and 1 as (token ids, new logits), applied in this order; [] when none apply."""
        prm = self.params
        edits = []
        if prm.logit_bias:
            ids, bias = zip(*prm.logit_bias)
            ids = np.asarray(ids, dtype=np.int64)
            edits.append((ids, None, np.asarray(bias, dtype=np.float64)))
        if prm.penalized and len(recent):
            window = recent if prm.penalty_last_n < 0 else recent[-prm.penalty_last_n:]
            ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
            ok = (ids >= 0) & (ids < n_vocab)
            edits.append((ids[ok], counts[ok], None))
        return edits

    def penalize(self, logits: np.ndarray, recent: Sequence[int]) -> np.ndarray:
        """Steps 0 and 1: `logits` itself when they change nothing, else a copy (same dtype)
        with the few edited logits rewritten; `recent` is the text so far (newest last)."""
        edits = self._edits(len(logits), logits, recent)
        if not edits:
            return logits
        x = np.array(logits)
        prm = self.params
        for ids, counts, bias in edits:
            if bias is not None:
                x[ids] += bias
                continue
            v = x[ids].astype(np.float64)
            v = np.where(v <= 0, v * prm.repeat_penalty, v / prm.repeat_penalty)
            x[ids] = v - counts * prm.frequency_penalty - prm.presence_penalty
        return x

    def dist(self, logits: np.ndarray, recent: Sequence[int] = ()) -> Dist:
        """The distribution p (or q) of one position: steps 0-5 (module doc).

        Runs once per verified position and per sampled draft token, on vocabularies of up to
        262k: truncations work on a short list of candidates found by one vectorised
        comparison, never by sorting the vocabulary; with top-k on, nothing but a comparison
        and a max touches the whole vocabulary.
        """
        prm = self.params
        x = self.penalize(logits, recent)
        if prm.greedy:
            return Dist.point(int(x.argmax()))
        ids = _support(x, prm.top_k, prm.top_p, prm.min_p)
        if ids is None:
            return Dist(None, x, 1.0 / prm.temperature)
        z = x[ids].astype(np.float64)
        finite = np.isfinite(z)  # a banned token (logit_bias -inf) is never in the support
        if not finite.all():
            ids, z = ids[finite], z[finite]
        return Dist(ids, z, 1.0 / prm.temperature)

    def probs(self, logits: np.ndarray, recent: Sequence[int] = ()) -> np.ndarray:
        """The full probability vector of `dist` (float64; zeros outside the kept set): for
        tests and reports, never on the sampled path."""
        return self.dist(logits, recent).dense(len(logits))

    def argmax(self, logits: np.ndarray, recent: Sequence[int] = ()) -> int:
        """The greedy token: truncation never drops the arg-max, only penalties and biases move it."""
        if not self.params.penalized and not self.params.logit_bias:
            return int(np.asarray(logits).argmax())
        return int(self.penalize(logits, recent).argmax())

    # -- drawing -----------------------------------------------------------------------------
    def sample(self, dist: Dist, pos: int) -> int:
        """The token at absolute position `pos`: the keyed Gumbel-max sample of `dist`."""
        return dist.sample(self.noise, pos, keyed.TARGET)

    def propose(self, logits: np.ndarray, recent: Sequence[int], pos: int) -> tuple[int, Dist | None]:
        """A draft token for absolute position `pos` and the q it was drawn from (None: q is
        not needed, or a point mass). coupled: the Gumbel-max sample of q with the target's
        noise at `pos`; ratio: a sample of q with noise of its own (q returned); exact: the
        arg-max."""
        rule = self.params.rule
        if rule == "coupled":
            return self.dist(logits, recent).sample(self.noise, pos, keyed.TARGET), None
        if rule == "ratio":
            q = self.dist(logits, recent)
            return q.sample(self.noise, pos, keyed.DRAFT), q.kept()
        return self.argmax(logits, recent), None


def _support(x: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray | None:
    """Steps 2-4: the kept token ids (None: every token is kept)."""
    ids = None
    if 0 < top_k < x.size:
        ids = _above(x, top_k)
        if ids.size > top_k:
            ids = ids[np.argpartition(-x[ids], top_k - 1)[:top_k]]
    if top_p < 1:
        ids = _top_p(x, ids, top_p)
    if min_p > 0:
        lx = x if ids is None else x[ids]
        keep = lx >= lx.max() + np.log(min_p)
        ids = np.flatnonzero(keep) if ids is None else ids[keep]
    return ids


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
    up sorting everything, as llama.cpp's widening partial sort does). Over the whole
    vocabulary the total mass is summed from exponentials in the logits' own precision;
    the candidates' masses are float64.
    """
    lx = x if ids is None else x[ids]
    top = lx.max()
    total = float(np.exp(lx - lx.dtype.type(top)).sum(dtype=np.float64))
    for width in (4.0, 8.0, 16.0, 32.0, np.inf):
        cand = np.flatnonzero(lx >= top - width)
        e = np.exp(lx[cand].astype(np.float64) - top)
        if e.sum() >= top_p * total or width == np.inf:
            break
    order = np.argsort(-lx[cand], kind="stable")
    cum = np.cumsum(e[order])
    cut = min(int(np.searchsorted(cum, top_p * total, side="left")) + 1, order.size)
    kept = cand[order[:cut]]
    return kept if ids is None else ids[kept]
