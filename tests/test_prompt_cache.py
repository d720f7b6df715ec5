"""The prompt cache (decoding/promptcache.py): a generation keeps what the last one left in the
caches. Every check compares with a FRESH instance on the same file, which reads the whole
prompt into empty caches: the cache may change only how much is read, never the output."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from specgguf.api import SpecGGUF
from ties import assert_same_or_near_tie
from specgguf.decoding.engine import MIN_REUSE, Engine
from specgguf.decoding.promptcache import SavedState, StateCache, common_prefix
from specgguf.drafters import make_drafter
from specgguf.errors import UserError
from specgguf.runtime.target import Target

N = 24  # tokens per generation


def _ids(seed: int, n: int, vocab: int = 400) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def _sequence(base: list[int]) -> list[list[int]]:
    """Prompts that meet every case in turn: the first; an extension of it; a partial overlap;
    one shorter than what is cached; the same prompt again; one diverging at token 0."""
    more = _ids(7, 40)
    return [
        base,
        base + more,  # extends the last prompt (but not the last output)
        base[:len(base) // 2] + _ids(8, 30),  # shares half
        base[:50],  # shorter than the cached tokens
        base[:50],  # the same again: nothing to read but the last token
        base[:20],  # a common prefix too short to keep
        _ids(9, 50),  # nothing in common
        _ids(9, 50) + [5, 6, 7],
    ]


def _fresh(path, draft, prompt, **kw):
    with SpecGGUF(str(path), draft=draft, n_ctx=512, **kw) as llm:
        return llm.generate(prompt, max_tokens=N)


def test_common_prefix():
    assert common_prefix(None, [1, 2]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    long = list(range(5000))
    assert common_prefix(long, long[:3000] + [-1]) == 3000
    assert common_prefix(long, long) == 5000


@pytest.mark.parametrize("draft", [None, "ngram", "suffix", "model"])
def test_reuse_equals_fresh_synthetic(qwen3_target, qwen3_draft, draft):
    """F32 synthetic target: every prompt of the sequence gives exactly a fresh instance's output,
    and the cached counts are the common prefixes (minus nothing: the last token is always read)."""
    spec = {"model": str(qwen3_draft)}.get(draft, draft)
    prompts = _sequence(_ids(1, 120))
    with SpecGGUF(str(qwen3_target), draft=spec, draft_max=4, n_ctx=512) as llm:
        held: list[int] = []
        for prompt in prompts:
            got = llm.generate(prompt, max_tokens=N)
            want = _fresh(qwen3_target, spec, prompt, draft_max=4)
            assert got.tokens == want.tokens, f"draft {draft}: the cache changed the output"
            expect = min(common_prefix(held, prompt), len(prompt) - 1)
            assert got.stats.cached_tokens == (expect if expect >= MIN_REUSE else 0)
            # what the caches keep: the prompt and the output but its last token (not yet
            # decoded), or all of it when an end-of-generation token (not in the output) ended it
            held = prompt + (got.tokens[:-1] if got.finish_reason == "length" else got.tokens)


@pytest.mark.parametrize("name", ["eagle3-counting", "dflash", "dspark-counting"])
def test_reuse_equals_fresh_hidden_drafts(qwen3_target, counting_target, hidden_drafts, name):
    """Drafts that read the target's layer inputs: the draft's own cache is trimmed with the
    target's (eagle3 re-reads one token more: its cell at P is built from the token at P+1)."""
    path = counting_target if "counting" in name else qwen3_target
    prompts = _sequence(_ids(2, 100))
    with SpecGGUF(str(path), draft=str(hidden_drafts[name]), draft_max=4, n_ctx=512) as llm:
        for i, prompt in enumerate(prompts):
            got = llm.generate(prompt, max_tokens=N)
            want = _fresh(path, str(hidden_drafts[name]), prompt, draft_max=4)
            assert got.tokens == want.tokens, f"{name}: prompt {i} changed by the cache"
            assert got.stats.drafted > 0
        assert got.stats.cached_tokens > 0  # the last prompt extends the one before


