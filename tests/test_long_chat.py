"""Long chats on the real instruct model (SmolLM2-135M-Instruct Q4_1): greedy drafting answers
as plain decoding does, and as llama_cpp.Llama with its defaults does, when the prompt is far
past 512 tokens (issue 29: a 1.6k-token log as the system prompt).

Past 512 KV cells, flash attention's single-token decode on the CPU sums another way than a
verify batch (docs/machines.md): it is off by default here, as in Llama. What still moves
logits is the width of the verify batch (docs/machines.md, "Batch invariance"): on SmolLM2
rows are bit-exact up to width 8 at a short context, 4 at 600 tokens, and past it differ by
up to ~1.4 logits
(the arg-max moved in 1 of 56 differing rows at width 64). With the default `auto` lengths
(verify widths up to 65) these chats give plain's answer token for token on this build;
that is an observation on these prompts, not a guarantee for every chat.
"""

from __future__ import annotations

import pytest

from specgguf.api import SpecGGUF

LOG = "You answer questions about this log of the night shift.\n" + "\n".join(
    f"Entry {i}: the pump at station {i % 7} ran for {i * 3} minutes and reported pressure {100 + i}."
    for i in range(64))
QUESTIONS = ["Which entry comes after entry 12?", "Which station reported pressure 130?"]
N_CTX = 4096
MAX_TOKENS = 32
VERIFY_DRAFT_MAX = "auto"


def chat(question: str) -> list[dict]:
    return [{"role": "system", "content": LOG}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def plain_answers(chat_model_path):
    with SpecGGUF(chat_model_path, n_ctx=N_CTX) as llm:
        out = {}
        for q in QUESTIONS:
            req = llm.prepare({"messages": chat(q), "max_tokens": MAX_TOKENS}, chat=True)
            assert len(req.tokens) > 1500  # far past flash attention's 512-cell split
            gen, text = llm.stream_tokens(req.tokens, MAX_TOKENS)
            out[q] = (gen.tokens, "".join(text))
        return out


# slow: test_lossless.py checks long-context drafting on Gemma in the default tier
@pytest.mark.slow
@pytest.mark.parametrize("draft", ["ngram", "suffix"])
def test_long_chat_greedy_drafting_equals_plain(chat_model_path, plain_answers, draft):
    with SpecGGUF(chat_model_path, draft=draft, draft_max=VERIFY_DRAFT_MAX, n_ctx=N_CTX) as llm:
        drafted = 0
        for q in QUESTIONS:
            req = llm.prepare({"messages": chat(q), "max_tokens": MAX_TOKENS}, chat=True)
            gen, text = llm.stream_tokens(req.tokens, MAX_TOKENS)
            "".join(text)
            drafted += gen.stats.drafted
            assert gen.tokens == plain_answers[q][0], (q, gen.stats.draft_lengths)
        assert drafted > 0


@pytest.mark.slow  # test_lossless's long context checks Llama's agreement past 512 cells in the default tier
def test_long_chat_plain_equals_llama_cpp(chat_model_path, plain_answers):
    from llama_cpp import Llama

    from specgguf.runtime import native

    native.guard_llama_cpp_python()
    ref = Llama(model_path=str(chat_model_path), n_ctx=N_CTX, verbose=False)  # Llama's own defaults
    try:
        for q in QUESTIONS:
            r = ref.create_chat_completion(chat(q), max_tokens=MAX_TOKENS, temperature=0.0)
            assert r["choices"][0]["message"]["content"].strip() == plain_answers[q][1].strip(), q
    finally:
        ref.close()
