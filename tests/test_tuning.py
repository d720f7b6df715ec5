"""The draft-length chooser and the profile cache (decisions, not timings)."""

from __future__ import annotations

import os

import pytest

from specgguf.decoding import profiling
from specgguf.decoding.calibration import LOOKUP_DOUBT_POWER, Calibration
from specgguf.decoding.tuning import PRIOR_ROW, Acceptance, Costs, LengthController, choose_length, expected_tokens


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
    c.observe_verify(4, 1.2)
    assert c.verify_cost(2) == pytest.approx(1.1)
    assert c.verify_cost(6) == pytest.approx(1.3)  # along the last stretch


def test_unmeasured_wide_widths_look_cheap_enough_to_try():
    """Narrow widths cost more per position than wide ones on a CPU: extended at their slope,
    a 64-wide pass would look too dear to ever be tried (and so never be measured). Past the
    widest measured width the slope is at most the prior's; once measured, the width costs
    what it costs."""
    c = Costs()
    c.observe_verify(0, 1.0)
    c.observe_verify(4, 3.0)  # half a plain pass per position
    assert c.verify_cost(64) == pytest.approx(3.0 + 60 * PRIOR_ROW)
    ctl = LengthController(64, c)
    sure = [0.9] * 64  # a lookup's raw 0.9: 0.99 per token before anything is verified
    assert ctl.cut(sure) > 32
    c.observe_verify(64, 33.0)
    assert c.verify_cost(64) == pytest.approx(33.0) and LengthController(64, c).cut(sure) < 32


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


# -- the measured verify curve and lookup drafts (injected costs, no timing) ------------------

def cpu_curve(n):
    """A CPU-like verify curve (seconds): the per-position cost falls as batches grow."""
    return 10e-3 + 2.0e-3 * n ** 0.6


def test_verify_curve_follows_a_measured_bend():
    """Measured widths are interpolated, not averaged into a line: where the curve bends
    (cheap wide batches), a straight line would over-price the widest drafts."""
    c = Costs()
    for n in (0, 1, 2, 4, 8, 16, 32, 64):
        c.observe_verify(n, cpu_curve(n))
    for n in (3, 12, 48):
        lo, hi = cpu_curve(n), max(cpu_curve(m) for m in (0, 1, 2, 4, 8, 16, 32, 64) if m >= n)
        assert cpu_curve(n) * 0.97 <= c.verify_cost(n) <= hi
    assert c.verify_cost(64) == pytest.approx(cpu_curve(64))
    assert c.verify_cost(100) >= c.verify_cost(64)  # extended monotonically past the widest width


def test_verify_curve_trend_is_monotone_under_noise():
    """Widths never measured follow a monotone trend through noisy measurements; a width
    measured once leans half on that trend, so one noisy round cannot make it look much
    cheaper than its neighbours."""
    c = Costs()
    measured = [(0, 10e-3), (2, 14e-3), (4, 12e-3), (8, 18e-3), (16, 17e-3)]
    for n, v in measured:
        c.observe_verify(n, v)
    unmeasured = [c.verify_cost(n) for n in range(0, 40) if n not in dict(measured)]
    assert all(b >= a for a, b in zip(unmeasured, unmeasured[1:]))
    assert 12e-3 < c.verify_cost(4) < 13e-3  # between its one measurement and the trend (13e-3)


def test_measured_width_keeps_its_own_cost():
    """CPU kernels take a batch in blocks of columns: on the 2-core test machine 4 verified
    positions cost less than 3 (measured: 37 ms against 45 ms). Measured often enough, such
    a width keeps its own cost instead of being averaged into the monotone trend, so the
    chooser can prefer it; widths around it still follow the trend."""
    c = Costs()
    for _ in range(8):
        for n, v in [(0, 14e-3), (1, 27e-3), (2, 45e-3), (3, 37e-3), (7, 59e-3)]:
            c.observe_verify(n, v)
    assert c.verify_cost(3) < c.verify_cost(2)
    assert c.verify_cost(3) == pytest.approx(37e-3, rel=0.1)
    assert c.verify_cost(2) == pytest.approx(45e-3, rel=0.1)
    assert c.verify_cost(3) <= c.verify_cost(5) <= c.verify_cost(7)


