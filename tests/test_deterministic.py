"""Deterministic draft lengths (docs/loop.md §2.4): with a seed, or deterministic=True, auto
lengths depend on the text and the seed only, so separate processes draft alike and, on a
quantised target whose logits move with the verify batch's width, still give one text."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from specgguf import SpecGGUF
from specgguf.decoding.tuning import LengthController, prior_costs

ISSUE_PROMPT = "Write the numbers from one to forty separated by commas: one, two, three, four, five,"


def _seeded_run(target, tokens: int, *extra) -> dict:
    proc = run_cli("generate", str(target), "-p", ISSUE_PROMPT, "--draft", "ngram", "--max-tokens", tokens,
                   "--temperature", "1.0", "--seed", "7", "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("which", ["gemma_q4_k_m", "qwen3_f32"])
def test_seeded_runs_in_two_processes_draft_alike_and_give_one_text(which, request):
    """The issue's command, in two processes: one text, one list of draft lengths."""
    target = request.getfixturevalue("gemma_path" if which == "gemma_q4_k_m" else "qwen3_target")
    first, second = (_seeded_run(target, 40) for _ in range(2))
    assert first["stats"]["lengths"] == "deterministic" and first["stats"]["deterministic"] is True
    assert first["stats"]["draft_lengths"] == second["stats"]["draft_lengths"]
    assert first["stats"]["rounds_detail"] == second["stats"]["rounds_detail"]
    assert first["tokens"] == second["tokens"] and first["text"] == second["text"]


def test_frozen_costs_ignore_timing():
    """Whatever the rounds measured, the frozen prior chooses the same lengths."""
    choices = []
    for seconds in (0.001, 5.0):
        ctl = LengthController(8, prior_costs(), prior=0.7)
        picked = []
        for accepted in (2, 0, 3, 1, 4, 0, 0, 2):
            n = ctl.next_length()
            picked.append(n)
            ctl.record(n, n, min(accepted, n), seconds, seconds * (1 + n))
            picked.append(ctl.cut([0.9, 0.8, 0.5, 0.3]))
        assert ctl.costs.verify == {0: 1.0} and ctl.costs.draft_round == 0.0
        choices.append(picked)
    assert choices[0] == choices[1]


def test_api_reports_the_length_policy_and_refuses_a_non_boolean(qwen3_target):
    with pytest.raises(ValueError, match="deterministic must be True or False"):
        SpecGGUF(qwen3_target, draft="ngram", deterministic="yes")
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=512) as llm:
        assert llm.generate("a b c", max_tokens=4).stats.lengths == "auto"
        seeded = llm.generate("a b c", max_tokens=4, temperature=0.8, seed=3).stats
        assert seeded.lengths == "deterministic" and seeded.to_dict()["deterministic"] is True
        # a seeded run neither reads nor writes the profile's costs
        assert not llm.engine.profile._dirty
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=512, deterministic=True) as llm:
        assert llm.generate("a b c", max_tokens=4).stats.lengths == "deterministic"
    with SpecGGUF(qwen3_target, draft="ngram", draft_max=3, n_ctx=512) as llm:
        stats = llm.generate("a b c", max_tokens=4).stats
        assert stats.lengths == "fixed" and stats.deterministic


def test_cli_refuses_nothing_silently_for_deterministic_without_a_draft(qwen3_target):
    """--deterministic with plain decoding holds trivially: the run says so."""
    proc = run_cli("generate", str(qwen3_target), "-p", "a b c", "--max-tokens", "3", "--deterministic", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert stats["lengths"] == "none" and stats["deterministic"] is True


def test_doctor_shows_the_flash_attention_default_and_the_width_switches():
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["flash_attention"].startswith("off by default")
    inv = r["batch_invariance"]
    assert inv["known_invariant"] is False and inv["switches"] and "width_invariance.py" in inv["measure"]
    text = run_cli("doctor").stdout
    assert any(line.startswith("batch invariance") for line in text.splitlines())
