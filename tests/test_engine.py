"""The loop's bookkeeping, stop conditions and text handling, on real models."""

from __future__ import annotations

import pytest

from specgguf.api import SpecGGUF
from specgguf.drafters.ngram import NgramDrafter
from specgguf.errors import UserError


def assert_consistent(stats, finish_reason):
    assert 0 <= stats.accepted <= stats.drafted
    # every round commits its accepted drafts plus the target's own token; an end-of-
    # generation token is not output, so a final stop may leave one token uncounted
    slack = stats.accepted + stats.rounds - stats.generated_tokens
    assert slack == 0 or (finish_reason == "stop" and slack == 1), (slack, finish_reason)
    assert all(0.0 <= a <= 1.0 for a in stats.accepted_by_position)
    if stats.rounds:
        assert stats.tau == pytest.approx((stats.accepted + stats.rounds) / stats.rounds)


@pytest.mark.parametrize("draft", [None, "ngram", "model"])
def test_stats_consistent(qwen3_target, qwen3_draft, draft):
    spec = str(qwen3_draft) if draft == "model" else draft
    with SpecGGUF(qwen3_target, draft=spec, draft_max=5, n_ctx=512) as llm:
        for prompt in ["The quick brown fox", "def add(a, b):\n    return a + b\n" * 3]:
            r = llm.generate(prompt, max_tokens=50)
            assert r.finish_reason in ("length", "stop")
            assert len(r.tokens) == r.stats.generated_tokens <= 50
            assert_consistent(r.stats, r.finish_reason)
            if draft is None:
                assert r.stats.drafted == 0 and r.stats.rounds == r.stats.generated_tokens


def test_stats_gemma_model_draft(gemma_path, gemma_draft_path):
    with SpecGGUF(gemma_path, draft=str(gemma_draft_path), draft_max=4, n_ctx=512) as llm:
        r = llm.generate("The capital of France is", max_tokens=40)
    assert r.stats.drafted > 0 and r.stats.accepted > 0  # a real draft of the same family agrees often
    assert_consistent(r.stats, r.finish_reason)
    assert len(r.stats.accepted_by_position) == 4


def test_max_tokens_never_overshoots(qwen3_target):
    with SpecGGUF(qwen3_target, draft=str(qwen3_target), draft_max=8, n_ctx=512) as llm:
        for n in (1, 2, 7, 9):
            r = llm.generate("The quick brown fox", max_tokens=n)
            assert len(r.tokens) == n and r.finish_reason == "length"
        assert llm.generate("The quick", max_tokens=0).tokens == []


def test_context_full_is_a_clean_stop(qwen3_target):
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=256) as llm:
        prompt = llm.tokenize("hello world " * 40)
        gen, text = llm.stream_tokens(prompt, max_tokens=10_000)
        "".join(text)
        n_ctx = llm.target.n_ctx
    assert gen.finish_reason == "context"
    # every cell is used; the newest token needs none (it would be decoded next)
    assert len(prompt) + len(gen.tokens) == n_ctx + 1


def test_stop_string_across_tokens(gemma_path):
    with SpecGGUF(gemma_path, draft="ngram", n_ctx=512) as llm:
        full = llm.generate("Count: one, two, three, four, five,", max_tokens=24).text
        assert len(full) > 12
        stop = full[5:12]  # a string that very likely spans several tokens
        r = llm.generate("Count: one, two, three, four, five,", max_tokens=24, stop=[stop])
    assert r.text == full[: full.index(stop)]
    assert r.finish_reason == "stop"


def test_empty_prompt_rejected(qwen3_target):
    with SpecGGUF(qwen3_target, n_ctx=256) as llm:
        with pytest.raises(UserError):
            llm.engine.generate([], 5)


def test_ngram_finds_latest_longest_match():
    d = NgramDrafter(ngram_min=1, ngram_max=3)
    d.reset()
    d.begin([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    assert d.draft([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 7, 12, 4) == [8, 5, 2, 3]  # (2,3,7) -> 8 ...
    assert d.draft([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 9, 12, 2) == [1, 2]  # (3, 9) -> 1, 2
    assert d.draft([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3], 42, 12, 4) == []  # unseen token


def test_ngram_learns_committed_tokens():
    d = NgramDrafter(ngram_min=2, ngram_max=2)
    d.reset()
    d.begin([4, 5])
    assert d.draft([4, 5], 6, 2, 3) == []
    assert d.draft([4, 5, 6, 4], 5, 4, 3) == [6, 4, 5]  # (4, 5) seen at the start, continues with 6


def test_ngram_is_less_sure_where_the_text_went_several_ways():
    """A token behind an n-gram that was followed by different tokens in the text (a JSON key
    with many values) is scored as one guess among those; the draft itself is llama.cpp's."""
    d = NgramDrafter(ngram_min=2, ngram_max=2)
    text = [7, 1, 2, 3, 4, 8, 1, 2, 5, 6, 9, 2, 3, 4]  # (1, 2) -> 3 and 5; (2, 3) -> 4 only
    d.begin(text)
    assert d.draft(text, 8, len(text), 3) == [1, 2, 5]  # (4, 8) -> 1, 2, 5
    assert d.draft(text + [8], 1, len(text) + 1, 2) == [2, 5]  # (8, 1) -> 2, 5
    d.begin(text + [8, 1])
    assert d.draft(text + [8, 1], 2, len(text) + 2, 2) == [5, 6]  # (1, 2) -> 5 (its latest), 6
    # the match reaches 6 tokens back (2 3 4 8 1 2); (1, 2) went two ways, (2, 5) one
    assert d.last_confidence == pytest.approx([(1 - 1 / 7) / 2, 1 - 1 / 8])
    d.begin(text + [9])
    assert d.draft(text + [9], 2, len(text) + 1, 2) == [3, 4]  # (9, 2) -> 3, 4: one way each
    assert d.last_confidence == pytest.approx([1 - 1 / 3, 1 - 1 / 4])