def test_a_width_measured_in_a_quick_minute_does_not_hold_long_drafts_back():
    """Seen in a benchmark's profile (Gemma 3 270M, 2 cores): 28 positions measured often at
    6.4 ms each, 38-57 at 8-9.5 ms, hours apart on a machine whose speed drifts by a third.
    Taken as they are, every later copy was cut at 28. A wider batch never costs more per
    position, so those are pooled: a near-certain copy is verified long."""
    c = Costs()
    for _ in range(9):
        c.observe_verify(0, 16e-3)
        c.observe_verify(28, 186e-3)
    for n, v in [(8, 81e-3), (38, 358e-3), (56, 485e-3), (57, 550e-3)]:
        c.observe_verify(n, v)
    extra = [(c.verify_cost(n) - c.verify_cost(0)) / n for n in (28, 38, 57)]
    assert max(extra) - min(extra) < 1e-4 and extra[0] > 6.5e-3
    ctl = LengthController(64, c)
    assert ctl.cut([1 - 1 / (30 + i + 1) for i in range(57)]) > 40


def test_cached_widths_are_rescaled_by_what_this_run_measures():
    """A profile saved on a busier machine: once this run measures some widths at half the
    cached cost, the widths it has not measured yet are halved too (not left to make long
    drafts look too dear to ever try)."""
    cached = Costs()
    for n in (0, 4, 16, 64):
        cached.observe_verify(n, 2 * cpu_curve(n))
    c = Costs.from_dict(cached.to_dict())
    c.observe_verify(0, cpu_curve(0))
    c.observe_verify(4, cpu_curve(4))
    assert c.verify_cost(64) == pytest.approx(cpu_curve(64), rel=0.05)


def test_a_stalled_pass_does_not_poison_the_profile():
    """A pass that took 13 s (the process was stopped mid-pass) was saved in a profile as the
    cost of width 5: it must not rule out every width past 4 in later runs (it did: a width
    never chosen is never measured again). Nor is such a stall stored in the first place."""
    cached = Costs.from_dict({"verify": {"0": 25e-3, "4": 87e-3, "5": 13.48, "10": 131e-3, "23": 0.30}})
    assert cached.verify_cost(5) <= 6 * 25e-3
    assert LengthController(64, cached).cut([0.999] * 64) >= 10
    c = Costs()
    c.observe_verify(0, 25e-3)
    c.observe_verify(5, 13.48)
    assert c.verify[5] <= 2 * 6 * 25e-3
    loaded = Costs.from_dict({"verify": {"0": 25e-3, "8": 0.1}})
    loaded.observe_verify(8, 5.0)  # a first measurement replaces the cache's, within reason
    assert loaded.verify[8] == pytest.approx(0.2)
    drafts = Costs.from_dict({"verify": {"0": 25e-3}, "draft_round": 1e-3, "draft_step": 2e-3})
    drafts.observe_draft(4, 13.0)  # a draft model's stalled round
    assert drafts.draft_cost(4) <= 2 * (1e-3 + 4 * 2e-3) + 1e-9
    for _ in range(3):
        drafts.observe_draft(4, 13.0)
    assert drafts.draft_cost(4) < 0.1


def flat_costs(v0=10e-3, per_row=0.1e-3, widths=(0, 1, 8, 32, 64)):
    c = Costs()
    for n in widths:
        c.observe_verify(n, v0 + per_row * n)
    return c


def test_lookup_cut_long_when_sure_and_cheap():
    ctl = LengthController(64, flat_costs())
    assert ctl.cut([0.99] * 64) == 64


def test_lookup_cut_none_when_verify_is_dear():
    # every verified position costs a whole plain pass: no draft can pay
    ctl = LengthController(64, flat_costs(per_row=10e-3))
    assert ctl.cut([0.9] * 64) == 0


