"""verify.py on hand-made p and q: no model, exact expectations and one statistical check.

Random numbers are keyed (noise.py): a test reads the number a rule will use at a position
from the same `Noise` and checks what the rule did with it."""

from __future__ import annotations

import numpy as np
import pytest

from chisquare import gof, pvalue
from specgguf.decoding import verify
from specgguf.decoding.noise import ACCEPT, DRAFT, RESIDUAL, TARGET, Noise
from specgguf.decoding.sampling import Dist

ALPHA = 1e-3


def never_eog(tok):
    return False


def const(*ps):
    dists = [Dist.from_probs(p) for p in ps]
    return lambda i: dists[i]


def seed_where(want, pos=0):
    """A Noise whose ACCEPT uniform at `pos` satisfies want(u)."""
    for seed in range(10_000):
        nz = Noise(seed)
        if want(nz.uniform(pos, ACCEPT)):
            return nz
    raise AssertionError("no seed found")


# -- greedy, exact and coupled -----------------------------------------------------------------

def test_greedy_keeps_the_matching_prefix_and_adds_the_next_argmax():
    tops = [5, 6, 9, 1]
    assert verify.greedy(tops.__getitem__, [5, 6, 7], never_eog) == [5, 6, 9]
    assert verify.greedy(tops.__getitem__, [5, 6, 9], never_eog) == [5, 6, 9, 1]  # bonus
    assert verify.greedy(tops.__getitem__, [], never_eog) == [5]  # plain decoding
    assert verify.greedy(tops.__getitem__, [4], never_eog) == [5]
    # an accepted end-of-generation token ends the round, as in llama.cpp
    assert verify.greedy(tops.__getitem__, [5, 6, 9], lambda t: t == 6) == [5, 6]


def test_greedy_reads_only_the_positions_it_needs():
    seen = []
    verify.greedy(lambda i: seen.append(i) or 0, [1, 0, 0], never_eog)
    assert seen == [0]


def test_coupled_keeps_drafts_equal_to_the_keyed_samples():
    p0, p1 = [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]
    nz = Noise(0)
    assert verify.coupled(const(p0, p1, p0), [1, 2], nz, 10, never_eog) == [1, 2, 1]
    assert verify.coupled(const(p0, p1), [1, 0], nz, 10, never_eog) == [1, 2]
    assert verify.exact is verify.coupled  # the rules differ in the drafter, not here
    p = [0.2, 0.3, 0.5]
    for pos in range(50):
        want = [Dist.from_probs(p).sample(nz, pos + i) for i in range(3)]
        # a draft equal to the target's samples is kept whole; the output never depends on it
        assert verify.coupled(const(p, p, p), want[:2], nz, pos, never_eog) == want
        assert verify.coupled(const(p), [], nz, pos, never_eog) == want[:1]
        wrong = (want[0] + 1) % 3
        assert verify.coupled(const(p, p), [wrong], nz, pos, never_eog) == want[:1]


# -- ratio: hand-made cases -------------------------------------------------------------------

def test_ratio_p_equals_q_accepts_every_draft():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    nz = Noise(0)
    for pos in range(0, 1000, 2):
        draft = [Dist.from_probs(p).sample(nz, pos + i, DRAFT) for i in range(2)]
        ids = verify.ratio(const(p, p, p), [Dist.from_probs(p)] * 2, draft, nz, pos, never_eog)
        assert ids[:2] == draft and len(ids) == 3  # both kept, then the bonus from p


def test_ratio_q_zero_where_p_positive():
    # q puts no mass on token 0, which p likes; token 2 is q's, p never makes it
    p = np.array([0.5, 0.5, 0.0])
    q = Dist.from_probs([0.0, 0.5, 0.5])
    nz = Noise(1)
    for pos in range(200):
        # drafting 2 (p = 0): always rejected; the residual max(0, p - q) is all on token 0
        assert verify.ratio(const(p), [q], [2], nz, pos, never_eog) == [0]
        # drafting 1 (p = q): always kept
        assert verify.ratio(const(p, p), [q], [1], nz, pos, never_eog)[0] == 1


def test_ratio_drafted_token_with_q_zero():
    # a drafter that reports q(x) = 0 for its own token: min(1, p/0) = 1 when p(x) > 0
    p = np.array([0.3, 0.7])
    q = Dist.from_probs([1.0, 0.0])
    assert verify.ratio(const(p, p), [q], [1], Noise(0), 0, never_eog)[0] == 1
    assert verify.ratio(const([1.0, 0.0]), [q], [1], Noise(0), 0, never_eog) == [0]


def test_ratio_point_mass_q():
    p = np.array([0.3, 0.2, 0.5])
    # accept with probability p(d) = 0.2: the ACCEPT uniform decides
    keep, drop = seed_where(lambda u: u < 0.2), seed_where(lambda u: u >= 0.2)
    assert verify.ratio(const(p, p), None, [1], keep, 0, never_eog)[0] == 1
    assert verify.ratio(const(p, p), [None], [1], keep, 0, never_eog)[0] == 1
    # rejected: resampled from p without the drafted token, with the RESIDUAL noise
    ids = verify.ratio(const(p), None, [1], drop, 0, never_eog)
    assert ids == [Dist.from_probs([0.3, 0.0, 0.5]).sample(drop, 0, RESIDUAL)] and ids[0] != 1
    # a point-mass target always keeps its own token
    one = np.array([0.0, 1.0, 0.0])
    for pos in range(20):
        assert verify.ratio(const(one, one), None, [1], Noise(3), pos, never_eog) == [1, 1]


