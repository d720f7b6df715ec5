"""SamplingParams checks, the logits -> p transform, and sampled generation on real models:
greedy unchanged, seeds reproducible, bad settings refused with one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import run_cli
from specgguf.api import SpecGGUF
from specgguf.errors import UserError
from specgguf.decoding.sampling import Sampler, SamplingParams
from test_cli import assert_one_line_error

# -- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, flag", [
    (dict(temperature=-0.1), "--temperature"), (dict(top_p=0.0), "--top-p"), (dict(top_p=1.5), "--top-p"),
    (dict(top_k=-1), "--top-k"), (dict(min_p=1.5), "--min-p"), (dict(repeat_penalty=0), "--repeat-penalty"),
    (dict(penalty_last_n=-2), "--penalty-last-n"), (dict(seed=-1), "--seed"), (dict(seed=2 ** 64), "--seed"),
    (dict(accept="maybe"), "--accept"),
    (dict(temperature=float("nan")), "--temperature"), (dict(top_k=2.5), "--top-k"),
    (dict(temperature="hot"), "--temperature"),
])
def test_bad_settings_raise_one_line(bad, flag):
    """The Python error names the argument; the command line shows the flag instead."""
    from specgguf.cli.options import flag_message

    with pytest.raises(UserError) as exc:
        SamplingParams(**bad)
    name = next(iter(bad))
    msg = str(exc.value)
    assert msg.startswith(name) and exc.value.param == name and "\n" not in msg
    assert flag_message(exc.value).startswith(flag)


def test_rule_resolution():
    assert SamplingParams().rule == "greedy"
    assert SamplingParams(temperature=0, accept="ratio").rule == "greedy"  # T = 0: every rule is greedy
    assert SamplingParams(temperature=0.7).rule == "coupled"  # the default at T > 0 reproduces
    assert SamplingParams(temperature=0.7, accept="ratio").rule == "ratio"
    assert SamplingParams(temperature=0.7, accept="exact").rule == "exact"
    assert not SamplingParams(repeat_penalty=1.0, presence_penalty=0.0).penalized
    assert not SamplingParams(repeat_penalty=1.3, penalty_last_n=0).penalized
    assert SamplingParams(frequency_penalty=0.5).penalized


# -- the transform -------------------------------------------------------------------------------


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def reference_probs(logits, T, top_k=0, top_p=1.0, min_p=0.0):
    """The documented order, written the slow and obvious way: full sorts, no shortcuts."""
    order = np.argsort(-logits, kind="stable")
    keep = list(order if not top_k else order[:top_k])
    if top_p < 1:
        pr = softmax(logits[keep])
        cum, cut = 0.0, len(keep)
        for j, v in enumerate(pr):  # keep is sorted, so pr is in descending order
            cum += v
            if cum >= top_p:
                cut = j + 1
                break
        keep = keep[:cut]
    if min_p > 0:
        top = max(logits[keep])
        keep = [i for i in keep if logits[i] >= top + np.log(min_p)]
    out = np.zeros_like(logits)
    out[keep] = softmax(logits[keep] / T)
    return out


@pytest.mark.parametrize("T, top_k, top_p, min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.0, 5, 1.0, 0.0), (0.8, 0, 0.5, 0.0), (1.3, 0, 1.0, 0.2),
    (0.9, 20, 0.9, 0.05), (2.0, 3, 0.3, 0.5),
])
def test_probs_follow_the_documented_order(T, top_k, top_p, min_p):
    logits = np.random.default_rng(3).standard_normal(50).astype(np.float32) * 2
    got = Sampler(SamplingParams(temperature=T, top_k=top_k, top_p=top_p, min_p=min_p)).probs(logits)
    want = reference_probs(logits.astype(np.float64), T, top_k, top_p, min_p)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert got.sum() == pytest.approx(1.0)


def test_top_p_before_temperature():
    # llama.cpp's chain cuts top-p on the untempered distribution; a high T must not widen it
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    sharp = Sampler(SamplingParams(temperature=0.1, top_p=0.8)).probs(logits)
    flat = Sampler(SamplingParams(temperature=5.0, top_p=0.8)).probs(logits)
    assert np.count_nonzero(sharp) == np.count_nonzero(flat) == 2


def test_top_p_on_a_large_vocabulary_widens_the_partial_sort():
    # most of the mass in the flat tail: the 256-wide first pass cannot reach top_p
    logits = np.random.default_rng(0).standard_normal(300_000).astype(np.float32) * 0.1
    got = Sampler(SamplingParams(temperature=1.0, top_p=0.9)).probs(logits)
    want = reference_probs(logits.astype(np.float64), 1.0, top_p=0.9)
    assert np.count_nonzero(got) == np.count_nonzero(want) > 256
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_penalties_follow_llama_cpp():
    logits = np.array([2.0, -1.0, 0.5, 3.0])
    s = Sampler(SamplingParams(temperature=1.0, repeat_penalty=2.0, presence_penalty=0.25,
                               frequency_penalty=0.5, penalty_last_n=3))
    # window = the last 3 tokens: [1, 0, 0] (token 3 at the front falls out of it)
    x = s.penalize(logits, [3, 1, 0, 0])
    np.testing.assert_allclose(x, [2.0 / 2 - 2 * 0.5 - 0.25, -1.0 * 2 - 0.5 - 0.25, 0.5, 3.0])
    assert s.window([7, 3, 1, 0], 0) == [1, 0, 0]
    assert Sampler(SamplingParams()).window([1, 2], 3) == []  # penalties off: nothing to look at
    # greedy with a penalty: the arg-max moves
    g = Sampler(SamplingParams(repeat_penalty=10.0))
    assert g.argmax(np.array([1.0, 0.9]), []) == 0
    assert g.argmax(np.array([1.0, 0.9]), [0]) == 1


def test_greedy_probs_are_a_point_mass():
    p = Sampler(SamplingParams(top_p=0.5, top_k=3)).probs(np.array([0.1, 0.7, 0.3]))
    assert p.tolist() == [0.0, 1.0, 0.0]


def test_propose_reports_q_only_for_ratio():
    logits = np.array([0.0, 0.1, 0.2])
    tok, q = Sampler(SamplingParams(temperature=1.0, accept="exact", seed=0)).propose(logits, [], 5)
    assert tok == 2 and q is None
    tok, q = Sampler(SamplingParams(temperature=1.0, accept="ratio", seed=0)).propose(logits, [], 5)
    assert q is not None and q.prob(tok) > 0 and q.probs().sum() == pytest.approx(1.0)
    s = Sampler(SamplingParams(temperature=1.0, seed=0))  # coupled: the target's own keyed sample
    assert s.propose(logits, [], 5) == (s.sample(s.dist(logits), 5), None)


def test_dist_keeps_only_the_support():
    """The sampled path holds the kept tokens only: top-k gives k logits, never a vocabulary."""
    logits = np.random.default_rng(4).standard_normal(262_144).astype(np.float32)
    d = Sampler(SamplingParams(temperature=0.7, top_k=40, top_p=0.95)).dist(logits)
    assert d.ids is not None and len(d) <= 40 and d.z.dtype == np.float64
    full = Sampler(SamplingParams(temperature=0.7)).dist(logits)
    assert full.ids is None and full.z is logits  # no truncation: the logits themselves, no copy
    assert np.allclose(d.dense(logits.size)[d.ids], d.probs())


# -- generation on a real (synthetic) model -----------------------------------------------------

PROMPT = "def add(a, b):\n    return a + b\nfor i in range(10):\n"


def run(llm, sampling, n=40, prompt=PROMPT):
    gen = llm.engine.generate(llm.tokenize(prompt), n, sampling=sampling)
    return list(gen), gen.stats


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_greedy_unchanged(qwen3_target, qwen3_draft, draft):
    spec = str(qwen3_draft) if draft == "model" else draft
    with SpecGGUF(qwen3_target, draft=spec, draft_max=4, n_ctx=512) as llm:
        base, _ = run(llm, None)
        for sp in (SamplingParams(), SamplingParams(accept="ratio", top_p=0.5, seed=1),
                   SamplingParams(accept="exact", top_k=3)):
            assert run(llm, sp)[0] == base
        llm.engine.drafter = None
        assert run(llm, None)[0] == base  # and it is the plain greedy output (F32: no near-ties)


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
@pytest.mark.parametrize("accept", ["coupled", "exact", "ratio"])
def test_same_seed_same_output(qwen3_target, qwen3_draft, draft, accept):
    spec = str(qwen3_draft) if draft == "model" else draft
    with SpecGGUF(qwen3_target, draft=spec, draft_max=4, n_ctx=512) as llm:
        sp = dict(temperature=0.8, top_p=0.95, repeat_penalty=1.1, accept=accept)
        a, sa = run(llm, SamplingParams(seed=11, **sp))
        b, sb = run(llm, SamplingParams(seed=11, **sp))
        c, _ = run(llm, SamplingParams(seed=12, **sp))
    assert a == b and (sa.drafted, sa.accepted) == (sb.drafted, sb.accepted)
    assert a != c  # 40 tokens from a 479-token vocabulary at T = 0.8: equal only by a fluke


def test_penalised_greedy_is_lossless(qwen3_target, qwen3_draft):
    sp = SamplingParams(repeat_penalty=1.5, frequency_penalty=0.2, penalty_last_n=16)
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), draft_max=4, n_ctx=512) as llm:
        fast, stats = run(llm, sp, n=60)
        unpenalised, _ = run(llm, None, n=60)
        llm.engine.drafter = None
        plain, _ = run(llm, sp, n=60)
    assert fast == plain and stats.accepted > 0
    assert fast != unpenalised


def test_ratio_accepts_more_than_exact_with_a_sampling_draft(qwen3_target, qwen3_draft):
    """With a q close to p, sum(min(p, q)) beats p(argmax q): the point of the ratio rule."""
    out = {}
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), draft_max=4, n_ctx=512) as llm:
        for accept in ("exact", "ratio"):
            drafted = accepted = 0
            for seed in range(4):
                _, s = run(llm, SamplingParams(temperature=1.0, seed=seed, accept=accept), n=48)
                drafted, accepted = drafted + s.drafted, accepted + s.accepted
            out[accept] = accepted / drafted
    assert out["ratio"] > out["exact"], out


def test_inspect_says_which_q_ratio_uses():
    import importlib

    from specgguf.inspection import RATIO_Q

    classes = {"model": ("model", "ModelDrafter"), "eagle3": ("eagle3", "Eagle3Drafter"),
               "dflash": ("dflash", "DFlashDrafter"), "dspark": ("dflash", "DFlashDrafter")}
    for kind, (mod, name) in classes.items():
        cls = getattr(importlib.import_module(f"specgguf.drafters.{mod}"), name)
        samples = cls.samples
        assert samples == RATIO_Q[kind].startswith("q = the draft's own"), kind


# -- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["--temperature", "-1"], "--temperature"), (["--top-p", "0"], "--top-p"), (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-1"], "--top-k"), (["--min-p", "2"], "--min-p"), (["--accept", "sometimes"], "--accept"),
    (["--seed", "many"], "--seed"), (["--seed", "-2"], "--seed"), (["--seed", str(2 ** 64)], "--seed"),
])
def test_cli_bad_sampling_settings(qwen3_target, args, needle):
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", *args), needle)


def test_cli_chat_bad_sampling_settings(qwen3_target):
    assert_one_line_error(run_cli("chat", qwen3_target, "--top-p", "1.01"), "--top-p")


def test_cli_inspect_names_the_ratio_q(qwen3_target):
    proc = run_cli("inspect", qwen3_target)
    assert proc.returncode == 0, proc.stderr
    assert "--accept ratio uses q = the draft's own sampled distribution" in proc.stdout


def test_cli_seed_reproducible(qwen3_target):
    """The default rule (coupled) with --draft-max auto (the default): one seed, one text."""
    args = ["generate", qwen3_target, "-p", "The quick brown fox", "-n", "24", "--draft", "ngram", "--json",
            "--temperature", "0.9", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.02", "--repeat-penalty",
            "1.1", "--presence-penalty", "0.1", "--frequency-penalty", "0.1", "--seed", "7"]
    a, b = run_cli(*args), run_cli(*args)
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["tokens"] == json.loads(b.stdout)["tokens"]
    assert len(json.loads(a.stdout)["tokens"]) == 24 and json.loads(a.stdout)["stats"]["seed"] == 7


@pytest.mark.parametrize("seed_args", [[], ["--seed", "-1"]])
def test_cli_without_a_seed_prints_the_drawn_one(qwen3_target, seed_args):
    """No seed (or llama.cpp's -1): one is drawn and shown in the stats; giving it back repeats the run."""
    args = ["generate", qwen3_target, "-p", "The quick brown fox", "-n", "16", "--draft", "ngram",
            "--temperature", "1.0", "--accept", "coupled", "--stats"]
    a = run_cli(*args, *seed_args)
    assert a.returncode == 0, a.stderr
    seed = int(re.search(r"; seed (\d+)", a.stderr).group(1))
    b = run_cli(*args, "--seed", str(seed))
    assert b.returncode == 0 and b.stdout == a.stdout and f"; seed {seed}" in b.stderr
