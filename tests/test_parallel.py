"""Parallel sequences (issue 28; decoding/sharedctx.py, decoding/slots.py): several generations at once in one
context, one target pass per round for all of them. On an F32 target every answer equals the
same request run alone, with plain decoding and each lookup drafter, greedy and seeded
sampling, when requests outnumber the slots, when one client stops reading mid-stream, and
across the per-slot prompt cache; the rounds of different requests share passes."""

from __future__ import annotations

import threading

import pytest

from specgguf.decoding.promptcache import PromptCache
from specgguf.api import SpecGGUF

N_CTX = 512
PROMPTS = [
    "one two three four five six seven eight one two three four five",
    "the cat sat on the mat and the cat sat on the",
    "red green blue red green blue red green",
    "alpha beta gamma delta alpha beta gamma delta alpha",
    "a b c d e f g a b c d e f g a b",
    "hello world hello world hello world hello",
]
MAX_TOKENS = 40


def alone(target, draft, prompts, **sampling):
    """Each prompt's Result from a model with one sequence."""
    with SpecGGUF(target, draft=draft, n_ctx=N_CTX) as llm:
        return [llm.generate(p, max_tokens=MAX_TOKENS, **sampling) for p in prompts]


def together(llm, prompts, max_tokens=MAX_TOKENS, timeout=120, **sampling):
    """Every prompt on its own thread, all started at once; their results in prompt order
    (tests/test_hybrid.py, test_dflash2.py and test_device.py use it too)."""
    out: list = [None] * len(prompts)
    errors: list = []
    start = threading.Barrier(len(prompts))

    def run(i, prompt):
        try:
            start.wait()
            out[i] = llm.generate(prompt, max_tokens=max_tokens, **sampling)
        except BaseException as exc:  # reported below, with the thread's prompt
            errors.append((prompt, exc))

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not errors, errors
    return out


@pytest.mark.parametrize("draft", [None, "ngram", "suffix", "model", "suffix+model"])
def test_parallel_answers_equal_answers_alone(qwen3_target, qwen3_draft, draft):
    if draft and "model" in draft:
        draft = draft.replace("model", str(qwen3_draft))  # one draft context for every slot
    want = alone(qwen3_target, draft, PROMPTS[:4])
    with SpecGGUF(qwen3_target, draft=draft, n_ctx=N_CTX, n_parallel=4) as llm:
        assert llm.n_ctx() == N_CTX  # every slot has the context asked for
        got = together(llm, PROMPTS[:4])
        assert [r.tokens for r in got] == [r.tokens for r in want]
        rounds = sum(r.stats.rounds for r in got)
        assert llm._pool.shared.passes < rounds  # rounds of different requests shared passes
        if draft is not None:
            assert sum(r.stats.drafted for r in got) > 0


def test_more_requests_than_slots_and_seeded_sampling(qwen3_target):
    sampling = {"temperature": 0.9, "seed": 11}
    want = alone(qwen3_target, "ngram", PROMPTS, **sampling)
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX, n_parallel=2) as llm:
        got = together(llm, PROMPTS, **sampling)  # six requests, two slots: four wait their turn
        assert [r.tokens for r in got] == [r.tokens for r in want]


def test_a_client_that_stops_reading_does_not_stop_the_others(qwen3_target):
    want = alone(qwen3_target, "ngram", PROMPTS[:3])
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX, n_parallel=3) as llm:
        quit_early = llm.stream(PROMPTS[3], max_tokens=MAX_TOKENS)
        next(quit_early)  # holds a slot, then is never read again until the end
        got = together(llm, PROMPTS[:3])
        assert [r.tokens for r in got] == [r.tokens for r in want]
        quit_early.close()  # its slot is freed: all three are free again
        assert llm._pool.busy() == 0


def test_each_slot_keeps_its_prompt_cache(qwen3_target):
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX, n_parallel=2) as llm:
        long_a = " ".join(PROMPTS[:3])
        long_b = " ".join(PROMPTS[3:])
        first = together(llm, [long_a, long_b])
        # the same conversations go on: each lands on the slot that holds it and reads only the rest
        again = together(llm, [long_b + first[1].text + " and", long_a + first[0].text + " and"])
        assert all(r.stats.cached_tokens >= 32 for r in again), [r.stats.cached_tokens for r in again]
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX) as ref:
        assert ref.generate(long_a + first[0].text + " and", max_tokens=MAX_TOKENS).tokens == again[1].tokens