def test_lookup_cut_short_when_unsure():
    ctl = LengthController(64, flat_costs(per_row=1e-3))
    sure, unsure = ctl.cut([0.99] * 64), ctl.cut([0.3] * 64)
    assert unsure < 4 < sure


def test_lookup_cut_follows_the_drafts_own_confidence():
    """Confidence that falls along the draft (the match gets thin): the cut stops where it falls."""
    ctl = LengthController(64, flat_costs(per_row=0.5e-3))
    n = ctl.cut([0.98] * 20 + [0.05] * 44)
    assert 15 <= n <= 21


def test_calibration_corrects_a_boastful_drafter():
    """Raw confidence 0.95, but the drafts are always wrong: within a few rounds the calibrated
    estimate drops and the drafter stops being asked for long drafts."""
    ctl = LengthController(64, flat_costs(per_row=0.3e-3))
    conf = [0.95] * 64
    first = ctl.cut(conf)
    for _ in range(20):
        n = ctl.cut(conf)
        ctl.record(64, n, 0, 0.0, 10e-3 + 0.3e-3 * n, conf[:n])
    assert first > 15 and ctl.cut(conf) <= 1


def test_calibration_by_bins():
    cal = Calibration()
    for _ in range(200):
        cal.update([0.62, 0.62, 0.97], 1)  # 0.62-scored tokens accepted once in two, 0.97 untested
    lo, hi = cal.rates([0.62, 0.97])
    assert lo == pytest.approx(0.5, abs=0.05) and hi == pytest.approx(0.97)


def test_calibration_tells_near_certainties_apart():
    """Over a 64-token draft 0.99 and 0.999 per token are half the draft and nearly all of
    it: a 30-token match (raw 0.97) and a 300-token one (raw 0.997) get bins of their own."""
    cal = Calibration()
    for _ in range(300):
        cal.update([0.97, 0.997], 2)  # both accepted...
        cal.update([0.97], 0)  # ... but 0.97-scored tokens are rejected one time in two
    mid, high = cal.rates([0.97, 0.997])
    assert mid == pytest.approx(0.5, abs=0.05) and high > 0.99


def test_lookup_prior_is_surer_than_the_raw_score_but_keeps_weak_ones_weak():
    """Laplace's rule undersells a lookup match: before anything is verified a 16-token match
    (raw 0.94) is taken for near-certain, a 2-token one (0.67) for likely, and a one-in-three
    guess (0.22) stays a guess. A draft model's probabilities are taken as they are."""
    lookup, model = Calibration(doubt_power=LOOKUP_DOUBT_POWER), Calibration()
    strong, likely, guess = lookup.rates([1 - 1 / 17, 2 / 3, 2 / 9])
    assert strong > 0.99 and 0.85 < likely < 0.92 and guess < 0.45
    assert model.rates([0.94, 0.5]) == pytest.approx([0.94, 0.5])


def test_first_run_drafts_a_copy_whole():
    """A new machine: only the plain pass is measured, nothing calibrated. A copy offers 57
    tokens behind a 16-token match: the lookup prior verifies them all at once, where the raw
    score (0.94 per token) would cut at about a quarter and grow over several rounds, each
    first wider pass a slow one."""
    costs = Costs()
    costs.observe_verify(0, 20e-3)
    conf = [1 - 1 / (16 + i + 1) for i in range(57)]
    assert LengthController(64, costs).cut(conf) == 57
    timid = LengthController(64, costs)
    timid.calibration = Calibration()
    assert timid.cut(conf) < 30


def test_lookup_prior_gives_way_to_rejections():
    """The prior is a pseudo-count: strong-looking matches that verification keeps refusing
    (a text that only looks repetitive) are cut short within a few rounds."""
    ctl = LengthController(64, flat_costs(per_row=0.3e-3))
    conf = [0.94] * 64
    assert ctl.cut(conf) == 64
    for _ in range(6):
        n = ctl.cut(conf)
        ctl.record(64, n, 1, 0.0, 10e-3 + 0.3e-3 * n, conf[:n])
    assert ctl.cut(conf) < 8


