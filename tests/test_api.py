"""The Python API: `SpecGGUF` generate/stream, and the llama_cpp.Llama-compatible methods whose
dict shapes are checked against llama-cpp-python's own TypedDicts."""

from __future__ import annotations

import pytest
from llama_cpp import llama_types

import specgguf
from specgguf import Chunk, RequestError, Result, SpecGGUF

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
                            "total_tokens": len(llm.tokenize(PROMPT)) + 12}
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
    assert chunks[-1]["usage"] == out["usage"] and chunks[-1]["specgguf"]["rounds"] >= 1


def test_stop_strings(llm):
    full = llm.generate(PROMPT, max_tokens=30).text
    stop = full[10:13]
    cut = llm.create_completion(PROMPT, max_tokens=30, stop=stop)
    assert cut["choices"][0]["text"] == full[:full.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("kwargs, param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 10**6}, "max_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_k": 1.5}, "top_k"),
    ({"logprobs": 3}, "logprobs"),
    ({"echo": True}, "echo"),
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
    pytest.importorskip("specgguf.sampling")
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