def test_plain_and_speculative_runs_share_one_target(qwen3_target, hidden_drafts):
    """A plain engine and a hidden-state drafter's engine on one target (as --compare runs
    them): the drafter's state is stale after the plain run and is rebuilt, not trusted."""
    prompt = _ids(3, 80)
    with Target(qwen3_target, n_ctx=512) as target:
        drafter = make_drafter(str(hidden_drafts["eagle3"]), target, draft_max=4)
        try:
            def run(d, p):
                gen = Engine(target, d, 4).generate(p, N)
                return list(gen), gen.stats

            plain, _ = run(None, prompt)
            spec, stats = run(drafter, prompt)
            assert spec == plain
            assert stats.cached_tokens == 0  # eagle3 never saw the plain run: all re-read
            spec2, stats2 = run(drafter, prompt + [11, 12])
            plain2, _ = run(None, prompt + [11, 12])
            assert spec2 == plain2 and stats2.cached_tokens > 0
        finally:
            drafter.close()


def test_after_stop_cancel_and_error(qwen3_target):
    """A generation cut by a stop string, by its consumer, by `cancelled` in the middle of the
    prompt, or refused with an error leaves caches that the next call can trust."""
    base = _ids(4, 300)
    want = _fresh(qwen3_target, "ngram", base + [3, 4], draft_max=4)
    with SpecGGUF(str(qwen3_target), draft="ngram", draft_max=4, n_ctx=512, n_batch=64) as llm:
        # the consumer stops early
        for _ in llm.stream(base, max_tokens=N):
            break
        assert llm.generate(base + [3, 4], max_tokens=N).tokens == want.tokens
        # cancelled in the middle of the prompt (between its chunks of n_batch tokens)
        calls = []
        gen, text = llm.stream_tokens(_ids(5, 300), N, cancelled=lambda: calls.append(1) or len(calls) > 2)
        list(text)
        assert gen.finish_reason == "cancelled"
        assert llm.generate(base + [3, 4], max_tokens=N).tokens == want.tokens
        # refused requests (too long for the context; a bad option) change nothing
        with pytest.raises((ValueError, UserError)):
            llm.generate(_ids(6, 600), max_tokens=N)
        with pytest.raises(ValueError):
            llm.generate(base, max_tokens=N, temperature=-1)
        got = llm.generate(base + [3, 4], max_tokens=N)
        assert got.tokens == want.tokens and got.stats.cached_tokens == len(base) + 1


def test_grammar_and_seeded_sampling(qwen3_target):
    grammar = 'root ::= [a-z ]+ "."'
    prompt = _ids(10, 60)
    sampled = dict(temperature=0.9, seed=1234)
    with SpecGGUF(str(qwen3_target), draft="ngram", n_ctx=512) as fresh:
        want_g = fresh.generate(prompt + [7], max_tokens=N, grammar=grammar).tokens
    with SpecGGUF(str(qwen3_target), draft="ngram", n_ctx=512) as fresh:
        want_s = fresh.generate(prompt + [8], max_tokens=N, **sampled).tokens
    with SpecGGUF(str(qwen3_target), draft="ngram", n_ctx=512) as llm:
        llm.generate(prompt, max_tokens=N)
        got = llm.generate(prompt + [7], max_tokens=N, grammar=grammar)
        assert got.tokens == want_g and got.stats.cached_tokens == len(prompt)
        got = llm.generate(prompt + [8], max_tokens=N, **sampled)
        assert got.tokens == want_s and got.stats.cached_tokens == len(prompt)


def test_context_used_directly_is_not_trusted(qwen3_target):
    prompt = _ids(11, 50)
    want = _fresh(qwen3_target, None, prompt)
    with SpecGGUF(str(qwen3_target), n_ctx=512) as llm:
        llm.generate(prompt, max_tokens=N)
        ctx, batch = llm.target.ctx, llm.target.batch
        ctx.clear()  # behind the engine's back
        batch.clear().add_tokens(_ids(12, 30), 0, "none")
        ctx.decode(batch)
        got = llm.generate(prompt, max_tokens=N)
        assert got.tokens == want.tokens and got.stats.cached_tokens == 0
        llm.reset()
        assert llm.generate(prompt, max_tokens=N).stats.cached_tokens == 0


