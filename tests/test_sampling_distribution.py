"""Speculative sampling emits the target's distribution: a test that fails when a rule is wrong.

A synthetic qwen3 target and a draft deliberately unlike it (weights perturbed by 50%: the
draft and target agree on only ~30-60% of the probability mass, so rejections and residual
draws are frequent). Over many seeds the engine generates the first two tokens; their
empirical joint distribution is compared with the exact target distribution, computed
from the target's own logits with the same transform: p(t1 | prompt) and, for every t1 seen
often enough, p(t2 | prompt, t1). The statistic is Pearson's chi-square summed over the
marginal of t1 and the conditionals of t2 (independent given the t1 counts), at a fixed
significance. Half the seeds stop at two tokens (one draft, then the bonus token from p),
half at three (two drafts: the second drawn from q given the first), so both the bonus
and a second draft position are covered.

Negative controls run the same harness with wrong rules and must be rejected: accepting
every draft token, and resampling a rejection from p instead of the residual max(0, p - q);
for coupled, accepting every (noise-coupled) draft, and a Gumbel-max that forgets the
temperature.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

import specgguf.decoding.engine as engine_mod
import specgguf.decoding.verify as verify_mod
from chisquare import gof, pvalue, target_probs
from specgguf.decoding import noise as noise_mod
from specgguf.api import SpecGGUF
from specgguf.decoding.sampling import SamplingParams
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3
from specgguf.decoding.verify import ratio as real_ratio

ALPHA = 1e-3  # each configuration passes when p > ALPHA; seeds are fixed, so the outcome is too
N_SEEDS = 1600
MIN_GROUP = 25  # a conditional of t2 needs this many samples of its t1 to be tested
PROMPT = "The quick brown fox"

CONFIGS = {  # two temperatures, and top-p (with top-k and min-p) at the higher one
    "T0.35": dict(temperature=0.35),
    "T1.0-top_p": dict(temperature=1.0, top_k=40, top_p=0.8, min_p=0.02),
}


@pytest.fixture(scope="module")
def llm(synth_dir, qwen3_target):
    far_draft = write_qwen3(synth_dir / "qwen3-far-draft.gguf", QwenShape(), seed=0, perturb=0.5)
    with SpecGGUF(qwen3_target, draft=str(far_draft), draft_max=2, n_ctx=64, n_threads=1) as spec:
        yield spec


def sample_pairs(llm, sampling_kw, accept, n_seeds):
    prompt = llm.tokenize(PROMPT)
    pairs, drafted, accepted = [], 0, 0
    stop = llm.target.model.n_vocab  # the cell of "generation ended" (see target_probs)
    for seed in range(n_seeds):
        sp = SamplingParams(seed=seed, accept=accept, **sampling_kw)
        gen = llm.engine.generate(prompt, 2 + seed % 2, sampling=sp)
        toks = list(gen)[:2]
        # an end-of-generation token ends the text: it is emitted but not yielded
        pairs.append(tuple(toks + [stop] * (2 - len(toks))))
        drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
    return pairs, accepted / max(drafted, 1)


def chi_square(llm, pairs, sampling_kw):
    """(statistic, df, p-value) of the pairs against the target's exact joint distribution."""
    prompt = llm.tokenize(PROMPT)
    sp = SamplingParams(**sampling_kw)
    p1 = target_probs(llm, prompt, [], sp)
    first = Counter(t1 for t1, _ in pairs)
    stat, df = gof(np.bincount([t for t, _ in pairs], minlength=p1.size), p1)
    by_first = defaultdict(list)
    for t1, t2 in pairs:
        by_first[t1].append(t2)
    for t1, seconds in by_first.items():
        if first[t1] < MIN_GROUP or t1 == p1.size - 1:  # nothing follows a stop
            continue
        p2 = target_probs(llm, prompt, [t1], sp)
        s, d = gof(np.bincount(seconds, minlength=p2.size), p2)
        stat, df = stat + s, df + d
    return stat, df, pvalue(stat, df)