def test_ratio_residual_subtracts_q():
    p = Dist.from_probs([0.5, 0.3, 0.2])
    q = Dist.from_probs([0.1, 0.6, 0.3])
    r = verify.residual(p, q, 1)
    assert np.allclose(r.dense(3), [1.0, 0.0, 0.0])
    # p/q = 0.5 at token 1: a uniform above rejects, and the residual has all its mass on 0
    nz = seed_where(lambda u: u > 0.5)
    assert verify.ratio(const([0.5, 0.3, 0.2]), [q], [1], nz, 0, never_eog) == [0]
    nz = seed_where(lambda u: u < 0.5)
    assert verify.ratio(const([0.5, 0.3, 0.2], [0.5, 0.3, 0.2]), [q], [1], nz, 0, never_eog)[0] == 1


def test_ratio_residual_falls_back_to_p_when_empty():
    p = Dist.from_probs([0.25, 0.75])
    assert np.allclose(verify.residual(p, Dist.from_probs([0.25, 0.75]), 0).dense(2), [0.25, 0.75])


def test_ratio_eog_ends_the_round():
    p = np.array([0.5, 0.5])
    nz = seed_where(lambda u: True)
    q = Dist.from_probs(p)
    for pos in range(20):
        ids = verify.ratio(const(p, p, p), [q, q], [1, 0], nz, pos, lambda t: t == 1)
        assert ids == [1]  # p = q: kept, and an end-of-generation token ends the round


# -- the output distribution is p (statistical) -----------------------------------------------

def simulate(rule, p1, q1, p2_given, q2_given, n, seed, draft_noise):
    """Two draft positions and a bonus, drafts drawn from q; returns counts of the first two
    emitted tokens as a V x V table (the second token needs a second round when the first
    draft is rejected: a plain target sample from p2). Each sample uses its own positions."""
    nz = Noise(seed)
    V = p1.size
    counts = np.zeros((V, V))
    D = [Dist.from_probs(x) for x in (p1, q1)]
    P2, Q2 = [Dist.from_probs(x) for x in p2_given], [Dist.from_probs(x) for x in q2_given]
    for k in range(n):
        pos = 4 * k
        d1 = D[1].sample(nz, pos, draft_noise)
        d2 = Q2[d1].sample(nz, pos + 1, draft_noise)
        ids = rule(lambda i: (D[0], P2[d1])[i] if i < 2 else D[0], [D[1], Q2[d1]], [d1, d2], nz, pos)
        if len(ids) == 1:  # rejected at position 1: the next round samples the target
            ids.append(P2[ids[0]].sample(nz, pos + 1, TARGET))
        counts[ids[0], ids[1]] += 1
    return counts


def random_dist(rng, V, sharp):
    x = np.exp(sharp * rng.standard_normal(V))
    x[rng.integers(V)] = 0.0  # a hole: q = 0 where p > 0 and the reverse
    return x / x.sum()


@pytest.fixture(scope="module")
def dists():
    rng = np.random.default_rng(42)
    V = 6
    p1, q1 = random_dist(rng, V, 1.5), random_dist(rng, V, 1.5)
    p2 = [random_dist(rng, V, 1.5) for _ in range(V)]
    q2 = [random_dist(rng, V, 1.5) for _ in range(V)]
    joint = p1[:, None] * np.array(p2)
    return p1, q1, p2, q2, joint


def ratio_rule(p_at, qs, draft, nz, pos):
    return verify.ratio(p_at, qs, draft, nz, pos, never_eog)


def coupled_rule(p_at, qs, draft, nz, pos):
    return verify.coupled(p_at, draft, nz, pos, never_eog)


def accept_all(p_at, qs, draft, nz, pos):  # negative control: keep every draft token
    return list(draft) + [p_at(len(draft)).sample(nz, pos + len(draft), TARGET)]


def residual_is_p(p_at, qs, draft, nz, pos):  # negative control: resample from p, not p - q
    ids = []
    for i, tok in enumerate(draft):
        p, q = p_at(i), qs[i]
        if nz.uniform(pos + i, ACCEPT) * q.prob(tok) < p.prob(tok):
            ids.append(tok)
            continue
        return ids + [p.sample(nz, pos + i, RESIDUAL)]
    return ids + [p_at(len(draft)).sample(nz, pos + len(draft), TARGET)]


@pytest.mark.parametrize("rule, draft_noise", [(ratio_rule, DRAFT), (coupled_rule, TARGET), (coupled_rule, DRAFT)])
def test_output_distribution_is_the_target_joint(dists, rule, draft_noise):
    p1, q1, p2, q2, joint = dists
    counts = simulate(rule, p1, q1, p2, q2, 20_000, 7, draft_noise)
    stat, df = gof(counts.ravel(), joint.ravel())
    assert pvalue(stat, df) > ALPHA, (stat, df)


@pytest.mark.parametrize("rule", [accept_all, residual_is_p])
def test_negative_controls_are_rejected(dists, rule):
    p1, q1, p2, q2, joint = dists
    counts = simulate(rule, p1, q1, p2, q2, 20_000, 7, DRAFT)
    stat, df = gof(counts.ravel(), joint.ravel())
    assert pvalue(stat, df) < 1e-6, (stat, df)


def test_coupled_drafts_are_accepted_at_least_at_the_coupling_bound(dists):
    """Daliri et al.: a draft drawn from q with the target's Gumbel noise equals the target's
    token with probability >= (1 - TV) / (1 + TV); a greedy draft with probability p(argmax q)."""
    p1, q1, *_ = dists
    P, Q, nz = Dist.from_probs(p1), Dist.from_probs(q1), Noise(11)
    n = 20_000
    same = sum(P.sample(nz, pos) == Q.sample(nz, pos) for pos in range(n)) / n
    tv = 0.5 * np.abs(p1 - q1).sum()
    assert same >= (1 - tv) / (1 + tv) - 0.01, (same, tv)
    assert same <= 1 - tv + 0.01  # no coupling beats the maximal one
