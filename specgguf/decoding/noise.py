"""Keyed randomness: every random number is a hash of (seed, position, purpose, token id).

A counter-based generator instead of a stream: the number used at one position never
depends on how many numbers were drawn before it, so no decision (a draft length chosen
from timings, a rejection that needs a residual draw) shifts the randomness anywhere else.
With the same seed and settings, a position sees the same noise in every run, with every
drafter and every draft length (docs/loop.md, sampling).

The hash is splitmix64's finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom
number generators", 2014), vectorised over token ids with numpy's wrapping uint64
arithmetic: the key mixes seed, position and purpose; a token's number is the finaliser of
key + (id + 1) * golden-ratio constant, i.e. the splitmix64 stream of that key read at the
token's index. 53 bits make a uniform in (0, 1), never 0 or 1.

`gumbel_argmax` samples a token by the Gumbel-max trick: argmax over the support of
score + G, with G = -log(-log(u)) per token. It draws noise only for the tokens it is given
(the support left after top-k/top-p/min-p); on a whole vocabulary it hashes every id (that
cannot be avoided: any token may win) but takes logarithms only for the few that can.
"""

from __future__ import annotations

import math

import numpy as np

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
SEED_MAX = MASK  # seeds are whole numbers in [0, 2**64 - 1]

# purposes: what a number is for; the same (seed, position) gives independent numbers per purpose
TARGET = 0  # the token at a position: plain sampling, and the exact and coupled rules (drafts too)
DRAFT = 1  # a draft token sampled from q under the ratio rule
ACCEPT = 2  # the ratio rule's uniform that keeps or rejects a draft token
RESIDUAL = 3  # the ratio rule's draw from max(0, p - q) after a rejection

SMALL = 4096  # supports up to this size get their Gumbel noise in one go
HEAD = 8.0  # full supports: scores within this of the best get noise first (Gumbel units)


def _mix(z: int) -> int:
    z = (z ^ (z >> 30)) * M1 & MASK
    z = (z ^ (z >> 27)) * M2 & MASK
    return z ^ (z >> 31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array, in place (numpy's uint64 product wraps)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(M1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(M2)
    z ^= z >> np.uint64(31)
    return z


def check_seed(seed) -> int:
    """A seed as an int; ValueError unless it is a whole number in [0, 2**64 - 1]."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= SEED_MAX:
        raise ValueError(f"a seed is a whole number in [0, 2**64 - 1] (got {seed!r})")
    return int(seed)


def random_seed() -> int:
    """A fresh seed for a run that was given none (32 bits: short enough to type back in)."""
    import secrets

    return secrets.randbits(32)


_weyl_cache: dict[int, np.ndarray] = {}


def _weyl(n: int) -> np.ndarray:
    """(id + 1) * GOLDEN for ids 0..n-1, kept per vocabulary size (the full-support case)."""
    w = _weyl_cache.get(n)
    if w is None:
        w = (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GOLDEN))
        w.setflags(write=False)
        if len(_weyl_cache) > 8:
            _weyl_cache.clear()
        _weyl_cache[n] = w
    return w


class Noise:
    """The keyed generator of one seed."""

    def __init__(self, seed: int):
        self.seed = check_seed(seed)
        self._base = _mix((self.seed * GOLDEN + GOLDEN) & MASK)

    def key(self, pos: int, purpose: int) -> int:
        return _mix((_mix((self._base ^ (pos & MASK)) * GOLDEN & MASK) + purpose * GOLDEN + 1) & MASK)

    def bits(self, pos: int, purpose: int, ids: np.ndarray | None, n: int = 0) -> np.ndarray:
        """64 random bits per token id (ids None: ids 0..n-1)."""
        k = np.uint64(self.key(pos, purpose))
        if ids is None:
            z = _weyl(n) + k
        else:
            z = (np.asarray(ids, dtype=np.uint64) + np.uint64(1)) * np.uint64(GOLDEN) + k
        return _mix_array(z)

    def uniform(self, pos: int, purpose: int) -> float:
        """One uniform in (0, 1) for (position, purpose)."""
        return ((_mix(self.key(pos, purpose) + GOLDEN & MASK) >> 11) + 0.5) * 2.0 ** -53

    def gumbel(self, pos: int, purpose: int, ids: np.ndarray) -> np.ndarray:
        return _gumbel(self.bits(pos, purpose, ids))


def _uniform(bits: np.ndarray) -> np.ndarray:
    return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


def _gumbel(bits: np.ndarray) -> np.ndarray:
    return -np.log(-np.log(_uniform(bits)))


def gumbel_argmax(z: np.ndarray, scale: float, ids: np.ndarray | None, noise: Noise, pos: int,
                  purpose: int) -> int:
    """The index j maximising z[j] * scale + G(ids[j]) (ids None: ids are 0..len(z)-1): a
    sample from softmax(z * scale) over the given tokens, with the keyed noise of (pos, purpose).

    Large supports: the tokens within HEAD of the best score get their noise first; any
    other token can only win with a Gumbel value above (best so far) - (its score), a
    threshold on its 64 bits that a comparison finds without a logarithm. Exact: the same
    index as computing every token's noise.
    """
    n = len(z)
    if n <= SMALL:
        return int(np.argmax(z * scale + _gumbel(noise.bits(pos, purpose, ids, n))))
    bits = noise.bits(pos, purpose, ids, n)
    cut = float(z.max()) * scale - HEAD
    head = np.flatnonzero(z >= cut / scale)  # compared unscaled: no copy of z
    best = float(np.max(z[head] * scale + _gumbel(bits[head])))
    # a token below `cut` needs G > best - cut: u > exp(-exp(-(best - cut))); lowered a
    # little so that rounding can only let more tokens through, never fewer
    g_need = best - cut - 1e-6
    u_need = math.exp(-math.exp(-g_need))
    b_need = max(int(u_need * 2.0 ** 53) - 2, 0)
    cand = np.union1d(head, np.flatnonzero(bits >= np.uint64(b_need << 11)))
    return int(cand[np.argmax(z[cand] * scale + _gumbel(bits[cand]))])
