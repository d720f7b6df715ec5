"""The suffix drafter and the suffix + model hybrid: what a lookup proposes, the bound on the
shared store, greedy output identical to plain decoding on F32 synthetic targets, sampled
output distributed as the target's (chi-square), and the --draft spelling on the CLI."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from chisquare import gof, pvalue, target_probs
from conftest import run_cli
from specgguf.api import SpecGGUF
from specgguf.drafters.suffix import SuffixDrafter, TokenStore
from specgguf.decoding.sampling import SamplingParams
from test_cli import assert_one_line_error

# -- lookups (no model) ----------------------------------------------------------------------


def test_most_frequent_continuation_of_the_longest_match():
    """After [1 2 3] the text went on with 7 twice and 8 once; after the longer [9 1 2 3],
    always with 8: the longest match decides, then frequency among its occurrences."""
    store = TokenStore()
    store.extend([1, 2, 3, 7, 5, 1, 2, 3, 7, 6, 9, 1, 2, 3, 8, 4, 4, 0])
    out, conf = store.lookup([5, 1, 2, 3], 3)
    assert out[0] == 7 and conf[0] < 1.0  # [5 1 2 3]: one occurrence, then [7, 6, 9]
    out, conf = store.lookup([0, 1, 2, 3], 2)
    assert out == [7, 5] or out[0] == 7  # [1 2 3] matched 3 times: 7 (2 of 3) wins
    assert conf[0] == pytest.approx(2 / 3 * (1 - 1 / (2 + 3 + 1)))
    out, _ = store.lookup([9, 1, 2, 3], 4)
    assert out == [8, 4, 4, 0]


def test_confidence_grows_with_the_match():
    d = SuffixDrafter()
    text = list(range(100, 140)) * 3
    d.begin(text[:50])
    draft = d.draft(text[:50], text[50], 50, 64)
    assert draft == text[51:51 + len(draft)] and len(draft) >= 20
    conf = d.last_confidence
    assert len(conf) == len(draft) and conf == sorted(conf) and conf[0] > 0.9


def test_shared_store_is_bounded_and_forgets_the_oldest():
    cap = 500
    d = SuffixDrafter(max_shared_tokens=cap)
    outputs = [[1000 + 97 * i + j for j in range(90)] for i in range(20)]  # 20 distinct outputs
    for out in outputs:
        d.remember(out)
        assert len(d.shared) <= cap
        assert d.shared.entries() <= 2 * cap  # one 2-gram and one 4-gram entry per token at most
    # the index holds exactly what a store built from the kept tokens would
    fresh = TokenStore()
    fresh.extend(d.shared.toks)
    for n, idx in d.shared.index.items():
        assert {k: [p - d.shared.base for p in v] for k, v in idx.items()} == fresh.index[n]
    assert d.shared.lookup(outputs[0][:10], 5) == ([], [])  # the oldest is gone
    assert d.shared.lookup(outputs[-1][:10], 5)[0] == outputs[-1][10:15]  # the newest is there
    d.remember(list(range(5000, 5000 + 3 * cap)))  # longer than the cap: its newest part is kept
    assert len(d.shared) <= cap


# -- the engine on F32 synthetic targets ---------------------------------------------------

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n",
    "Hello, world! How are you today?",
]


def _hybrid(qwen3_draft):
    return f"suffix+{qwen3_draft}"


@pytest.mark.parametrize("draft_max", ["auto", 6])
@pytest.mark.parametrize("kind", ["suffix", "hybrid"])
def test_greedy_output_is_plain_output(qwen3_target, qwen3_draft, tmp_path, monkeypatch, kind, draft_max):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    draft = "suffix" if kind == "suffix" else _hybrid(qwen3_draft)
    with SpecGGUF(qwen3_target, n_ctx=1024) as plain, SpecGGUF(qwen3_target, draft=draft, draft_max=draft_max,
                                                               n_ctx=1024) as spec:
        drafted = 0
        for _ in range(2):  # the second pass drafts from the shared store as well
            for prompt in PROMPTS:
                want = plain.generate(prompt, max_tokens=64).tokens
                got = spec.generate(prompt, max_tokens=64)
                assert got.tokens == want, f"{kind} changed the output for {prompt!r}"
                s = got.stats
                assert s.accepted + s.rounds == s.generated_tokens
                drafted += s.drafted
        assert drafted > 0
        if kind == "hybrid":
            assert spec.drafter.rounds["suffix"] > 0 and spec.drafter.rounds["model"] > 0


def test_a_repeated_request_is_drafted_from_earlier_outputs(qwen3_target, tmp_path, monkeypatch):
    """The same request again (an agent re-asking): the shared store holds the first answer,
    so the second is drafted almost whole and takes a few rounds (a fixed length: no timing
    enters the test)."""
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    with SpecGGUF(qwen3_target, draft="suffix", draft_max=16, n_ctx=1024) as llm:
        first = llm.generate("Hello, world! How are you today?", max_tokens=80)
        second = llm.generate("Hello, world! How are you today?", max_tokens=80)
    assert second.tokens == first.tokens
    assert second.stats.accepted >= 0.8 * second.stats.generated_tokens
    assert second.stats.rounds < first.stats.rounds


def test_hybrid_with_a_hidden_state_draft(counting_target, hidden_drafts, tmp_path, monkeypatch):
    """The hybrid forwards every hook to a DSpark draft (features at the right positions):
    output stays the plain output and the draft's own rounds are still accepted."""
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    prompt = "The quick brown fox. The quick brown fox. The quick brown fox."
    with SpecGGUF(counting_target, n_ctx=512) as plain:
        want = plain.generate(prompt, max_tokens=64).tokens
    with SpecGGUF(counting_target, draft=f"suffix+{hidden_drafts['dspark-counting']}", draft_max=4,
                  n_ctx=512) as spec:
        got = spec.generate(prompt, max_tokens=64)
        assert got.tokens == want
        assert spec.drafter.rounds["model"] > 0 and got.stats.accepted > 0