def test_calibration_never_trusts_a_surer_score_less():
    """Drafts scored 0.9 were always right: a 0.95 score, never seen yet, is taken for at least
    as much (the first run's rounds lift the long matches before they are drafted)."""
    cal = Calibration()
    assert cal.rates([0.95]) == pytest.approx([0.95])
    for _ in range(50):
        cal.update([0.9] * 4, 4)
    assert cal.rates([0.9])[0] > 0.98 and cal.rates([0.95])[0] > 0.98


def simulate(ctl, true_curve, accept_len, rounds, conf=None):
    """Rounds of a lookup drafter on text where every draft is right for `accept_len` tokens;
    the verify time of a round is true_curve(width), as if measured."""
    conf = conf or [0.9] * 64
    picks = []
    for _ in range(rounds):
        n = ctl.cut(conf)
        k = min(n, accept_len)
        ctl.record(64, n, k, 20e-6, true_curve(n), conf[:n])
        picks.append(n)
    return picks


def test_first_run_calibration_converges():
    """No profile: the prior shape drafts long at once; the rounds measure the real curve, and
    within a few rounds the cut is the one the true costs would choose."""
    def best_under_truth(accept_len):
        rates = [(min(n, accept_len) + 1) / (cpu_curve(n) + 20e-6) for n in range(65)]
        return max(range(65), key=rates.__getitem__)

    ctl = LengthController(64, Costs())
    picks = simulate(ctl, cpu_curve, 64, 30, conf=[0.99] * 64)
    assert picks[0] == 0 and picks[1] >= 32  # a plain round for the baseline, then not timid
    assert picks[-1] == best_under_truth(64) == 64
    # a text whose drafts are right for 6 tokens, verify dearer than the prior guessed
    dear = lambda n: 10e-3 * (1 + 0.5 * n)  # noqa: E731
    ctl = LengthController(64, Costs())
    picks = simulate(ctl, dear, 6, 48, conf=[0.9] * 64)
    # the true best is 6; one round in EXPLORE_EVERY looks further
    assert sum(4 <= n <= 7 for n in picks[-16:]) >= 15, picks
    assert ctl.costs.verify_cost(6) == pytest.approx(dear(6))


def test_verify_curve_is_shared_across_drafters(tmp_path, monkeypatch):
    """What ngram's runs measured seeds suffix's first run (the curve is the target's)."""
    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    store = profiling.ProfileStore(model, "ngram", 2, 0)
    for n in (0, 8, 32):
        store.costs_for(0).observe_verify(n, cpu_curve(n))
    store.save()
    seeded = profiling.ProfileStore(model, "suffix", 2, 0).costs_for(0)
    assert seeded.verify_cost(32) == pytest.approx(cpu_curve(32))
    assert profiling.ProfileStore(model, "suffix", 4, 0).costs_for(0).verify_cost(32) is None


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
    # layers offloaded to RPC servers cost what those machines take: another profile per set
    on_rpc = profiling.profile_key(model, "ngram", 2, 99, 0, ["10.0.0.2:50052"])
    assert on_rpc != profiling.profile_key(model, "ngram", 2, 99, 0)
    assert on_rpc != profiling.profile_key(model, "ngram", 2, 99, 0, ["10.0.0.3:50052"])


def test_sequential_draft_stops_where_its_own_confidence_says_the_rest_will_not_pay():
    """A draft model scores each token as it drafts it (llama.cpp's top-10 probability): with
    cheap verify and a sure draft it drafts the planned length; a token it is unsure of ends
    the draft there when one more costs more than it is expected to bring, and the same
    doubt is no reason to stop where verify is nearly free. With a fixed length (no chooser)
    it drafts on."""
    from specgguf.drafters.base import Drafter

    cheap = LengthController(8, costs(10e-3, 0.2e-3, draft_round=0.1e-3, draft_step=0.2e-3))
    dear = LengthController(8, costs(10e-3, 5e-3, draft_round=0.1e-3, draft_step=1e-3))
    for ctl in (cheap, dear):
        for _ in range(20):
            ctl.acceptance.update(8, 8)  # this text: drafts have been accepted
    assert cheap.keep_drafting([0.95] * 3, 8) and dear.keep_drafting([0.99] * 2, 8)
    assert not dear.keep_drafting([0.95, 0.95, 0.05], 8)
    assert cheap.keep_drafting([0.95, 0.95, 0.3], 8)
    assert not cheap.keep_drafting([0.95] * 8, 8)  # the plan's end
    d = Drafter()
    assert d.keep_drafting([0.01], 8) and not d.keep_drafting([0.9] * 8, 8)
    d.chooser = dear
    assert not d.keep_drafting([0.95, 0.95, 0.05], 8)


