"""Eagle3, DFlash and DSpark drafts on synthetic qwen3 targets: lossless greedy output, real
acceptance where the draft knows the target's rule, and every pairing check of compat.py
through the CLI (one line, exit 2, and never a llama.cpp abort)."""

from __future__ import annotations

import pytest

from conftest import run_cli
from specgguf.drafters import make_drafter
from specgguf.decoding.engine import Engine
from specgguf.synthetic.qwen3 import DraftShape, QwenShape, write_dflash, write_eagle3, write_qwen3
from specgguf.runtime.target import Target
from test_cli import assert_one_line_error

PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b\n", "Hello, world! How are you today?"]


@pytest.fixture(scope="module")
def kinds_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kinds")


@pytest.fixture(scope="module")
def drafts(kinds_dir, hidden_drafts):
    """conftest's shared synthetic drafts (the counting target comes from there too), plus
    the two only these tests need."""
    h = hidden_drafts
    return {
        "eagle3-own": h["eagle3"], "eagle3-shared": h["eagle3-shared"], "eagle3-counting": h["eagle3-counting"],
        "dflash-own": h["dflash"], "dflash-shared": h["dflash-shared"],
        "dflash-anchor": write_dflash(kinds_dir / "dfa.gguf", sample_from_anchor=True),
        "dspark": write_dflash(kinds_dir / "ds.gguf", markov=True, confidence=True),
        "dspark-counting": h["dspark-counting"], "dspark-counting-shared": h["dspark-counting-shared"],
    }


def _generate(target, drafter, prompt, n=48, draft_max=4):
    gen = Engine(target, drafter, draft_max).generate(target.tokenize(prompt), n)
    for _ in gen:
        pass
    return gen


@pytest.mark.parametrize("target_kind", ["random", "counting"])
@pytest.mark.parametrize("name", ["eagle3-own", "eagle3-shared", "eagle3-counting", "dflash-own", "dflash-shared",
                                  "dflash-anchor", "dspark", "dspark-counting", "dspark-counting-shared"])
def test_lossless(qwen3_target, counting_target, drafts, name, target_kind):
    path = counting_target if target_kind == "counting" else qwen3_target
    with Target(path, n_ctx=512) as target:
        plain = [_generate(target, None, p).tokens for p in PROMPTS]
        drafter = make_drafter(str(drafts[name]), target, draft_max=4)
        try:
            for prompt, want in zip(PROMPTS, plain):
                gen = _generate(target, drafter, prompt)
                assert gen.tokens == want, f"{name} changed the output for {prompt!r}"
                s = gen.stats
                assert s.drafted > 0 and 0 <= s.accepted <= s.drafted
                assert s.accepted + s.rounds == s.generated_tokens
        finally:
            drafter.close()


@pytest.mark.parametrize("name, floor", [("eagle3-counting", 0.8), ("dspark-counting", 0.9),
                                         ("dspark-counting-shared", 0.8)])
def test_drafts_that_know_the_rule_are_accepted(counting_target, drafts, name, floor):
    """Acceptance at the first draft position proves the plumbing: target features reach the
    draft at the right positions (an off-by-one in Eagle3's deferred boundary or in DSpark's
    slot rule drops this to zero)."""
    with Target(counting_target, n_ctx=512) as target:
        drafter = make_drafter(str(drafts[name]), target, draft_max=4)
        try:
            gen = _generate(target, drafter, "The quick brown fox", n=64)
        finally:
            drafter.close()
    assert gen.stats.accepted_by_position[0] >= floor, gen.stats.accepted_by_position


def test_dspark_confidence_threshold_shortens_drafts(qwen3_target, drafts):
    with Target(qwen3_target, n_ctx=512) as target:
        lengths = []
        for p_min in (0.0, 0.999):
            drafter = make_drafter(str(drafts["dspark"]), target, draft_max=4, p_min=p_min)
            try:
                gen = _generate(target, drafter, "The quick brown fox", n=24)
            finally:
                drafter.close()
            lengths.append(gen.stats.drafted)
    assert lengths[1] < lengths[0]


def test_dflash_block_clamped_to_trained_size(qwen3_target, kinds_dir):
    path = write_dflash(kinds_dir / "small-block.gguf", block_size=3)
    with Target(qwen3_target, n_ctx=512) as target:
        drafter = make_drafter(str(path), target, draft_max=8)
        try:
            assert drafter.n_max == 2  # in-place slots: block_size - 1
            gen = _generate(target, drafter, "The quick brown fox", n=12, draft_max=8)
        finally:
            drafter.close()
    assert gen.stats.drafted <= 2 * gen.stats.rounds


