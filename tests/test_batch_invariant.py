"""The batch-invariant mode (issue 29; runtime/invariance.py, docs/machines.md "Batch invariance"):
on the real quantised targets (Gemma 3 270M Q4_K_M, SmolLM2-135M-Instruct Q4_1), with prompts
past 512 and past 2048 tokens, greedy output with every drafter kind equals plain greedy output
token for token, and seeded `coupled` sampling equals plain sampling with the seed. What the
mode cannot make invariant (an F32 target: llamafile's sgemm from 2 rows) is measured, reported
and refused, never silently run.
"""

from __future__ import annotations

import json

import pytest

from specgguf.api import SpecGGUF
from specgguf.decoding.engine import Engine
from specgguf.drafters import make_drafter
from specgguf.runtime.invariance import PROBE_WIDTHS

from conftest import run_cli

N_CTX = 2600
MAX_TOKENS = 40
ENTRIES = [f"Entry {i}: the pump at station {i % 7} ran for {i * 3} minutes and reported pressure {100 + i}."
           for i in range(160)]


def log_prompt(n_entries: int) -> str:
    body = "\n".join(ENTRIES[:n_entries])
    return f"The night shift log.\n{body}\nThe same log, copied again:\nEntry 0:"


@pytest.fixture(scope="module")
def prompts(gemma_path):
    """A prompt past 512 tokens and one past 2048 (Gemma's tokenizer; SmolLM2's is close)."""
    with SpecGGUF(gemma_path, n_ctx=N_CTX) as llm:
        short, long = log_prompt(24), log_prompt(95)
        assert 512 < len(llm.tokenize(short)) < 1024, len(llm.tokenize(short))
        assert 2048 < len(llm.tokenize(long)) < N_CTX - MAX_TOKENS - 1, len(llm.tokenize(long))
    return [short, long]


def run(llm, prompt: str, **options):
    """The finished generation of `prompt` (its tokens and stats)."""
    gen, text = llm.stream_tokens(llm.tokenize(prompt), MAX_TOKENS, **options)
    "".join(text)
    return gen


def drafts_for(model: str, gemma_draft_path, chat_model_path):
    # a model draft: the requantized Gemma for Gemma; SmolLM2 drafting for itself (same vocabulary)
    return ["ngram", "suffix", str(gemma_draft_path if model == "gemma" else chat_model_path)]


def test_greedy_drafting_equals_plain_past_512(gemma_path, gemma_draft_path, prompts):
    """The default tier's share of the sweep below: Gemma, the prompt past 512, n-gram and model
    drafts at a fixed 8 (verify width 9, past every kernel switch at 8) and auto (widths up to 65)."""
    with SpecGGUF(gemma_path, n_ctx=N_CTX, batch_invariant=True) as llm:
        tokens = llm.tokenize(prompts[0])
        want = run(llm, prompts[0], speculate=False).tokens
        for draft in ("ngram", str(gemma_draft_path)):
            for draft_max in ("auto", 8):
                drafter = make_drafter(draft, llm.target, draft_max=draft_max)
                try:
                    res = Engine(llm.target, drafter, draft_max).generate(tokens, MAX_TOKENS)
                    got = list(res)
                finally:
                    drafter.close()
                assert got == want, (draft, draft_max, res.stats.draft_lengths)
                assert res.stats.drafted > 0 and res.stats.batch_invariant


# The whole sweep reads a 2.5k-token prompt on reference kernels per model (40 s for SmolLM2 here)
@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma", "smollm2"])
def test_greedy_drafting_equals_plain_past_512_and_2048(model, prompts, gemma_path, chat_model_path,
                                                        gemma_draft_path):
    """One batch-invariant target per model serves every drafter's engine: each prompt is read
    once, by the plain run, and each drafted run takes it from the prompt cache, so what is checked is what drafting changes: every verify batch, at widths up to
    65 (auto) and 9 (a fixed 8), gives the tokens one-token decoding gives. Reading each prompt
    again per drafter (seven instances per model) cost 470 s of this file and checked no more:
    in this mode a prompt's cells are the same whichever instance reads it."""
    path = gemma_path if model == "gemma" else chat_model_path
    with SpecGGUF(path, n_ctx=N_CTX, batch_invariant=True) as llm:
        target = llm.target
        assert target.verify_width == max(PROBE_WIDTHS)  # every probed width is exact on this build
        for prompt in prompts:  # each prompt stays in the live context for every drafter's run
            tokens = llm.tokenize(prompt)
            want = run(llm, prompt, speculate=False).tokens
            for draft in drafts_for(model, gemma_draft_path, chat_model_path):
                for draft_max in ("auto", 8):  # auto: verify widths up to 65; 8: width 9, past every kernel switch at 8
                    drafter = make_drafter(draft, target, draft_max=draft_max)
                    try:
                        res = Engine(target, drafter, draft_max).generate(tokens, MAX_TOKENS)
                        got = list(res)
                    finally:
                        drafter.close()
                    assert got == want, (model, draft, draft_max, res.stats.draft_lengths)
                    assert res.stats.cached_tokens == len(tokens) - 1  # the prompt came from the cache
                    assert res.stats.drafted > 0
                    assert res.stats.batch_invariant and res.stats.verify_width == max(PROBE_WIDTHS)
                    assert max(res.stats.draft_lengths, default=0) <= res.stats.verify_width - 1


def test_seeded_coupled_sampling_equals_plain_sampling(gemma_path, prompts):
    sampling = {"temperature": 1.0, "seed": 7}
    with SpecGGUF(gemma_path, draft="ngram", n_ctx=N_CTX, batch_invariant=True) as llm:
        for prompt in prompts:
            plain = run(llm, prompt, sampling=sampling, speculate=False)
            spec = run(llm, prompt, sampling=sampling)
            assert spec.stats.drafted > 0
            assert spec.tokens == plain.tokens


def test_a_target_that_is_not_invariant_is_measured_and_refused(qwen3_target):
    # F32 matrices take llamafile's sgemm from 2 rows, which the reference flag does not reach
    with SpecGGUF(qwen3_target, batch_invariant=True) as plain:
        assert plain.target.verify_width == 1
        assert plain.generate("hello", 4).stats.batch_invariant
    with pytest.raises(ValueError, match="batch-invariant mode: on this target a verify batch of 2 rows"):
        SpecGGUF(qwen3_target, draft="ngram", batch_invariant=True)


def test_a_fixed_draft_wider_than_the_invariant_width_is_refused(chat_model_path):
    with pytest.raises(ValueError, match=r"draft_max 65 needs verify batches of 66 rows.*use at most 64"):
        SpecGGUF(chat_model_path, draft="ngram", draft_max=65, batch_invariant=True)


def test_cli_reports_the_mode_and_refuses_flash_attention_off(chat_model_path):
    out = run_cli("generate", str(chat_model_path), "-p", "one, two, three, four,", "-n", "16", "--draft", "ngram",
                  "--batch-invariant", "--json")
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert stats["batch_invariant"] is True and stats["verify_width"] == max(PROBE_WIDTHS)
    bad = run_cli("generate", str(chat_model_path), "-p", "x", "--batch-invariant", "--flash-attn", "off")
    assert bad.returncode == 2 and "drop --flash-attn off" in bad.stderr and "Traceback" not in bad.stderr
    gpu = run_cli("generate", str(chat_model_path), "-p", "x", "--batch-invariant", "--gpu-layers", "1")
    assert gpu.returncode == 2 and "runs the target on the CPU" in gpu.stderr