def test_saved_states_serve_alternating_prompts(qwen3_target, qwen3_draft):
    """Two long prompts in turn: with saved states neither is read twice; without, each is."""
    a, b = _ids(13, 200), [401] + _ids(14, 199)  # b shares not even its first token with a
    for draft in (None, str(qwen3_draft)):
        with SpecGGUF(str(qwen3_target), draft=draft, draft_max=4, n_ctx=512, prompt_cache_bytes=64 << 20) as llm:
            first = [llm.generate(p + [1], max_tokens=N) for p in (a, b)]
            again = [llm.generate(p + [2], max_tokens=N) for p in (a, b)]
            assert [r.stats.cached_tokens for r in first] == [0, 0]
            assert [r.stats.cached_tokens for r in again] == [len(a), len(b)]
            for p, r in zip((a, b), again):
                assert r.tokens == _fresh(qwen3_target, draft, p + [2], draft_max=4).tokens
            # a saved state that shares fewer than MIN_REUSE tokens is not worth loading
            short = llm.generate(a[:MIN_REUSE - 5] + [402] * 40, max_tokens=N)
            assert short.stats.cached_tokens == 0
        with SpecGGUF(str(qwen3_target), draft=draft, draft_max=4, n_ctx=512) as llm:
            for p in (a, b, a):
                r = llm.generate(p + [1], max_tokens=N)
            assert r.stats.cached_tokens == 0


def test_state_cache_bounds():
    cache = StateCache(capacity_bytes=3000, min_tokens=2)
    s = [SavedState(tuple(range(i, i + 10)), b"x" * 900, None, None) for i in range(4)]
    for state in s:
        assert cache.put(state)
    assert len(cache) == 3 and cache.nbytes <= 3000  # the oldest went first
    assert cache.best(list(range(0, 10)))[0] is None
    hit, n = cache.best(list(range(3, 8)) + [99])
    assert hit is s[3] and n == 5
    assert not cache.put(SavedState((1, 2, 3), b"x" * 5000, None, None))  # larger than the whole cache
    longer = SavedState(tuple(range(3, 20)), b"y" * 900, None, None)
    cache.put(longer)  # an extension makes its prefix redundant
    assert cache.best(list(range(3, 13)))[0] is longer and len(cache) == 3


def test_save_and_load_state(qwen3_target):
    a, b = _ids(15, 150), _ids(16, 150)
    with SpecGGUF(str(qwen3_target), draft="ngram", n_ctx=512) as llm:
        llm.generate(a, max_tokens=N)
        state = llm.save_state()
        llm.generate(b, max_tokens=N)
        llm.load_state(state)
        got = llm.generate(a + [5], max_tokens=N)
        assert got.stats.cached_tokens == len(a)
        assert got.tokens == _fresh(qwen3_target, "ngram", a + [5]).tokens
        with pytest.raises(ValueError, match="save_state"):
            llm.load_state(b"not a state")


def test_gemma_reuse_with_sliding_window(gemma_path):
    """The embedded Gemma 3 slides a 512-token window in most layers, and llama.cpp's cache
    forgets cells that left it: going back further than the window allows re-reads the prompt
    instead of trusting a cache that no longer holds what the decode needs."""
    text = " ".join(f"item {i}: value {i * 7 % 13}." for i in range(260))
    # drafts of at most 2 tokens: verify batches of width <= 3, which this Q4_K_M target computes
    # bit for bit as one-token decoding on AVX2 and AVX-512 EPYCs; an Intel Xeon (2026-12-04) parts
    # at a near-tie even so (docs/loop.md §6.4): tests/ties.py
    with SpecGGUF(str(gemma_path), draft="ngram", draft_max=2, n_ctx=4096) as llm:
        long = llm.tokenize(text)
        assert len(long) > 1500
        prompts = [long[:1400], long[:1400] + long[1400:1450], long[:700], long[:60] + long[900:950]]
        results = [llm.generate(p, max_tokens=N) for p in prompts]
    cached = [r.stats.cached_tokens for r in results]
    assert cached[0] == 0 and cached[1] >= 1399
    assert cached[2] == 0  # 700 tokens back is outside what the window cache still holds
    with SpecGGUF(str(gemma_path), n_ctx=4096) as fresh:  # the target's own greedy output
        for p, r in zip(prompts, results):
            fresh.reset()
            assert_same_or_near_tie(fresh, p, r.tokens, fresh.generate(p, max_tokens=N).tokens)