@pytest.mark.parametrize("name", ["eagle3", "dflash", "eagle3-counting", "dspark-counting"])
def test_hidden_state_drafts_in_parallel_answer_as_alone(qwen3_target, counting_target, hidden_drafts, name):
    """eagle3, dflash and dspark drafts read each slot's rows of the shared pass (its layer
    inputs at the slot's offset) into a draft context per slot; on the counting target drafts
    are accepted, so the per-slot rollbacks are exercised. Greedy, fixed length 4."""
    target = counting_target if "counting" in name else qwen3_target
    draft = str(hidden_drafts[name])
    with SpecGGUF(target, draft=draft, draft_max=4, n_ctx=N_CTX) as ref:
        want = [ref.generate(p, max_tokens=MAX_TOKENS) for p in PROMPTS]
    with SpecGGUF(target, draft=draft, draft_max=4, n_ctx=N_CTX, n_parallel=3) as llm:
        got = together(llm, PROMPTS)
        assert [r.tokens for r in got] == [r.tokens for r in want]
        assert sum(r.stats.drafted for r in got) > 0
        assert len({id(e.drafter.model) for e in llm._pool.engines}) == 1  # the draft is loaded once
        # each slot's drafts saw its own features: the same drafts, accepted as often, as alone
        # (a slot reading another's rows would still answer right, but draft worse)
        assert [(r.stats.drafted, r.stats.accepted) for r in got] == \
            [(r.stats.drafted, r.stats.accepted) for r in want]
        if "counting" in name:
            assert sum(r.stats.accepted for r in got) > 0


def test_a_model_draft_drafts_for_every_slot_and_steps_share_passes(qwen3_target, qwen3_draft):
    """Fixed-length model drafts on three slots: answers (greedy and seeded sampling) are the
    lone ones, and draft steps asked for at once share a pass of the one draft context."""
    for sampling in ({}, {"temperature": 0.8, "seed": 5}):
        with SpecGGUF(qwen3_target, draft=str(qwen3_draft), draft_max=4, n_ctx=N_CTX) as ref:
            want = [ref.generate(p, max_tokens=MAX_TOKENS, **sampling) for p in PROMPTS]
        with SpecGGUF(qwen3_target, draft=str(qwen3_draft), draft_max=4, n_ctx=N_CTX, n_parallel=3) as llm:
            got = together(llm, PROMPTS, **sampling)
            assert [r.tokens for r in got] == [r.tokens for r in want]
            drafters = {id(e.drafter.shared_draft) for e in llm._pool.engines}
            assert len(drafters) == 1  # one SharedDraft
            shared = llm._pool.engines[0].drafter.shared_draft.shared
            steps = sum(r.stats.drafted for r in got)
            assert steps > 0 and shared.passes < steps + sum(r.stats.rounds for r in got)


def test_an_mtp_draft_in_parallel_attends_to_its_slots_cells(tmp_path):
    """Gemma 4's assistant keeps no cache: it reads the target's. With slots, each drafter's
    MTP context names its slot's sequence, so it attends to that slot's cells only: every
    request drafts and accepts what it does alone (counting target and assistant)."""
    from specgguf.synthetic.gemma4 import Gemma4Shape, write_gemma4, write_gemma4_assistant

    g4 = write_gemma4(tmp_path / "g4.gguf", Gemma4Shape(), seed=0, counting=True)
    mtp = str(write_gemma4_assistant(tmp_path / "assistant.gguf", Gemma4Shape(), counting_target_seed=0))
    with SpecGGUF(g4, draft=mtp, draft_max=4, n_ctx=N_CTX) as ref:
        want = [ref.generate(p, max_tokens=MAX_TOKENS) for p in PROMPTS]
    with SpecGGUF(g4, draft=mtp, draft_max=4, n_ctx=N_CTX, n_parallel=3) as llm:
        got = together(llm, PROMPTS)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [(r.stats.drafted, r.stats.accepted) for r in got] == [(r.stats.drafted, r.stats.accepted) for r in want]
    assert sum(r.stats.accepted for r in got) > 0


def test_parallel_refusals(qwen3_target):
    for bad in (0, -1, 65, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="n_parallel"):
            SpecGGUF(qwen3_target, n_ctx=N_CTX, n_parallel=bad)
    with pytest.raises(ValueError, match="batch_invariant"):
        SpecGGUF(qwen3_target, n_ctx=N_CTX, n_parallel=2, batch_invariant=True)
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX, n_parallel=2) as llm:
        with pytest.raises(ValueError, match="one sequence"):
            llm.save_state()
        llm.reset()  # every slot forgets; still usable
        assert llm.generate(PROMPTS[0], max_tokens=8).tokens