@pytest.mark.parametrize("accept", ["ratio", "exact", "coupled"])
@pytest.mark.parametrize("config", [pytest.param(c, marks=pytest.mark.slow) if c == "T0.35" else c for c in CONFIGS])
def test_first_tokens_follow_the_target(llm, config, accept):
    kw = CONFIGS[config]
    pairs, acceptance = sample_pairs(llm, kw, accept, N_SEEDS)
    stat, df, p = chi_square(llm, pairs, kw)
    print(f"{config} {accept}: chi2 {stat:.1f} df {df} p {p:.3g}; acceptance {acceptance:.2f}")
    assert df >= 20  # enough cells that the test has teeth
    assert p > ALPHA, (stat, df, p)


def accept_every_draft(p_at, qs, draft, noise, pos, is_eog):
    return list(draft) + [p_at(len(draft)).sample(noise, pos + len(draft))]


def accept_every_coupled_draft(p_at, draft, noise, pos, is_eog):
    return accept_every_draft(p_at, None, draft, noise, pos, is_eog)


def residual_is_p(p_at, qs, draft, noise, pos, is_eog):
    """min(1, p/q) acceptance, but a rejection resamples from p instead of max(0, p - q)."""
    def p_not_residual(p, q, tok):
        return p

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(verify_mod, "residual", p_not_residual)
        return real_ratio(p_at, qs, draft, noise, pos, is_eog)


def test_point_masses_are_always_exact(llm, monkeypatch):
    """Not a negative control: a sampled draft verified as if it were a point mass (a drafter
    that does not expose its q) is still exact, only accepted less often."""
    monkeypatch.setattr(engine_mod, "accept_ratio",
                        lambda p_at, qs, draft, noise, pos, is_eog: real_ratio(p_at, None, draft, noise, pos, is_eog))
    kw = CONFIGS["T0.35"]
    pairs, _ = sample_pairs(llm, kw, "ratio", N_SEEDS // 2)
    stat, df, p = chi_square(llm, pairs, kw)
    assert p > ALPHA, (stat, df, p)


@pytest.mark.parametrize("wrong_rule", [accept_every_draft, residual_is_p])
def test_the_test_rejects_wrong_rules(llm, monkeypatch, wrong_rule):
    monkeypatch.setattr(engine_mod, "accept_ratio", wrong_rule)
    kw = CONFIGS["T0.35"]
    pairs, _ = sample_pairs(llm, kw, "ratio", N_SEEDS // 2)
    stat, df, p = chi_square(llm, pairs, kw)
    print(f"{wrong_rule.__name__}: chi2 {stat:.1f} df {df} p {p:.3g}")
    assert p < 1e-6, (stat, df, p)


def test_the_test_rejects_wrong_coupled_rules(llm, monkeypatch):
    kw = CONFIGS["T0.35"]
    monkeypatch.setattr(engine_mod, "accept_coupled", accept_every_coupled_draft)
    pairs, _ = sample_pairs(llm, kw, "coupled", N_SEEDS // 2)
    stat, df, p = chi_square(llm, pairs, kw)
    print(f"coupled, every draft kept: chi2 {stat:.1f} df {df} p {p:.3g}")
    assert p < 1e-6, (stat, df, p)


def test_the_test_rejects_gumbel_max_without_temperature(llm, monkeypatch):
    kw = CONFIGS["T0.35"]
    real = noise_mod.gumbel_argmax
    monkeypatch.setattr(noise_mod, "gumbel_argmax",
                        lambda z, scale, ids, nz, pos, purpose: real(z, 1.0, ids, nz, pos, purpose))
    pairs, _ = sample_pairs(llm, kw, "coupled", N_SEEDS // 2)
    stat, df, p = chi_square(llm, pairs, kw)
    print(f"coupled, Gumbel-max at T = 1: chi2 {stat:.1f} df {df} p {p:.3g}")
    assert p < 1e-6, (stat, df, p)