def test_gemma_chat_usage_reports_cached_tokens(gemma_path):
    notes = " ".join(f"Note {i}: the {c} lamp is on." for i, c in enumerate(["red", "green", "blue"] * 4))
    messages = [{"role": "user", "content": notes + " Name the colours of the lamps, in order."}]
    with SpecGGUF(str(gemma_path), draft="ngram", n_ctx=2048) as llm:
        first = llm.create_chat_completion(messages, max_tokens=16)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        messages += [first["choices"][0]["message"], {"role": "user", "content": "And in reverse?"}]
        second = llm.create_chat_completion(messages, max_tokens=16)
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= first["usage"]["prompt_tokens"]
        assert second["specgguf"]["cached_tokens"] == cached
        chunks = list(llm.create_chat_completion(messages, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
        assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached


LOG = "\n".join(f"{i:02d}:00 sensor {i % 7} reported {i * 13 % 97} units" for i in range(1, 120))


@pytest.mark.slow  # 31 s; the chat CLI's two-turn test below checks the same reuse in the default tier
def test_server_three_turn_chat_reads_only_new_tokens(chat_model_path):
    """The real openai client sends the whole conversation every turn (as every app does):
    turns 2 and 3 find all of the earlier turns in the cache, and every answer is the target's
    own greedy answer, or parts from it only where the target's top two tokens are a near-tie
    (within 1.5 nats): on a quantised target a verify batch, and cells written by another
    batch shape, move the logits slightly (README, "Same output"); which near-ties flip depends
    on the CPU's kernels (seen on an AVX2-only EPYC, not on AVX-512 machines)."""
    import openai

    from serverproc import start_server

    system = {"role": "system", "content": "Answer from this log.\n" + LOG}
    questions = ["What did sensor 3 report at 10:00?", "And at 17:00?", "Which sensor reported at 20:00?"]
    with start_server(chat_model_path, "--ctx", 4096, "--draft", "ngram", "--draft-max", 3) as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)
        messages, usages, answers = [system], [], []
        for q in questions:
            messages.append({"role": "user", "content": q})
            r = c.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=24, temperature=0,
                                          logprobs=True)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
            usages.append(r.usage)
            answers.append([t.token for t in r.choices[0].logprobs.content])
    assert usages[0].prompt_tokens > 1500
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    for before, now in zip(usages, usages[1:]):
        # everything the last turn read (its prompt) is cached; what is read is the answer and the question
        assert now.prompt_tokens_details.cached_tokens >= before.prompt_tokens
        assert now.prompt_tokens - now.prompt_tokens_details.cached_tokens < 80
    with SpecGGUF(str(chat_model_path), n_ctx=4096) as fresh:  # the target's own greedy answers
        for i, q in enumerate(questions):
            conv = messages[:1 + 2 * i] + [{"role": "user", "content": q}]
            fresh.reset()
            out = fresh.create_chat_completion(conv, max_tokens=24, logprobs=True, top_logprobs=2)
            want = out["choices"][0]["logprobs"]["content"]
            got = answers[i]
            if got == [w["token"] for w in want]:
                continue
            j = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b["token"]), min(len(got), len(want)))
            assert j < len(want), ("the target ended where the server's answer went on", got, want)
            top = want[j]["top_logprobs"]  # the target's own two best tokens where the answers part
            assert top[0]["logprob"] - top[1]["logprob"] <= 1.5, (i, j, got, want[j])
            if j < len(got):  # (else the server's answer ended there: its end token was the runner-up)
                assert got[j] == top[1]["token"], (i, j, got, want[j])


def test_chat_turn_two_reads_only_its_new_tokens(chat_model_path):
    system = "Answer from this log.\n" + LOG
    proc = subprocess.run([sys.executable, "-m", "specgguf", "chat", str(chat_model_path), "--draft", "ngram",
                           "-n", "16", "--system", system, "--ctx", "4096"],
                          input="What did sensor 3 report at 10:00?\nAnd at 17:00?\n/exit\n",
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    stats = re.findall(r"prompt (\d+) tokens(?: \((\d+) cached\))?", proc.stderr)
    assert len(stats) == 2, proc.stderr
    (p1, c1), (p2, c2) = stats
    assert c1 == "" and int(p1) > 1500
    assert int(c2) >= int(p1) and int(p2) - int(c2) < 60  # turn 2 read its answer and question only
