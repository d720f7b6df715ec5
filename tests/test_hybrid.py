"""Speculation on hybrid targets (issue 42; decoding/rollback.py, docs/loop.md §10): layers with a
recurrent state (LFM2's short convolutions, Qwen3.5's gated DeltaNet) beside attention layers.

On the synthetic F32 counting targets of both archs, greedy speculative output equals plain
greedy output and llama_cpp.Llama's with every drafter, at a draft length whose rejected tails
fit the context's recurrent-state snapshots (n_rs_seq) and one whose tails do not (a
checkpoint restore and re-decode); the stats show which rollback ran. Seeded sampling equals
plain sampling; the prompt cache, saved states and parallel slots answer as a fresh instance.
"""

from __future__ import annotations

import threading

import pytest

from specgguf.api import SpecGGUF
from specgguf.loading import MAX_SNAPSHOTS
from test_parallel import together

ARCHS = ["lfm2", "qwen35"]
N_CTX = 512
MAX_TOKENS = 60
# token ids that count, then count again from the start: a lookup finds the continuation, and
# the counting target follows it except where its layers tip a near-tie; "44 .. 49" is seen last
# going on otherwise, so an n-gram lookup there drafts a wrong tail (partial rejections)
PROMPT = list(range(20, 80)) + list(range(44, 50)) + [300, 301, 302, 303] + list(range(20, 45))


@pytest.fixture(scope="module", params=ARCHS)
def hybrid(request, hidden_drafts):
    """One arch's counting target (conftest.py), a quantised variant of it as a recurrent
    `model` draft, and hidden-state drafts (the counting ones know its successor rule)."""
    arch = request.param
    target = request.getfixturevalue(f"{arch}_target")
    drafts = {"ngram": "ngram", "suffix": "suffix", "model": str(request.getfixturevalue(f"{arch}_draft")),
              "eagle3": str(hidden_drafts["eagle3-counting"]), "dflash": str(hidden_drafts["dflash"]),
              "dspark": str(hidden_drafts["dspark-counting"])}
    with SpecGGUF(target, n_ctx=N_CTX) as plain:
        want = plain.generate(PROMPT, max_tokens=MAX_TOKENS)
    return {"arch": arch, "target": target, "drafts": drafts, "want": want}


