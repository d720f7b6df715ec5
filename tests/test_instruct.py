"""A real instruct model: SmolLM2-135M-Instruct Q4_1 (llama arch, ChatML template), the default
of `specgguf chat` and `specgguf serve` (runtime/defaults.py: default_chat_target).

The synthetic targets prove the plumbing and the Gemma 3 270M is a base model; this one answers
questions, so these tests check answers: the CLI chat with no model, the server with no model
asked for `gpt-4o-mini` by the real openai client, a multi-turn chat through its own template,
a forced tool call and a JSON-schema answer, each lossless against plain decoding.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specgguf.api import SpecGGUF

QUESTION = "What is the capital of France? Answer with one word."
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_chat_with_no_model_answers_a_question(chat_model_path):
    proc = subprocess.run([sys.executable, "-m", "specgguf", "chat", "-n", "16"], input=f"{QUESTION}\n/exit\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout, proc.stdout
    assert "no chat template" not in proc.stderr and "Smollm2" in proc.stderr  # its own template, its name


def test_the_template_renders_every_turn(chat_model_path):
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, I am Ada."},
               {"role": "assistant", "content": "Hello Ada!"}, {"role": "user", "content": "Who am I?"}]
    with SpecGGUF(chat_model_path, n_ctx=512) as llm:
        assert not llm.chat_format.is_fallback
        text = llm.target.model.detokenize(llm.prepare({"messages": history}, chat=True).tokens, special=True)
    assert text.endswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi, I am Ada.<|im_end|>\n"
                         "<|im_start|>assistant\nHello Ada!<|im_end|>\n<|im_start|>user\nWho am I?<|im_end|>\n"
                         "<|im_start|>assistant\n"), text


@pytest.mark.parametrize("draft", ["ngram", "suffix"])
def test_multi_turn_answers_equal_plain_decoding(chat_model_path, draft):
    messages = [{"role": "user", "content": QUESTION}]
    with SpecGGUF(chat_model_path, draft=draft, n_ctx=1024, draft_max=4) as llm:
        for follow_up in ("And of Germany? Answer with one word.", "Repeat both answers, comma-separated."):
            req = llm.prepare({"messages": messages, "max_tokens": 24}, chat=True)
            r = llm.create_chat_completion(messages, max_tokens=24)
            plain, text = llm.stream_tokens(req.tokens, 24, speculate=False)
            assert r["choices"][0]["message"]["content"] == "".join(text).strip()
            messages += [r["choices"][0]["message"], {"role": "user", "content": follow_up}]
    assert "Paris" in messages[1]["content"] and "Berlin" in messages[3]["content"], messages


def test_forced_tool_call_names_the_city(chat_model_path):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with SpecGGUF(chat_model_path, draft="ngram", n_ctx=1024, draft_max=4) as llm:
        r = llm.create_chat_completion(ask, max_tokens=60, tools=[WEATHER], tool_choice="required")
    choice = r["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "get_weather" and args["city"] == "Paris", args
    assert args["unit"] in ("celsius", "fahrenheit")


def test_json_schema_answer_holds_the_facts(chat_model_path):
    ask = [{"role": "user", "content": "Alice is 30 years old. Give her as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    with SpecGGUF(chat_model_path, draft="ngram", n_ctx=512, draft_max=4) as llm:
        r = llm.create_chat_completion(ask, max_tokens=40, response_format=fmt)
        req = llm.prepare({"messages": ask, "response_format": fmt}, chat=True)
        plain, text = llm.stream_tokens(req.tokens, 40, grammar=req.grammar, speculate=False)
        plain_text = "".join(text)
    assert json.loads(r["choices"][0]["message"]["content"]) == {"name": "Alice", "age": 30}
    assert r["choices"][0]["message"]["content"] == plain_text.strip()


def test_server_with_no_model_answers_any_model_name(chat_model_path):
    import openai

    from serverproc import start_server

    with start_server("--ctx", 1024, "--draft", "ngram") as server:
        c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)
        r = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": QUESTION}],
                                      max_tokens=16, temperature=0)
        stream = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": QUESTION}],
                                           max_tokens=16, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
    assert "Paris" in r.choices[0].message.content, r
    assert r.model == chat_model_path.stem  # the model it serves, whatever the client named
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
