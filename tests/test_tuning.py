"""The draft-length chooser and the profile cache (decisions, not timings)."""

from __future__ import annotations

import os

import pytest

from specgguf import profiling
from specgguf.tuning import Acceptance, Costs, LengthController, choose_length, expected_tokens


def costs(v0, slope, draft_round=0.0, draft_step=0.0, widths=range(0, 9), block=False):
    c = Costs(block=block)
    for n in widths:
        c.observe_verify(n, v0 + slope * n)
    if draft_round or draft_step:
        c.draft_round, c.draft_step = draft_round, draft_step
    return c


def test_expected_tokens():
    assert expected_tokens([1.0] * 4, 4) == 5
    assert expected_tokens([0.0] * 4, 4) == 1
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)


def test_nothing_pays_means_no_speculation():
    # every verified position costs as much as a whole plain pass, and the draft is not free
    c = costs(10e-3, 10e-3, draft_round=2e-3, draft_step=2e-3)
    assert choose_length(c, [0.9] * 8, 8) == 0


def test_flat_verify_and_certain_acceptance_drafts_the_most():
    c = costs(10e-3, 0.0, draft_round=0.1e-3, draft_step=0.1e-3)
    assert choose_length(c, [0.999] * 8, 8) == 8


def test_monotone_in_acceptance():
    c = costs(10e-3, 1.5e-3, draft_round=0.5e-3, draft_step=0.5e-3)
    chosen = [choose_length(c, [a] * 8, 8) for a in (0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99)]
    assert chosen == sorted(chosen), chosen
    assert chosen[0] == 0 and chosen[-1] > 2


def test_block_drafter_pays_once_per_round():
    c = costs(10e-3, 0.2e-3, draft_round=2e-3, block=True)
    assert c.draft_cost(1) == c.draft_cost(8) == pytest.approx(2e-3)
    assert choose_length(c, [0.95] * 8, 8) == 8


def test_verify_cost_interpolates_and_extends():
    c = Costs()
    c.observe_verify(0, 1.0)
    c.observe_verify(4, 3.0)
    assert c.verify_cost(2) == pytest.approx(2.0)
    assert c.verify_cost(6) == pytest.approx(4.0)


def test_acceptance_learns_and_forgets():
    acc = Acceptance(4, prior=0.5, weight=2.0, decay=0.8)
    for _ in range(20):
        acc.update(4, 4)
    assert acc.rates()[0] > 0.85
    for _ in range(20):
        acc.update(4, 0)
    assert acc.rates()[0] < 0.2
    assert acc.rates()[1] > 0.85 * 0.8 ** 20  # position 2 was not tested: it keeps its (decayed) record


def test_controller_probes_while_the_text_may_change():
    """Drafting would pay if acceptance rose: probe at the base rate."""
    ctl = LengthController(4, costs(10e-3, 1e-3, draft_round=0.5e-3, draft_step=0.5e-3), prior=0.05, probe_every=5)
    picks = [ctl.next_length() for _ in range(10)]
    assert picks.count(0) == 8 and picks[4] > 0 and picks[9] > 0


def test_controller_backs_off_when_costs_rule_drafting_out():
    """Even certain acceptance would not pay (every verified position costs a full pass, the
    draft is not free): probes get ever rarer instead of taxing plain decoding."""
    ctl = LengthController(4, costs(10e-3, 10e-3, draft_round=5e-3, draft_step=5e-3), prior=0.1, probe_every=5)
    picks = [ctl.next_length() for _ in range(80)]
    probes = [i for i, n in enumerate(picks) if n > 0]
    assert probes[:3] == [4, 14, 34]  # after 5, then 10, then 20 idle rounds


def test_profile_cache_misses_when_the_model_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    key = profiling.profile_key(model, "ngram", 2, 0, 0)
    profiling.save(key, costs(1e-3, 1e-4))
    assert profiling.load(profiling.profile_key(model, "ngram", 2, 0, 0)).verify_cost(2) == pytest.approx(1.2e-3)
    model.write_bytes(b"GGUF" + b"\1" * 65)  # a new file at the same path
    os.utime(model, ns=(1, 1))
    assert profiling.load(profiling.profile_key(model, "ngram", 2, 0, 0)) is None
    assert profiling.profile_key(model, "ngram", 4, 0, 0) != profiling.profile_key(model, "ngram", 2, 0, 0)


# -- the engine in auto mode (real llama.cpp) ------------------------------------------------

@pytest.mark.parametrize("draft", ["ngram", "model", "dspark"])
def test_auto_length_keeps_greedy_output(qwen3_target, qwen3_draft, tmp_path, monkeypatch, draft):
    from specgguf.drafters import make_drafter
    from specgguf.engine import Engine
    from specgguf.synthetic import write_dflash, write_qwen3
    from specgguf.target import Target

    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    target_path = write_qwen3(tmp_path / "counting.gguf", counting=True) if draft == "dspark" else qwen3_target
    spec = {"ngram": "ngram", "model": str(qwen3_draft),
            "dspark": str(write_dflash(tmp_path / "ds.gguf", markov=True, counting=True))}[draft]
    with Target(target_path, n_ctx=512) as target:
        prompts = ["The quick brown fox", "def add(a, b):\n    return a + b\n" * 3]
        want = []
        for p in prompts:
            gen = Engine(target, None).generate(target.tokenize(p), 60)
            want.append(list(gen))
        drafter = make_drafter(spec, target, draft_max="auto")
        try:
            engine = Engine(target, drafter, "auto")
            for p, w in zip(prompts, want):
                gen = engine.generate(target.tokenize(p), 60)
                assert list(gen) == w
                assert len(gen.stats.draft_lengths) == gen.stats.rounds
                assert all(0 <= n <= engine.draft_max for n in gen.stats.draft_lengths)
        finally:
            drafter.close()
    assert list((tmp_path / "cache" / "profiles").glob("*.json")), "the measured profile was not saved"