def test_plain_decoding_equals_llama_cpp(hybrid):
    import llama_cpp

    llm = llama_cpp.Llama(str(hybrid["target"]), n_ctx=N_CTX, verbose=False)
    try:
        out = llm.create_completion(PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    finally:
        llm.close()
    assert out["choices"][0]["text"] == hybrid["want"].text


@pytest.mark.parametrize("draft", ["ngram", "suffix", "model", "eagle3", "dflash", "dspark"])
@pytest.mark.parametrize("draft_max", [4, 24])
def test_greedy_speculation_is_lossless(hybrid, draft, draft_max):
    """draft_max 4: every rejected tail fits the snapshots; 24 (> MAX_SNAPSHOTS): tails longer
    than n_rs_seq are taken back from a checkpoint (drafts that can be that long)."""
    with SpecGGUF(hybrid["target"], draft=hybrid["drafts"][draft], draft_max=draft_max, n_ctx=N_CTX) as spec:
        got = spec.generate(PROMPT, max_tokens=MAX_TOKENS)
    assert got.tokens == hybrid["want"].tokens
    rb = got.stats.rollback
    assert got.stats.drafted > 0 and rb is not None and rb["mode"] == "snapshots"
    assert rb["n_rs_seq"] == min(draft_max, MAX_SNAPSHOTS)
    if draft != "suffix":  # the suffix lookup weighs both continuations and never guesses wrong here
        assert rb["snapshot_rollbacks"] + rb["restores"] > 0, "no draft was ever rejected: nothing rolled back"
    if draft_max > MAX_SNAPSHOTS and draft in ("ngram", "suffix", "model", "eagle3"):
        assert rb["restores"] > 0 and rb["redecoded_tokens"] > 0  # a tail past the snapshots
    if draft_max <= MAX_SNAPSHOTS:
        assert rb["restores"] == 0
    if draft in ("ngram", "model", "eagle3", "dspark"):
        assert got.stats.accepted > 0


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_auto_lengths_are_lossless_and_price_the_rollback(hybrid, draft):
    with SpecGGUF(hybrid["target"], draft=hybrid["drafts"][draft], n_ctx=N_CTX) as spec:
        got = spec.generate(PROMPT, max_tokens=MAX_TOKENS)
    assert got.tokens == hybrid["want"].tokens
    assert got.stats.rollback["n_rs_seq"] == MAX_SNAPSHOTS


@pytest.mark.parametrize("draft", ["ngram", "model", "dspark"])
def test_seeded_sampling_equals_plain_sampling(hybrid, draft):
    sampling = dict(temperature=0.8, seed=7)
    with SpecGGUF(hybrid["target"], n_ctx=N_CTX) as plain:
        want = plain.generate(PROMPT, max_tokens=40, **sampling).tokens
    with SpecGGUF(hybrid["target"], draft=hybrid["drafts"][draft], draft_max=4, n_ctx=N_CTX) as spec:
        got = spec.generate(PROMPT, max_tokens=40, **sampling)
    assert got.tokens == want and got.stats.drafted > 0


@pytest.mark.parametrize("draft", ["ngram", "model", "eagle3", "dspark"])
def test_prompt_cache_and_saved_states(hybrid, draft):
    """A conversation that goes on from the last answer reads only its new tokens; one that
    branches after the first prompt goes on from the checkpoint saved there; a saved state
    loads back. Every answer is a fresh instance's."""
    target = hybrid["target"]
    with SpecGGUF(target, draft=hybrid["drafts"][draft], draft_max=4, n_ctx=N_CTX) as spec:
        first = spec.generate(PROMPT, max_tokens=30)
        extended = PROMPT + first.tokens + list(range(100, 130))
        second = spec.generate(extended, max_tokens=30)
        branched = PROMPT + list(range(200, 230))
        third = spec.generate(branched, max_tokens=30)
        saved = spec.save_state()
        spec.generate(list(range(300, 360)), max_tokens=10)  # something else in between
        spec.load_state(saved)
        again = branched + third.tokens + [7, 8, 9]
        fourth = spec.generate(again, max_tokens=20)
    # (eagle3 keeps its deferred boundary of the last pass and of prompt ends: no token less)
    assert second.stats.cached_tokens == len(PROMPT) + len(first.tokens) - 1
    assert third.stats.cached_tokens == len(PROMPT) - 1  # the checkpoint after the first prompt
    assert fourth.stats.cached_tokens == len(branched) + len(third.tokens) - 1
    with SpecGGUF(target, n_ctx=N_CTX) as fresh:
        for prompt, got, n in [(extended, second, 30), (branched, third, 30), (again, fourth, 20)]:
            assert got.tokens == fresh.generate(prompt, max_tokens=n).tokens


@pytest.mark.parametrize("draft", ["ngram", "model", "dspark"])
def test_parallel_slots_answer_as_alone(hybrid, draft):
    prompts = [PROMPT, list(range(120, 170)) + list(range(120, 140)), list(range(30, 60)) * 2]
    with SpecGGUF(hybrid["target"], draft=hybrid["drafts"][draft], draft_max=4, n_ctx=N_CTX) as ref:
        want = [ref.generate(p, max_tokens=40).tokens for p in prompts]
    with SpecGGUF(hybrid["target"], draft=hybrid["drafts"][draft], draft_max=4, n_ctx=N_CTX, n_parallel=2) as llm:
        got = together(llm, prompts, max_tokens=40)
    assert [r.tokens for r in got] == want
    assert sum(r.stats.accepted for r in got) > 0


def test_serve_parallel_with_the_openai_client(hybrid):
    """`serve --parallel 2` on the hybrid target: concurrent answers equal the answers alone,
    and a request that extends an earlier one reuses its cached state."""
    import openai

    from serverproc import start_server

    target = hybrid["target"]
    texts = ["The quick brown fox jumps over the lazy dog. " * 3 + "The quick brown fox",
             "def add(a, b):\n    return a + b\n" * 3 + "def add(a, b):\n"]
    with SpecGGUF(target, draft="ngram", n_ctx=N_CTX) as ref:
        want = [ref.generate(t, max_tokens=30).text for t in texts]
    with start_server(target, "--draft", "ngram", "--ctx", N_CTX, "--parallel", 2) as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
        out: dict = {}

        def ask(i):
            out[i] = c.completions.create(model="m", prompt=texts[i], max_tokens=30, temperature=0).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [out.get(i) for i in range(len(texts))] == want
        longer = texts[0] + out[0] + " and then"
        r = c.completions.create(model="m", prompt=longer, max_tokens=20, temperature=0)
        cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached and cached > 0
    with SpecGGUF(target, n_ctx=N_CTX) as fresh:
        assert r.choices[0].text == fresh.generate(longer, max_tokens=20).text


@pytest.mark.parametrize("draft_max", [4, 24, "auto"])
def test_own_mtp_block_is_lossless(qwen35_mtp_target, draft_max):
    """`--draft mtp` on a qwen35 target drafts with its own NextN block (drafters/mtp.py:
    NextNDrafter): greedy and seeded output equal plain decoding's, drafts are accepted and
    rejected (the target's layers tip near-ties its block does not), and a second prompt that
    goes on from the first reuses the cache."""
    with SpecGGUF(qwen35_mtp_target, n_ctx=N_CTX) as plain:
        want = plain.generate(PROMPT, max_tokens=MAX_TOKENS).tokens
        sampled = plain.generate(PROMPT, max_tokens=40, temperature=0.8, seed=3).tokens
        with SpecGGUF(qwen35_mtp_target, draft="mtp", draft_max=draft_max, n_ctx=N_CTX) as spec:
            got = spec.generate(PROMPT, max_tokens=MAX_TOKENS)
            assert got.tokens == want
            assert got.stats.drafted > got.stats.accepted > 0
            assert spec.generate(PROMPT, max_tokens=40, temperature=0.8, seed=3).tokens == sampled
            longer = PROMPT + want[:20] + [5, 6, 7]
            again = spec.generate(longer, max_tokens=20)
        assert again.stats.cached_tokens == len(PROMPT) - 1  # the checkpoint at the first prompt's end
        assert again.tokens == plain.generate(longer, max_tokens=20).tokens


def test_own_mtp_block_refusals(lfm2_target, qwen35_target, qwen35_mtp_target):
    from conftest import run_cli
    from test_cli import assert_one_line_error

    assert_one_line_error(run_cli("generate", lfm2_target, "-p", "hi", "-n", "4", "--draft", "mtp"),
                          "lfm2", "qwen35")
    assert_one_line_error(run_cli("generate", qwen35_target, "-p", "hi", "-n", "4", "--draft", "mtp"),
                          "no MTP layers")
    with pytest.raises(ValueError, match="one sequence"):
        SpecGGUF(qwen35_mtp_target, draft="mtp", n_ctx=N_CTX, n_parallel=2)
    assert_one_line_error(run_cli("generate", qwen35_mtp_target, "-p", "hi", "-n", "4", "--draft", "suffix",
                                  "--draft", "mtp"), "nothing else")


def test_ram_state_cache_on_hybrids(hybrid):
    """--cache-ram (prompt_cache_bytes): a conversation that another one pushed out of the live
    context comes back from its saved state (recurrent state included) and answers as fresh."""
    target, draft = hybrid["target"], hybrid["drafts"]["ngram"]
    a, b = PROMPT, list(range(150, 250))
    with SpecGGUF(target, draft=draft, draft_max=4, n_ctx=N_CTX, prompt_cache_bytes=64 << 20) as spec:
        first = spec.generate(a, max_tokens=20)
        spec.generate(b, max_tokens=20)  # cuts the live context: a's state is saved first
        back = a + first.tokens + [7, 8, 9]
        again = spec.generate(back, max_tokens=20)
    assert again.stats.cached_tokens >= len(a)
    with SpecGGUF(target, n_ctx=N_CTX) as fresh:
        assert again.tokens == fresh.generate(back, max_tokens=20).tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_invariant_mode_on_quantised_hybrids(arch, request):
    """--batch-invariant measures its verify width on a hybrid too (the width probe goes back
    through a checkpoint, runtime/invariance.py); on the Q8_0 variants every answer is plain's."""
    target = request.getfixturevalue(f"{arch}_draft")  # the Q8_0 counting variant
    with SpecGGUF(target, n_ctx=N_CTX) as plain:
        want = plain.generate(PROMPT, max_tokens=40).tokens
    with SpecGGUF(target, draft="ngram", n_ctx=N_CTX, batch_invariant=True) as spec:
        got = spec.generate(PROMPT, max_tokens=40)
    assert got.tokens == want and got.stats.verify_width > 1 and got.stats.drafted > 0


def write_llada(path):
    """A tiny LLaDA GGUF (llama.cpp's `llada`: a llama-shaped diffusion LM whose context keeps
    no memory at all): the synthetic qwen3 weights without the per-head q/k norms."""
    import gguf

    from specgguf.synthetic.qwen3 import QwenShape, add_tokenizer, finish_gguf, qwen3_weights

    shape = QwenShape()
    w = gguf.GGUFWriter(str(path), "llada")
    for add, value in ((w.add_context_length, shape.n_ctx_train), (w.add_embedding_length, shape.n_embd),
                       (w.add_block_count, shape.n_layer), (w.add_feed_forward_length, shape.n_ff),
                       (w.add_head_count, shape.n_head), (w.add_head_count_kv, shape.n_head_kv),
                       (w.add_layer_norm_rms_eps, 1e-6), (w.add_file_type, 0)):
        add(value)
    n_vocab = add_tokenizer(w, shape.n_merges)
    weights = {k: v for k, v in qwen3_weights(shape, n_vocab, 0).items() if not k.endswith(("attn_q_norm.weight", "attn_k_norm.weight"))}
    return finish_gguf(w, weights, path)


def test_a_memoryless_target_is_refused_with_a_draft(tmp_path, qwen3_draft):
    """A context with no memory (no KV cells, no recurrent state: LLaDA, Dream, the BERTs) cannot
    take back a rejected draft; llama.cpp's loops refuse it (COMMON_CONTEXT_SEQ_RM_TYPE_NO), and
    so does specgguf, with one line, for every kind of draft."""
    from conftest import run_cli
    from specgguf.runtime import native
    from test_cli import assert_one_line_error

    path = write_llada(tmp_path / "llada.gguf")
    with native.Model(path) as m, native.Context(m, n_ctx=64) as c:
        assert c.rollback == "none"
    for draft in ("ngram", "suffix", str(qwen3_draft)):
        assert_one_line_error(run_cli("generate", str(path), "-p", "hi", "-n", "4", "--draft", draft),
                              "keeps no cache", "without --draft")