def test_sequential_confidence_is_calibrated_by_what_verification_accepts():
    """A boastful draft (sure of every token, right about half of them) is corrected: after
    some rounds its confidence 0.99 is read as about 0.5, and the dear verify then stops it
    early although every token claims 0.99."""
    ctl = LengthController(8, costs(10e-3, 5e-3, draft_round=0.1e-3, draft_step=1e-3))
    for _ in range(20):
        ctl.acceptance.update(8, 8)
    assert ctl.keep_drafting([0.99] * 2, 8)
    for _ in range(200):
        ctl.record(4, 4, 1, 2e-3, 40e-3, None, [0.99] * 4)  # only the first of 4 accepted
    assert ctl.draft_calibration.rates([0.99])[0] < 0.6
    assert not ctl.keep_drafting([0.99] * 2, 8)


def test_lookup_calibration_carries_to_the_next_process(tmp_path, monkeypatch):
    """What verification taught the calibration (a lookup drafter's confident drafts are
    right) is saved with the profile: the next process starts calibrated, not at the raw
    guess. A damaged file is a cache miss, never an error."""
    from specgguf.decoding.calibration import Calibration

    monkeypatch.setenv("SPECGGUF_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 64)
    store = profiling.ProfileStore(model, "ngram", 2, 0)
    cal = store.load_calibration()
    assert cal.rates([0.9]) == pytest.approx([0.9])  # nothing learned: the raw value
    for _ in range(100):
        cal.update([0.9] * 8, 8)  # all accepted
    store.costs_for(0).observe_verify(0, 1e-3)
    store.save()
    again = profiling.ProfileStore(model, "ngram", 2, 0).load_calibration()
    assert again.rates([0.9])[0] > 0.99
    assert profiling.ProfileStore(model, "suffix", 2, 0).load_calibration().rates([0.9]) == pytest.approx([0.9])
    key = profiling.profile_key(model, "ngram", 2, 0, "calibration")
    scale = Calibration.SCALE
    for damage in (f'{{"scale": "{scale}", "bins": 0, "tried": [], "accepted": []}}',
                   f'{{"scale": "{scale}", "bins": 2, "tried": [1, 1], "accepted": [2, 0]}}',
                   '{"bins": 2, "tried": [1, 1], "accepted": [1, 0]}',  # the old, linear bins
                   "not json", '{"bins": 2}'):
        (tmp_path / "cache" / "profiles" / f"{key}.json").write_text(damage)
        assert profiling.ProfileStore(model, "ngram", 2, 0).load_calibration().rates([0.9]) == pytest.approx([0.9])
    assert Calibration.from_dict(Calibration().to_dict()).rates([0.5]) == pytest.approx([0.5])


def test_first_pass_that_wide_is_not_a_cost(qwen3_target):
    """llama.cpp grows its output buffer on the first pass with more outputs than any before
    (on the embedded Gemma: a 64-wide verify took 399 ms the first time, 348 ms after): the
    context flags that pass `cold`, and the cost model does not learn from it."""
    from specgguf.runtime.target import Target

    with Target(qwen3_target, n_ctx=256) as target:
        ctx, batch = target.ctx, target.batch
        seen = []
        for width in (1, 6, 6, 3, 9, 9):
            batch.clear().add_tokens(list(range(10, 10 + width)), 0, "all")
            ctx.decode(batch)
            seen.append(ctx.cold)
            ctx.seq_rm(0)
        batch.clear().add_tokens(list(range(10, 60)), 0, "none")  # a prefill asks for no outputs
        ctx.decode(batch)
        seen.append(ctx.cold)
    assert seen == [False, True, False, False, True, False, False]
    ctl = LengthController(8, Costs())
    ctl.record(4, 4, 4, 1e-4, None, [0.9] * 4)
    assert ctl.costs.verify_cost(4) is None  # nothing measured
    ctl.record(4, 4, 4, 1e-4, 2e-3, [0.9] * 4)
    assert ctl.costs.verify_cost(4) == pytest.approx(2e-3)


# -- the engine in auto mode (real llama.cpp) ------------------------------------------------

@pytest.mark.parametrize("draft", ["ngram", "model", "dspark"])
def test_auto_length_keeps_greedy_output(qwen3_target, qwen3_draft, tmp_path, monkeypatch, draft):
    from specgguf.drafters import make_drafter
    from specgguf.decoding.engine import Engine
    from specgguf.synthetic.qwen3 import write_dflash, write_qwen3
    from specgguf.runtime.target import Target

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


def test_hybrid_takes_the_source_that_pays():
    """Per round, from the same cost model: a long confident suffix match beats the model
    draft; with no match, or a weak one against a model that has been accepted well, the
    model drafts."""
    from specgguf.drafters.base import Drafter
    from specgguf.drafters.hybrid import HybridDrafter
    from specgguf.drafters.suffix import SuffixDrafter

    class Sequential(Drafter):  # stands in for a draft model's proposals (no engine involved)
        kind, max_length = "model", 8

        def draft(self, history, id_last, pos0, n_max, sampler=None):
            return [7] * n_max

    ctl = LengthController(64, flat_costs(per_row=0.3e-3))
    ctl.costs.draft_round, ctl.costs.draft_step = 0.5e-3, 1e-3
    for _ in range(10):
        ctl.acceptance.update(4, 4)  # the model's drafts have been accepted
    h = HybridDrafter(SuffixDrafter(), Sequential())
    h.chooser = ctl
    text = list(range(100, 140)) * 3
    h.begin(text[:70])
    out = h.draft(text[:70], text[70], 70, 64)
    assert h.source == "suffix" and len(out) > 8 and out == text[71:71 + len(out)]
    h.begin([1, 2, 3, 4, 5, 6])  # no match at all
    out = h.draft([1, 2, 3, 4, 5, 6], 9, 6, 64)
    assert h.source == "model" and out and set(out) == {7}
    h.begin([1, 2, 9, 5, 1, 2])  # a 2-token match: weak
    h.draft([1, 2, 9, 5, 1, 2], 9, 6, 64)
    assert h.source == "model"


def test_a_wide_batch_drafts_only_what_is_nearly_certain():
    """Parallel sequences (tuning.best_prefix's batch): a drafted row costs every sequence of
    the pass, so the acceptance a token needs rises with the rows the others bring. A pass of
    15 ms plus 6 ms per row: alone a token pays from about 0.4, beside three plain sequences
    (3 rows, 3 tokens a round) from about 6 / 8.25 = 0.73."""
    from specgguf.decoding.tuning import best_prefix

    c = costs(0.015, 0.006, widths=range(0, 40))
    for p in (0.5, 0.6):
        assert best_prefix(c, [p] * 8, 8)[0] > 0  # alone it drafts
        assert best_prefix(c, [p] * 8, 8, batch=(3, 3.0))[0] == 0  # in the batch it does not
    assert 0 < best_prefix(c, [0.95] * 8, 8, batch=(3, 3.0))[0] < best_prefix(c, [0.95] * 8, 8)[0]  # copying pays, less far
    assert best_prefix(c, [0.95] * 8, 8, batch=(0, 0.0)) == best_prefix(c, [0.95] * 8, 8)
    lengths = LengthController(8, c)
    lengths.batch = (3, 3.0)
    assert lengths.value([0.9] * 8)[0] <= LengthController(8, c).value([0.9] * 8)[0]
