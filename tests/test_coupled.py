"""Keyed noise and the coupled rule: the same seed gives the same text with every drafter and
every draft length (auto included), and coupled/exact output is plain sampled decoding's,
token for token, on F32 synthetic targets (no near-ties between batch shapes there)."""

from __future__ import annotations

import numpy as np
import pytest

from chisquare import gof, pvalue
from specgguf import noise
from specgguf.api import SpecGGUF
from specgguf.sampling import Dist, Sampler, SamplingParams

PROMPT = "def add(a, b):\n    return a + b\nfor i in range(10):\n"
SAMPLED = {"T0.7": dict(temperature=0.7, top_k=40, top_p=0.9), "T1.0": dict(temperature=1.0, top_k=80, top_p=0.95)}

# -- the keyed generator ---------------------------------------------------------------------


def test_noise_is_a_function_of_seed_position_purpose_and_token():
    a, b = noise.Noise(7), noise.Noise(7)
    ids = np.array([0, 5, 262143, 17])
    assert np.array_equal(a.bits(3, noise.TARGET, ids), b.bits(3, noise.TARGET, ids))
    # a token's number does not depend on which other tokens are asked for, nor on how
    full = a.bits(3, noise.TARGET, None, 262144)
    assert np.array_equal(full[ids], a.bits(3, noise.TARGET, ids))
    assert np.array_equal(a.bits(3, noise.TARGET, ids[:2]), a.bits(3, noise.TARGET, ids)[:2])
    others = [a.bits(4, noise.TARGET, ids), a.bits(3, noise.DRAFT, ids), noise.Noise(8).bits(3, noise.TARGET, ids)]
    for o in others:
        assert not np.any(o == a.bits(3, noise.TARGET, ids))
    assert a.uniform(3, noise.ACCEPT) == b.uniform(3, noise.ACCEPT) != a.uniform(4, noise.ACCEPT)


def test_uniforms_are_uniform_and_never_0_or_1():
    nz = noise.Noise(0)
    u = noise._uniform(nz.bits(0, noise.TARGET, None, 200_000))
    assert 0 < u.min() and u.max() < 1
    stat, df = gof(np.histogram(u, bins=50, range=(0, 1))[0], np.full(50, 1 / 50))
    assert pvalue(stat, df) > 1e-3
    us = np.array([nz.uniform(p, noise.ACCEPT) for p in range(20_000)])
    stat, df = gof(np.histogram(us, bins=20, range=(0, 1))[0], np.full(20, 1 / 20))
    assert pvalue(stat, df) > 1e-3


@pytest.mark.parametrize("scale", [1.0, 1 / 0.7, 0.5])
def test_pruned_gumbel_argmax_equals_the_full_computation(scale):
    rng = np.random.default_rng(1)
    nz = noise.Noise(123)
    for pos in range(40):
        z = (rng.standard_normal(100_000) * rng.uniform(0.2, 4)).astype(np.float32)
        got = noise.gumbel_argmax(z, scale, None, nz, pos, noise.TARGET)
        g = noise._gumbel(nz.bits(pos, noise.TARGET, None, z.size))
        assert got == int(np.argmax(z.astype(np.float64) * scale + g)), pos
        ids = np.sort(rng.choice(262144, 6000, replace=False))
        got = noise.gumbel_argmax(z[:6000], scale, ids, nz, pos, noise.TARGET)
        assert got == int(np.argmax(z[:6000].astype(np.float64) * scale + noise._gumbel(nz.bits(pos, 0, ids))))


def test_gumbel_max_samples_the_distribution():
    p = np.array([0.05, 0.15, 0.3, 0.5])
    d, nz = Dist.from_probs(p), noise.Noise(3)
    counts = np.bincount([d.sample(nz, pos) for pos in range(20_000)], minlength=4)
    stat, df = gof(counts, p)
    assert pvalue(stat, df) > 1e-3, counts


def test_seeds_out_of_range_are_refused():
    from specgguf.errors import UserError

    SamplingParams(temperature=1.0, seed=2 ** 64 - 1)
    SamplingParams(temperature=1.0, seed=0)
    for bad in (-1, 2 ** 64, 1.5, True, "7"):
        with pytest.raises(UserError, match=r"^--seed must be a whole number in \[0, 2\*\*64 - 1\]"):
            SamplingParams(temperature=1.0, seed=bad)


def test_no_seed_draws_one_and_reports_it(qwen3_target):
    with SpecGGUF(qwen3_target, draft="ngram", draft_max="auto", n_ctx=512) as llm:
        first = llm.engine.generate(llm.tokenize(PROMPT), 24, sampling=SamplingParams(temperature=1.0))
        toks = list(first)
        seed = first.stats.seed
        assert isinstance(seed, int) and first.stats.to_dict()["seed"] == seed
        again = llm.engine.generate(llm.tokenize(PROMPT), 24, sampling=SamplingParams(temperature=1.0, seed=seed))
        assert list(again) == toks
        greedy = llm.engine.generate(llm.tokenize(PROMPT), 4)
        list(greedy)
        assert greedy.stats.seed is None  # nothing random: no seed to report