def test_serve_parallel_answers_concurrent_clients_as_alone(qwen3_target):
    """`specgguf serve --parallel 3` on the F32 target: streamed and whole answers to concurrent
    clients equal the answers alone; /metrics shows the slots; a bad --parallel is one line."""
    import openai

    from serverproc import start_server

    want = alone(qwen3_target, "ngram", PROMPTS[:5])
    with start_server(qwen3_target, "--draft", "ngram", "--ctx", N_CTX, "--parallel", 3) as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
        out: dict = {}

        def ask(i):
            if i % 2:  # streamed
                chunks = c.completions.create(model="m", prompt=PROMPTS[i], max_tokens=MAX_TOKENS, temperature=0,
                                              stream=True)
                out[i] = "".join(ch.choices[0].text for ch in chunks)
            else:
                out[i] = c.completions.create(model="m", prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                              temperature=0).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [out.get(i) for i in range(5)] == [r.text for r in want]
        import urllib.request

        metrics = urllib.request.urlopen(server.base_url.removesuffix("/v1") + "/metrics").read().decode()
        assert "specgguf_slots 3" in metrics and "specgguf_batch_width" in metrics
    from conftest import run_cli

    r = run_cli("serve", str(qwen3_target), "--parallel", "0")
    assert r.returncode != 0 and r.stderr.strip().count("\n") == 0 and "--parallel" in r.stderr
    r = run_cli("serve", str(qwen3_target), "--parallel", "2", "--cache-ram", "-1")
    assert r.returncode != 0 and "--cache-ram" in r.stderr and "Traceback" not in r.stderr


def test_slots_share_saved_states(qwen3_target):
    """--cache-ram with slots: one StateCache for all. Three long conversations on two slots:
    the third takes a slot whose live context is saved first, and when that conversation comes
    back (on whichever slot is free) it is loaded from the saved state, not re-read; the answer
    is the lone model's."""
    a, b, c = (" ".join(PROMPTS[i:i + 3]) * 2 for i in (0, 1, 2))
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX, n_parallel=2) as llm:
        llm.set_cache_bytes(64 << 20)
        together(llm, [a, b])  # both slots hold a conversation
        llm.generate(c, max_tokens=8)  # takes one of them: its context is saved first
        back = [llm.generate(x + " and", max_tokens=MAX_TOKENS) for x in (a, b)]
        assert min(r.stats.cached_tokens for r in back) >= 32, [r.stats.cached_tokens for r in back]
        states = PromptCache.of(llm._pool.slots[0]).states
        assert states is not None and states is PromptCache.of(llm._pool.slots[1]).states and len(states) >= 1
    with SpecGGUF(qwen3_target, draft="ngram", n_ctx=N_CTX) as ref:
        assert [r.tokens for r in back] == [ref.generate(x + " and", max_tokens=MAX_TOKENS).tokens for x in (a, b)]


def test_load_with_disconnects_on_four_slots(qwen3_target):
    """scripts/load_test_server.py in small against `serve --parallel 4`: concurrent streams,
    some hanging up after two chunks, two rounds; every completed answer is the one the server
    gives alone (F32: no batch-width near-ties), and memory does not grow."""
    import importlib.util
    from pathlib import Path

    from serverproc import start_server

    spec = importlib.util.spec_from_file_location("load_test_server", Path(__file__).resolve().parent.parent
                                                  / "scripts" / "load_test_server.py")
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    with start_server(qwen3_target, "--draft", "ngram", "--ctx", N_CTX, "--parallel", 4, "--max-queue", 32) as server:
        report = load.run_load(server, clients=12, rounds=2, max_tokens=16, disconnect_every=4, time_limit=300)
    assert report["ok"], report
    for r in report["rounds"]:
        assert r["completed"] == 9 and r["correct"] == 9 and r["disconnected"] == 3, r


@pytest.mark.slow  # the load test on the real Gemma; test_load_with_disconnects_on_four_slots keeps it on qwen3
def test_load_on_gemma_four_slots_parts_only_at_near_ties(gemma_path):
    """The same load on the Q4_K_M Gemma with `--parallel 4`: every completed answer is the one
    alone or parts from it at a near-tie (top two tokens within 1.5 nats: the rows of other
    requests in a pass move a quantised target's logits, as a verify batch does)."""
    import importlib.util
    from pathlib import Path

    from serverproc import start_server

    spec = importlib.util.spec_from_file_location("load_test_server", Path(__file__).resolve().parent.parent
                                                  / "scripts" / "load_test_server.py")
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)
    with start_server(gemma_path, "--draft", "ngram", "--ctx", N_CTX, "--parallel", 4) as server:
        report = load.run_load(server, clients=8, rounds=2, max_tokens=12, disconnect_every=4, time_limit=600,
                               near_tie=1.5)
    assert report["ok"], report
    for r in report["rounds"]:
        assert r["completed"] == 6 and not r["wrong"] and r["disconnected"] == 2, r