def test_cli_runs_kinds(counting_target, drafts):
    proc = run_cli("generate", counting_target, "-p", "The quick brown fox", "-n", "16",
                   "--draft", drafts["dspark-counting"], "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"accepted": 0' not in proc.stdout


# -- checks before llama.cpp: one line, exit 2, no abort -----------------------------------

def test_gemma3_target_refused_before_llama_cpp(gemma_path, drafts):
    for name in ("eagle3-own", "dflash-own", "dspark"):
        proc = run_cli("generate", gemma_path, "-p", "hi", "--draft", drafts[name])
        assert_one_line_error(proc, "gemma3", "hidden states")  # llama.cpp would abort (exit 134)


def test_layer_ids_out_of_range(qwen3_target, kinds_dir):
    e3 = write_eagle3(kinds_dir / "e3-far.gguf", layers=(2, 3, 9))
    df = write_dflash(kinds_dir / "df-far.gguf", layers=(1, 4))
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", e3), "layer 9")
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", df), "[4]")


def test_dflash_width_differs(kinds_dir):
    wide = write_qwen3(kinds_dir / "wide.gguf", QwenShape(n_embd=128))
    df = write_dflash(kinds_dir / "df64.gguf")
    assert_one_line_error(run_cli("generate", wide, "-p", "hi", "--draft", df), "width")


def test_eagle3_target_hidden_size_differs(qwen3_target, kinds_dir):
    e3 = write_eagle3(kinds_dir / "e3-wide.gguf", target_hidden_size=128)
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", e3), "width 128")


def test_vocabulary_size_differs(kinds_dir):
    small = write_qwen3(kinds_dir / "small-vocab.gguf", QwenShape(n_merges=100))
    df = write_dflash(kinds_dir / "df-v.gguf")
    assert_one_line_error(run_cli("generate", small, "-p", "hi", "--draft", df), "vocabulary")


def test_token_texts_differ(kinds_dir):
    swapped = write_qwen3(kinds_dir / "swapped.gguf", tokenizer={"swap": (300, 301)})
    e3 = write_eagle3(kinds_dir / "e3-v.gguf")
    assert_one_line_error(run_cli("generate", swapped, "-p", "hi", "--draft", e3), "token texts", "300")


def test_missing_mask_token(qwen3_target, kinds_dir):
    df = write_dflash(kinds_dir / "df-nomask.gguf", tokenizer={"mask": False})
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", df), "mask token")


def test_draft_kind_override_must_fit(qwen3_target, drafts):
    assert_one_line_error(run_cli("generate", qwen3_target, "-p", "hi", "--draft", drafts["eagle3-own"],
                                  "--draft-kind", "dflash"), "eagle3 draft")


def test_inspect_explains_kind_and_fit(qwen3_target, drafts):
    proc = run_cli("inspect", drafts["dspark"], "--target", qwen3_target)
    assert proc.returncode == 0, proc.stderr
    assert "kind 'dspark'" in proc.stdout and "sample-from-anchor" in proc.stdout
    assert "fits target" in proc.stdout


@pytest.mark.parametrize("flash_attn", [False, True, None])
@pytest.mark.parametrize("name", ["model", "eagle3-own", "dflash-own"])
def test_draft_context_follows_the_targets_flash_attention(qwen3_target, qwen3_draft, drafts, name, flash_attn):
    """A draft context asks llama.cpp for the target's flash attention setting, as llama.cpp's
    speculative driver gives its draft the target's -fa. With the draft left at llama.cpp's auto
    (on, on the CPU) beside a target run without it, a near-tie in the draft's logits broke
    round-for-round parity with llama-speculative-simple on an AVX2-only CPU."""
    path = qwen3_draft if name == "model" else drafts[name]
    with Target(qwen3_target, flash_attn=flash_attn) as target:
        drafter = make_drafter(str(path), target, draft_max=4)
        try:
            assert target.ctx.flash_attn == (None if flash_attn is None else int(flash_attn))
            assert drafter.ctx.flash_attn == target.ctx.flash_attn
            assert len(_generate(target, drafter, PROMPTS[0], n=8).tokens) == 8
        finally:
            drafter.close()