# -- the same seed, the same text -------------------------------------------------------------


def _tokens(llm, sp, n=48, prompt=PROMPT):
    gen = llm.engine.generate(llm.tokenize(prompt), n, sampling=sp)
    return list(gen), gen.stats


@pytest.fixture(scope="module")
def drafts(qwen3_draft, hidden_drafts, qwen3_target, counting_target, synth_dir):
    """(target, draft) per drafter kind, on the random target (sampling there is really
    random); "dspark-counting" on the counting target, whose rule that draft knows (its
    drafts are accepted, but the target is so sure that sampling there is deterministic)."""
    from specgguf.synthetic import write_dflash

    dspark = synth_dir / "dspark-random.gguf"
    if not dspark.exists():
        write_dflash(dspark, markov=True, confidence=True)
    return {"ngram": (qwen3_target, "ngram"), "model": (qwen3_target, str(qwen3_draft)),
            "dspark": (qwen3_target, str(dspark)),
            "dspark-counting": (counting_target, str(hidden_drafts["dspark-counting"])),
            "eagle3": (qwen3_target, str(hidden_drafts["eagle3"])),
            "dflash": (qwen3_target, str(hidden_drafts["dflash"]))}


@pytest.mark.parametrize("config", list(SAMPLED))
@pytest.mark.parametrize("kind", ["ngram", "model", "dspark"])
def test_same_seed_same_text_with_auto_lengths(drafts, kind, config):
    """The default rule with --draft-max auto: five runs, one text (the lengths that auto
    picks come from timings and may differ from run to run; the text may not)."""
    target, draft = drafts[kind]
    sp = SamplingParams(seed=2024, **SAMPLED[config])
    with SpecGGUF(target, draft=draft, draft_max="auto", n_ctx=512) as llm:
        runs = [_tokens(llm, sp) for _ in range(5)]
        other, _ = _tokens(llm, SamplingParams(seed=2025, **SAMPLED[config]))
    texts = {tuple(t) for t, _ in runs}
    assert len(texts) == 1, [s.draft_lengths for _, s in runs]
    assert len(runs[0][0]) == 48 and other != runs[0][0]


@pytest.mark.parametrize("draft_max", [1, 4, "auto"])
@pytest.mark.parametrize("kind", ["ngram", "model", "dspark", "dspark-counting", "eagle3", "dflash"])
def test_coupled_output_is_plain_sampling(drafts, kind, draft_max):
    target, draft = drafts[kind]
    with SpecGGUF(target, n_ctx=512) as plain_llm:
        plain = {(c, seed): _tokens(plain_llm, SamplingParams(seed=seed, **SAMPLED[c]), n=40)[0]
                 for c in SAMPLED for seed in (1, 2)}
    drafted = accepted = 0
    with SpecGGUF(target, draft=draft, draft_max=draft_max, n_ctx=512) as llm:
        for (c, seed), want in plain.items():
            for accept in ("coupled", "exact"):
                got, stats = _tokens(llm, SamplingParams(seed=seed, accept=accept, **SAMPLED[c]), n=40)
                assert got == want, (c, seed, accept)
                drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > 0 or (kind == "ngram" or draft_max == "auto")
    if kind in ("model", "dspark-counting") and draft_max != "auto":
        assert accepted > 0


def test_coupled_accepts_more_than_exact_with_a_sampling_draft(qwen3_target, qwen3_draft):
    """The model draft samples with the target's noise under coupled, drafts greedily under
    exact: at T = 1 the coupled drafts match the target's samples far more often."""
    rates = {}
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), draft_max=4, n_ctx=512) as llm:
        for accept in ("exact", "coupled"):
            d = a = 0
            for seed in range(4):
                _, s = _tokens(llm, SamplingParams(temperature=1.0, seed=seed, accept=accept), n=48)
                d, a = d + s.drafted, a + s.accepted
            rates[accept] = a / d
    assert rates["coupled"] > rates["exact"] + 0.1, rates


def test_propose_draws_with_the_targets_noise():
    logits = np.random.default_rng(5).standard_normal(300).astype(np.float32)
    s = Sampler(SamplingParams(temperature=0.8, top_k=50, seed=9))
    for pos in range(20):
        tok, q = s.propose(logits, [], pos)
        assert q is None and tok == s.sample(s.dist(logits), pos)  # same logits: the target's own token


# -- Gemma (Q4_K_M): the same seed, the same text; where coupled leaves plain, a near-tie -----

GEMMA_PROMPT = "Write the numbers from one to forty, separated by commas: one, two, three,"


@pytest.mark.parametrize("config", list(SAMPLED))
def test_gemma_same_seed_same_text(gemma_path, config):
    sp = SamplingParams(seed=7, **SAMPLED[config])
    with SpecGGUF(gemma_path, draft="ngram", draft_max="auto", n_ctx=512) as llm:
        runs = [_tokens(llm, sp, n=40, prompt=GEMMA_PROMPT) for _ in range(5)]
    assert len({tuple(t) for t, _ in runs}) == 1, [s.draft_lengths for _, s in runs]
