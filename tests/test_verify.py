"""verify.py on hand-made p and q: no model, exact expectations and one statistical check."""

from __future__ import annotations

import numpy as np
import pytest

from chisquare import gof, pvalue
from specgguf import verify
from specgguf.sampling import sample_from

ALPHA = 1e-3


class Script:
    """A stand-in Generator whose random() returns the given uniforms, in order."""

    def __init__(self, *uniforms):
        self.u = list(uniforms)

    def random(self):
        return self.u.pop(0)


def never_eog(tok):
    return False


def const(*ps):
    vecs = [np.asarray(p, dtype=np.float64) for p in ps]
    return lambda i: vecs[i]


# -- greedy and exact -----------------------------------------------------------------------

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


def test_exact_samples_the_target_and_compares():
    p0, p1 = [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]
    assert verify.exact(const(p0, p1, p0), [1, 2], Script(0.5, 0.5, 0.5), never_eog) == [1, 2, 1]
    assert verify.exact(const(p0, p1), [1, 0], Script(0.5, 0.5), never_eog) == [1, 2]
    # one uniform per emitted token: u picks by cumulative mass
    p = [0.2, 0.3, 0.5]
    assert verify.exact(const(p), [], Script(0.19), never_eog) == [0]
    assert verify.exact(const(p), [], Script(0.21), never_eog) == [1]
    assert verify.exact(const(p), [], Script(0.99), never_eog) == [2]


# -- ratio: hand-made cases -------------------------------------------------------------------

def test_ratio_p_equals_q_accepts_every_draft():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    for _ in range(500):
        draft = [int(rng.integers(4)), int(rng.integers(4))]
        ids = verify.ratio(const(p, p, p), [p, p], draft, rng, never_eog)
        assert ids[:2] == draft and len(ids) == 3  # both kept, then the bonus from p


def test_ratio_q_zero_where_p_positive():
    # q puts no mass on token 0, which p likes; token 2 is q's, p never makes it
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.0, 0.5, 0.5])
    rng = np.random.default_rng(1)
    for _ in range(200):
        # drafting 2 (p = 0): always rejected; the residual max(0, p - q) is all on token 0
        assert verify.ratio(const(p), [q], [2], rng, never_eog) == [0]
        # drafting 1 (p = q): always kept
        assert verify.ratio(const(p, p), [q], [1], rng, never_eog)[0] == 1


def test_ratio_drafted_token_with_q_zero():
    # a drafter that reports q(x) = 0 for its own token: min(1, p/0) = 1 when p(x) > 0
    p = np.array([0.3, 0.7])
    q = np.array([1.0, 0.0])
    assert verify.ratio(const(p, p), [q], [1], Script(0.999, 0.5), never_eog) == [1, 1]
    p0 = np.array([1.0, 0.0])
    assert verify.ratio(const(p0), [q], [1], Script(0.0, 0.5), never_eog) == [0]


def test_ratio_point_mass_q():
    p = np.array([0.3, 0.2, 0.5])
    # accept with probability p(d) = 0.2: u = 0.19 keeps it, u = 0.21 does not
    assert verify.ratio(const(p, p), None, [1], Script(0.19, 0.0), never_eog) == [1, 0]
    assert verify.ratio(const(p, p), [None], [1], Script(0.19, 0.0), never_eog) == [1, 0]
    # rejected: resample from p without the drafted token: 0 w.p. 0.3/0.8, 2 w.p. 0.5/0.8
    assert verify.ratio(const(p), None, [1], Script(0.21, 0.37), never_eog) == [0]
    assert verify.ratio(const(p), None, [1], Script(0.21, 0.38), never_eog) == [2]
    # a point-mass target always keeps its own token
    one = np.array([0.0, 1.0, 0.0])
    assert verify.ratio(const(one, one), None, [1], Script(0.9999, 0.5), never_eog) == [1, 1]


def test_ratio_residual_subtracts_q():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.1, 0.6, 0.3])
    r = verify.residual(p, q, 1)
    assert np.allclose(r, [0.4, 0.0, 0.0])
    # reject 1 (p/q = 0.5, so u = 0.6 rejects): the residual has all its mass on 0
    assert verify.ratio(const(p), [q], [1], Script(0.6, 0.99), never_eog) == [0]
    assert verify.ratio(const(p, p), [q], [1], Script(0.49, 0.99), never_eog) == [1, 2]


def test_ratio_residual_falls_back_to_p_when_empty():
    p = np.array([0.25, 0.75])
    assert np.array_equal(verify.residual(p, p.copy(), 0), p)


def test_ratio_eog_ends_the_round():
    p = np.array([0.5, 0.5])
    ids = verify.ratio(const(p, p, p), [p, p], [1, 0], np.random.default_rng(0), lambda t: t == 1)
    assert ids == [1]


def test_sample_from_never_picks_zero_mass():
    p = np.array([0.0, 0.4, 0.0, 0.6, 0.0])
    picks = {sample_from(p, u) for u in np.linspace(0, 1, 1001)[:-1]}
    assert picks == {1, 3}
    assert sample_from(p, np.nextafter(1.0, 0)) == 3


# -- ratio: the output distribution is p (statistical) ------------------------------------

def simulate(rule, p1, q1, p2_given, q2_given, n, seed):
    """Two draft positions and a bonus, drafts drawn from q; returns counts of the first two
    emitted tokens as a V x V table (the second token needs a second round when the first
    draft is rejected: a plain target sample from p2)."""
    rng = np.random.default_rng(seed)
    V = p1.size
    counts = np.zeros((V, V))
    for _ in range(n):
        d1 = sample_from(q1, rng.random())
        d2 = sample_from(q2_given[d1], rng.random())
        ids = rule(lambda i: (p1, p2_given[d1])[i] if i < 2 else p1, [q1, q2_given[d1]], [d1, d2], rng)
        if len(ids) == 1:  # rejected at position 1: the next round samples the target
            ids.append(sample_from(p2_given[ids[0]], rng.random()))
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


def ratio_rule(p_at, qs, draft, rng):
    return verify.ratio(p_at, qs, draft, rng, never_eog)


def exact_rule(p_at, qs, draft, rng):
    return verify.exact(p_at, draft, rng, never_eog)


def accept_all(p_at, qs, draft, rng):  # negative control: keep every draft token
    return list(draft) + [sample_from(p_at(len(draft)), rng.random())]


def residual_is_p(p_at, qs, draft, rng):  # negative control: resample from p, not p - q
    ids = []
    for i, tok in enumerate(draft):
        p, q = p_at(i), qs[i]
        if rng.random() * q[tok] < p[tok]:
            ids.append(tok)
            continue
        return ids + [sample_from(p, rng.random())]
    return ids + [sample_from(p_at(len(draft)), rng.random())]


@pytest.mark.parametrize("rule", [ratio_rule, exact_rule])
def test_output_distribution_is_the_target_joint(dists, rule):
    p1, q1, p2, q2, joint = dists
    counts = simulate(rule, p1, q1, p2, q2, 20_000, seed=7)
    stat, df = gof(counts.ravel(), joint.ravel())
    assert pvalue(stat, df) > ALPHA, (stat, df)


@pytest.mark.parametrize("rule", [accept_all, residual_is_p])
def test_negative_controls_are_rejected(dists, rule):
    p1, q1, p2, q2, joint = dists
    counts = simulate(rule, p1, q1, p2, q2, 20_000, seed=7)
    stat, df = gof(counts.ravel(), joint.ravel())
    assert pvalue(stat, df) < 1e-6, (stat, df)
