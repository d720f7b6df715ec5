"""The Python API: `SpecGGUF` generate/stream, and the llama_cpp.Llama-compatible methods whose
dict shapes are checked against llama-cpp-python's own TypedDicts."""

from __future__ import annotations

import pytest
from llama_cpp import llama_types

import specgguf
from specgguf import Chunk, RequestError, Result, SpecGGUF
from specgguf.decoding.engine import MIN_REUSE

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(qwen3_target, qwen3_draft):
    with SpecGGUF(qwen3_target, draft=str(qwen3_draft), n_ctx=512, draft_max=4) as model:
        yield model


def _required(typed_dict) -> set:
    return set(getattr(typed_dict, "__required_keys__", typed_dict.__annotations__))


def test_public_names_are_documented():
    assert set(specgguf.__all__) == {"SpecGGUF", "Result", "Chunk", "GenerationStats", "UserError", "RequestError"}
    for name in specgguf.__all__:
        assert getattr(specgguf, name).__doc__, name
    assert name in specgguf.__doc__


def test_generate_and_stream_agree(llm):
    result = llm.generate(PROMPT, max_tokens=20)
    assert isinstance(result, Result) and result.finish_reason == "length" and len(result.tokens) == 20
    chunks = list(llm.stream(PROMPT, max_tokens=20))
    assert all(isinstance(c, Chunk) for c in chunks)
    assert all(c.stats is None and c.finish_reason is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == "length" and last.tokens == result.tokens
    assert last.stats.generated_tokens == 20 and last.stats.drafted > 0
    assert "".join(c.text for c in chunks) == result.text
    # token ids work as a prompt too, and give the same output
    assert llm.generate(llm.tokenize(PROMPT), max_tokens=20).tokens == result.tokens


def test_leaving_a_stream_early_frees_the_engine(llm):
    for i, _ in enumerate(llm.stream(PROMPT, max_tokens=200)):
        if i == 3:
            break
    assert len(llm.generate(PROMPT, max_tokens=5).tokens) == 5


def test_create_completion_has_llama_shapes(llm):
    out = llm.create_completion(PROMPT, max_tokens=12)
    assert _required(llama_types.CreateCompletionResponse) <= set(out)
    assert out["object"] == "text_completion"
    assert _required(llama_types.CompletionChoice) <= set(out["choices"][0])
    assert out["usage"] == {"prompt_tokens": len(llm.tokenize(PROMPT)), "completion_tokens": 12,
                            "total_tokens": len(llm.tokenize(PROMPT)) + 12,
                            "prompt_tokens_details": {"cached_tokens": out["specgguf"]["cached_tokens"]}}
    assert out["specgguf"]["generated_tokens"] == 12
    assert out["choices"][0]["text"] == llm.generate(PROMPT, max_tokens=12).text
    chunks = list(llm.create_completion(PROMPT, max_tokens=12, stream=True))
    assert len({c["id"] for c in chunks}) == 1
    assert "".join(c["choices"][0]["text"] for c in chunks) == out["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "specgguf" in chunks[-1]
    assert all(c["choices"][0]["finish_reason"] is None and "specgguf" not in c for c in chunks[:-1])


def test_create_chat_completion_has_llama_shapes(llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = llm.create_chat_completion(messages=messages, max_tokens=10)
    assert _required(llama_types.CreateChatCompletionResponse) <= set(out)
    assert out["object"] == "chat.completion"
    assert _required(llama_types.ChatCompletionResponseChoice) <= set(out["choices"][0])
    assert out["choices"][0]["message"]["role"] == "assistant"
    chunks = list(llm.chat(messages, max_tokens=10, stream=True))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == out["choices"][0]["message"]["content"]
    usage = chunks[-1]["usage"]
    assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == \
        {k: out["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    # the same prompt again: everything but its last token comes from the prompt cache
    if out["usage"]["prompt_tokens"] > MIN_REUSE:
        assert usage["prompt_tokens_details"]["cached_tokens"] == out["usage"]["prompt_tokens"] - 1
    assert chunks[-1]["specgguf"]["rounds"] >= 1


def test_stop_strings(llm):
    full = llm.generate(PROMPT, max_tokens=30).text
    stop = full[10:13]
    cut = llm.create_completion(PROMPT, max_tokens=30, stop=stop)
    assert cut["choices"][0]["text"] == full[:full.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_drafts_are_not_verified_past_a_stop_string(counting_target):
    """The counting target continues the prompt's run, so a lookup draft of 16 is all right; a
    stop string ends the output inside it, and the tokens after it are not verified (they
    could never be output): same text, fewer drafted tokens."""
    with SpecGGUF(counting_target, draft="ngram", draft_max=16, n_ctx=512) as llm:
        piece = llm.target.model.token_to_piece
        prompt = [*range(100, 140), 100, 101, 102]
        whole = llm.generate(prompt, max_tokens=20)
        assert whole.tokens == list(range(103, 123)) and whole.stats.drafted >= 16
        stop = (piece(110) + piece(111)).decode()  # completed by token 111, the 9th drafted
        cut = llm.generate(prompt, max_tokens=20, stop=[stop, "never appears"])
        assert cut.text == whole.text[:whole.text.index(stop)] and cut.finish_reason == "stop"
        assert cut.stats.drafted == 9 and cut.stats.rounds == 1


@pytest.mark.parametrize("kwargs, param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_k": 1.5}, "top_k"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": 2, "echo": True}, "echo"),
    ({"n": 0}, "n"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {10**7: 1}}, "logit_bias"),
    ({"typical_p": 0.5}, "typical_p"),
    ({"mirostat_mode": 2}, "mirostat_mode"),
    ({"tfs_z": 0.9}, "tfs_z"),
    ({"seed": -2}, "seed"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stop": 5}, "stop"),
])
def test_bad_arguments_raise_value_error(llm, kwargs, param):
    with pytest.raises(ValueError) as exc:
        llm.create_completion(PROMPT, **kwargs)
    assert isinstance(exc.value, RequestError) and exc.value.param == param
    assert exc.value.to_dict()["error"]["param"] == param


def test_bad_prompts(llm):
    with pytest.raises(RequestError, match="context"):
        llm.create_completion("word " * 2000, max_tokens=1)
    with pytest.raises(RequestError, match="vocabulary"):
        llm.create_completion([10**7], max_tokens=1)
    with pytest.raises(RequestError, match="messages"):
        llm.create_chat_completion(messages=[])


def test_sampling_reaches_the_engine(llm):
    pytest.importorskip("specgguf.decoding.sampling")
    a = llm.generate(PROMPT, max_tokens=16, temperature=1.0, seed=7)
    b = llm.generate(PROMPT, max_tokens=16, temperature=1.0, seed=7)
    greedy = llm.generate(PROMPT, max_tokens=16)
    assert a.tokens == b.tokens  # a seed makes sampling repeatable
    others = {tuple(llm.generate(PROMPT, max_tokens=16, temperature=1.5, seed=s).tokens) for s in range(4)}
    assert others != {tuple(greedy.tokens)}  # temperature changes the output: it is not ignored


def test_close_twice_and_context_manager(qwen3_target):
    llm = SpecGGUF(qwen3_target, draft="ngram", n_ctx=256)
    with llm:
        assert llm.generate(PROMPT, max_tokens=3).tokens
    llm.close()
    assert llm.target is None and llm.drafter is None


# -- llama_cpp.Llama's surface: logprobs, logit_bias, echo, n, stream_options ------------------

@pytest.fixture(scope="module")
def plain(qwen3_target):
    with SpecGGUF(model_path=str(qwen3_target), n_ctx=512) as model:
        yield model


def test_logprobs_are_the_targets_own(llm, plain):
    """F32 target: the verified rows of a draft round give plain decoding's logprobs, up to
    float32 summation order in a wider batch (measured: at most 1.5e-4 nats in 24 tokens)."""
    spec = llm.create_completion(PROMPT, max_tokens=24, logprobs=5)
    ref = plain.create_completion(PROMPT, max_tokens=24, logprobs=5)
    assert spec["specgguf"]["accepted"] > 0 and ref["specgguf"]["drafted"] == 0
    a, b = spec["choices"][0]["logprobs"], ref["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-3, rel=1e-4)
    for mine, theirs in zip(a["top_logprobs"], b["top_logprobs"]):
        assert mine.keys() == theirs.keys()  # {text: logprob}: pieces with one text share a key, as in Llama
        assert all(v <= 0 for v in mine.values())
    assert all(mine[t] == lp for mine, t, lp in zip(a["top_logprobs"], a["tokens"], a["token_logprobs"]))
    # chat: OpenAI's shape, the same numbers as the completion of the same prompt tokens
    chat = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=6, logprobs=True,
                                      top_logprobs=3)
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"]
    assert all(set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 3
               for e in content)
    assert all(e["top_logprobs"][0]["logprob"] >= e["logprob"] for e in content)
    no_top = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=3, logprobs=True)
    assert all(e["top_logprobs"] == [] for e in no_top["choices"][0]["logprobs"]["content"])


def test_greedy_logit_bias_is_the_biased_argmax_at_every_verified_row(llm, plain):
    import numpy as np

    base = plain.generate(PROMPT, max_tokens=16).tokens
    bias = {base[2]: -50.0, base[5]: -50.0, 7: 4.0}
    vec = np.zeros(llm.n_vocab(), dtype=np.float64)
    for tok, b in bias.items():
        vec[tok] = b
    checked = []

    def check(ctx, ids):
        for i, tok in enumerate(ids):
            assert tok == int(np.argmax(ctx.logits(i) + vec)), (i, tok)
            checked.append(tok)

    gen, text = llm.stream_tokens(llm.tokenize(PROMPT), 16, sampling={"logit_bias": tuple(sorted(bias.items()))},
                                  on_verified=check)
    "".join(text)
    assert len(checked) >= 16 and gen.stats.drafted > 0
    biased = llm.create_completion(PROMPT, max_tokens=16, logit_bias=bias)
    ref = plain.create_completion(PROMPT, max_tokens=16, logit_bias={str(k): v for k, v in bias.items()})
    assert biased["choices"][0]["text"] == ref["choices"][0]["text"] != plain.generate(PROMPT, max_tokens=16).text


def test_echo_n_and_stream_options(llm):
    text = llm.generate(PROMPT, max_tokens=8).text
    echoed = llm.create_completion(PROMPT, max_tokens=8, echo=True)
    assert echoed["choices"][0]["text"] == PROMPT + text
    streamed = list(llm.create_completion(PROMPT, max_tokens=8, echo=True, stream=True))
    assert "".join(c["choices"][0]["text"] for c in streamed) == PROMPT + text
    many = list(llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4, n=2, stream=True,
                                           stream_options={"include_usage": True}))
    assert all("usage" in c and c["usage"] is None for c in many[:-1])
    assert many[-1]["choices"] == [] and many[-1]["usage"]["completion_tokens"] > 0 and "specgguf" in many[-1]
    finished = [c["choices"][0] for c in many[:-1] if c["choices"][0]["finish_reason"]]
    assert [c["index"] for c in finished] == [0, 1]
    texts = ["".join(c["choices"][0]["delta"].get("content", "") for c in many[:-1] if c["choices"][0]["index"] == i)
             for i in (0, 1)]
    assert texts[0] == texts[1]  # greedy choices agree


def test_n_choices_seeds_wrap_at_the_top_of_the_range(llm):
    """Choice i of a seeded request runs with seed + i, modulo 2**64 (the range of seeds): the
    largest seed with n = 2 is no error, and its second choice is the run with seed 0."""
    top = llm.create_completion(PROMPT, max_tokens=8, n=2, temperature=1.0, seed=2**64 - 1)
    zero = llm.create_completion(PROMPT, max_tokens=8, temperature=1.0, seed=0)
    assert top["choices"][1]["text"] == zero["choices"][0]["text"]


def test_llama_model_methods_and_keywords(llm, qwen3_target):
    assert llm.n_ctx() == 512 and llm.n_vocab() > 0
    assert llm.metadata["general.architecture"] == "qwen3"
    ids = llm.tokenize(PROMPT.encode())
    assert llm.detokenize(ids).decode() == PROMPT
    assert llm.tokenize(PROMPT.encode(), add_bos=False) == ids[len(ids) - len(llm.tokenize(PROMPT.encode(),
                                                                                        add_bos=False)):]
    llm.reset()
    with pytest.raises(RequestError, match="tokens"):
        llm.detokenize([llm.n_vocab()])
    with pytest.raises(RequestError, match="UTF-8"):
        llm.tokenize(b"\xff\xfe")
    llm.load_state(llm.save_state())  # after reset(): an empty state, restored as such
    # Llama's keywords at Llama's defaults pass; other values are refused, unknown names too
    with SpecGGUF(model_path=str(qwen3_target), n_ctx=64, use_mmap=True, n_ubatch=512, seed=0xFFFFFFFF,
                  n_threads_batch=1, last_n_tokens_size=32, verbose=False) as m:
        assert m.generate(PROMPT, max_tokens=2).tokens
    with pytest.raises(RequestError, match="use_mmap") as exc:
        SpecGGUF(model_path=str(qwen3_target), use_mmap=False)
    assert exc.value.param == "use_mmap"
    with pytest.raises(TypeError, match="'rope_freq'"):
        SpecGGUF(model_path=str(qwen3_target), rope_freq=1.0)
    with pytest.raises(RequestError, match="not both"):
        SpecGGUF(str(qwen3_target), model_path=str(qwen3_target))


def test_constructor_seed_is_the_default_seed(qwen3_target):
    runs = []
    for _ in range(2):
        with SpecGGUF(model_path=str(qwen3_target), n_ctx=128, seed=11) as m:
            runs.append(m.create_completion(PROMPT, max_tokens=12, temperature=1.5)["choices"][0]["text"])
    assert runs[0] == runs[1]


def test_readme_dropin_example_runs(qwen3_target, capsys):
    from pathlib import Path
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"\*\*A drop-in for `llama_cpp.Llama`.\*\*.*?```python\n(.*?)```", readme, flags=re.S).group(1)
    assert 'model_path="model.gguf"' in block
    scope: dict = {}
    exec(compile(block.replace("model.gguf", str(qwen3_target)), "README.md", "exec"), scope)
    scope["llm"].close()
    assert "qwen3" in capsys.readouterr().out