# -- sampling: the target's distribution (chi-square, as test_sampling_distribution) ------

N_SEEDS = 1200
ALPHA = 1e-3  # as test_sampling_distribution: fixed seeds, so a fixed outcome
MIN_GROUP = 25
REPEAT_PROMPT = "the cat sat on the mat and the cat sat on the mat and the cat sat on the"


def _sample_pairs(llm, prompt, sampling_kw, n_seeds):
    pairs, drafted = [], 0
    stop = llm.target.model.n_vocab
    for seed in range(n_seeds):
        gen = llm.engine.generate(prompt, 2 + seed % 2, sampling=SamplingParams(seed=seed, **sampling_kw))
        toks = list(gen)[:2]
        pairs.append(tuple(toks + [stop] * (2 - len(toks))))
        drafted += gen.stats.drafted
    return pairs, drafted


def _chi_square(llm, prompt, pairs, sampling_kw):
    sp = SamplingParams(**sampling_kw)
    p1 = target_probs(llm, prompt, [], sp)
    first = Counter(t1 for t1, _ in pairs)
    stat, df = gof(np.bincount([t for t, _ in pairs], minlength=p1.size), p1)
    by_first = defaultdict(list)
    for t1, t2 in pairs:
        by_first[t1].append(t2)
    for t1, seconds in by_first.items():
        if first[t1] < MIN_GROUP or t1 == p1.size - 1:
            continue
        s, d = gof(np.bincount(seconds, minlength=target_probs(llm, prompt, [t1], sp).size),
                   target_probs(llm, prompt, [t1], sp))
        stat, df = stat + s, df + d
    return stat, df, pvalue(stat, df)


@pytest.mark.parametrize("kind", ["suffix", "hybrid"])
def test_sampled_output_follows_the_target(synth_dir, qwen3_target, tmp_path, monkeypatch, kind):
    """Suffix drafts are point masses (the ratio rule's q = None); the hybrid mixes them with a
    far draft model's sampled drafts (its q). Both must leave the output distributed as p."""
    from specgguf.synthetic.qwen3 import QwenShape, write_qwen3

    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    if kind == "suffix":
        draft = "suffix"
    else:
        draft = "suffix+" + str(write_qwen3(synth_dir / "qwen3-far-draft-suffix.gguf", QwenShape(), seed=0,
                                            perturb=0.5))
    kw = dict(temperature=1.0, top_k=40, top_p=0.9)
    with SpecGGUF(qwen3_target, draft=draft, draft_max=2, n_ctx=64, n_threads=1) as llm:
        prompt = llm.tokenize(REPEAT_PROMPT)
        pairs, drafted = _sample_pairs(llm, prompt, kw, N_SEEDS)
        stat, df, p = _chi_square(llm, prompt, pairs, kw)
        print(f"{kind}: chi2 {stat:.1f} df {df} p {p:.3g}; {drafted} tokens drafted")
        assert drafted > N_SEEDS // 2  # the drafter really drafted
        if kind == "hybrid":
            assert llm.drafter.rounds["suffix"] > 0 and llm.drafter.rounds["model"] > 0
    assert df >= 20
    assert p > ALPHA, (stat, df, p)


# -- the command line ----------------------------------------------------------------------

def test_cli_hybrid_spelling(qwen3_target, qwen3_draft, tmp_path):
    env = {"SPECGGUF_CACHE": str(tmp_path / "cache")}
    r = run_cli("generate", qwen3_target, "--draft", "suffix", "--draft", qwen3_draft, "--prompt", "a b a b a b",
                "--max-tokens", "16", env=env)
    assert r.returncode == 0, r.stderr
    assert "suffix" in (r.stdout + r.stderr)
    for bad in (["--draft", "ngram", "--draft", "suffix"], ["--draft", "suffix", "--draft-kind", "model"],
                ["--draft", "suffix", "--draft", str(qwen3_draft), "--draft", str(qwen3_draft)]):
        r = run_cli("generate", qwen3_target, *bad, "--prompt", "hi", "--max-tokens", "4", env=env)
        assert_one_line_error(r)
