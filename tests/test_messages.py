"""Anthropic's Messages API on `specgguf serve` (request/messages.py, messagereply.py,
server/anthropic.py): the real `anthropic` SDK against a real server of SmolLM2-135M-Instruct,
plain and with `--draft ngram` (that one behind --api-key), raw HTTP for what an SDK would never
send. The translation is proved by equality: greedy text through /v1/messages is the text
/v1/chat/completions gives for the same conversation, tool calls and results included.
"""

from __future__ import annotations

import json
import socket
import time

import anthropic
import jsonschema
import openai
import pytest

from serverproc import start_server
from test_server import health, raw

KEY = "sk-test-messages"
N = 16
ASK = [{"role": "user", "content": "Name three colours."}]
SYSTEM = "You answer briefly."
WEATHER = {"name": "get_weather", "description": "The current weather of a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
               "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                              "required": ["zone"]}}
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]


# One thread: a 135M model gains little from more, and on cores other work shares, llama.cpp's
# threads wait on each other at every op (measured here: a 16-token answer in 0.5 s, not 29 s).
THREADS = ("--threads", 1)


@pytest.fixture(scope="module")
def plain(chat_model_path):
    with start_server(chat_model_path, "--ctx", 1024, *THREADS, "--max-queue", 1) as server:
        yield server


@pytest.fixture(scope="module")
def drafted(chat_model_path):
    with start_server(chat_model_path, "--ctx", 1024, *THREADS, "--draft", "ngram", "--draft-max", 4,
                      "--api-key", KEY) as server:
        yield server


def sdk(server, key: str | None = "none", **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.root, api_key=key, max_retries=0, timeout=120, **kw)


def key_of(server) -> str:
    return KEY if "--api-key" in server.proc.args else "none"


def client_for(server) -> anthropic.Anthropic:
    return sdk(server, key_of(server))


def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key_of(server), max_retries=0, timeout=120)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def assert_anthropic_error(body, kind: str | None = None):
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    if kind is not None:
        assert body["error"]["type"] == kind, body


@pytest.mark.parametrize("which", ["plain", "drafted"])
def test_a_message_equals_the_chat_completion_and_its_stream(which, request):
    server = request.getfixturevalue(which)
    c = client_for(server)
    msg = c.messages.create(model="claude-sonnet-4-5", max_tokens=N, system=SYSTEM, messages=ASK,
                            extra_body={"temperature": 0, "top_k": 1})
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == "SmolLM2-135M-Instruct.Q4_1"  # the one model answers, whatever the client named
    assert msg.stop_reason in ("end_turn", "max_tokens") and text_of(msg)
    assert msg.usage.output_tokens <= N and msg.usage.cache_creation_input_tokens == 0
    assert msg.model_extra["specgguf"]["generated_tokens"] == msg.usage.output_tokens
    chat = oai(server).chat.completions.create(model="x", max_tokens=N, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, *ASK])
    assert chat.choices[0].message.content == text_of(msg)  # the same prompt tokens, the same greedy text
    assert chat.usage.prompt_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens

    events = list(c.messages.create(model="m", max_tokens=N, system=SYSTEM, messages=ASK, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[-3] == "content_block_stop" and set(kinds[2:-3]) == {"content_block_delta"}
    streamed = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert streamed == text_of(msg)
    assert events[-2].delta.stop_reason == msg.stop_reason and events[-2].usage.output_tokens == msg.usage.output_tokens
    assert events[-2].model_extra["specgguf"]["generated_tokens"] == msg.usage.output_tokens
    with c.messages.stream(model="m", max_tokens=N, system=SYSTEM, messages=ASK) as stream:  # the SDK's helper
        final = stream.get_final_message()
    assert text_of(final) == text_of(msg) and final.stop_reason == msg.stop_reason


def test_the_wire_format_and_its_ping(plain):
    """event: <type> / data: <json> pairs; message_start, then a ping before any content."""
    status, _, body = _stream_raw(plain, {"max_tokens": 4, "messages": ASK, "stream": True})
    assert status == 200
    pairs = [part.split("\n") for part in body.strip().split("\n\n")]
    names = [p[0].removeprefix("event: ") for p in pairs]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    for (event, data) in pairs:
        assert json.loads(data.removeprefix("data: "))["type"] == event.removeprefix("event: ")


def _stream_raw(server, body):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/messages", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    text = resp.read().decode().replace("\r\n", "\n")
    conn.close()
    return resp.status, resp.headers, text


def test_a_forced_tool_call_follows_its_schema_and_its_result_comes_back(plain):
    c = sdk(plain)
    msg = c.messages.create(model="m", max_tokens=48, tools=[WEATHER, TIME], messages=WEATHER_Q,
                            tool_choice={"type": "tool", "name": "get_weather"})
    assert msg.stop_reason == "tool_use"
    (call,) = [b for b in msg.content if b.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    events = list(c.messages.create(model="m", max_tokens=48, tools=[WEATHER, TIME], messages=WEATHER_Q,
                                    tool_choice={"type": "tool", "name": "get_weather"}, stream=True))
    start = next(e for e in events if e.type == "content_block_start")
    assert start.content_block.type == "tool_use" and start.content_block.name == "get_weather"
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert json.loads(partial) == call.input and events[-2].delta.stop_reason == "tool_use"
    with c.messages.stream(model="m", max_tokens=48, tools=[WEATHER, TIME], messages=WEATHER_Q,
                           tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()  # the SDK's own accumulation of partial_json
    assert final.content[-1].input == call.input and final.stop_reason == "tool_use"
    any_call = c.messages.create(model="m", max_tokens=48, tools=[WEATHER, TIME], messages=WEATHER_Q,
                                 tool_choice={"type": "any"})
    assert any_call.stop_reason == "tool_use" and any_call.content[-1].name in ("get_weather", "get_time")

    # the round trip: the answer's own blocks go back, then the result (is_error as well)
    for is_error in (False, True):
        turn = [*WEATHER_Q, {"role": "assistant", "content": msg.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "is_error": is_error,
                                              "content": [{"type": "text", "text": "18 C and sunny"}]}]}]
        back = c.messages.create(model="m", max_tokens=N, tools=[WEATHER, TIME], messages=turn)
        assert back.stop_reason in ("end_turn", "max_tokens", "tool_use")
        # the same conversation in OpenAI's words renders the same prompt: the same greedy answer
        chat = oai(plain).chat.completions.create(model="m", max_tokens=N, messages=[
            *WEATHER_Q, {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.name, "arguments": json.dumps(call.input)}}]},
            {"role": "tool", "tool_call_id": call.id, "content": ("Error: " if is_error else "") + "18 C and sunny"}],
            tools=[{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                                     **({"description": t["description"]} if "description" in t
                                                        else {})}} for t in (WEATHER, TIME)])
        assert (chat.choices[0].message.content or "") == text_of(back)
        assert chat.usage.prompt_tokens == back.usage.input_tokens + back.usage.cache_read_input_tokens


def test_stop_sequences_and_count_tokens(plain):
    c = sdk(plain)
    whole = text_of(c.messages.create(model="m", max_tokens=N, messages=ASK))
    word = whole.split()[2]
    cut = c.messages.create(model="m", max_tokens=N, messages=ASK, stop_sequences=["zzz", word])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert text_of(cut) == whole[:whole.index(word)]
    events = list(c.messages.create(model="m", max_tokens=N, messages=ASK, stop_sequences=[word], stream=True))
    assert events[-2].delta.stop_reason == "stop_sequence" and events[-2].delta.stop_sequence == word
    # the end of the model's turn is "end_turn", even with stop sequences given
    short = c.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "Say hi."}],
                              stop_sequences=["zzzz"])
    assert short.stop_reason in ("end_turn", "max_tokens") and short.stop_sequence is None

    body = dict(model="m", system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
                messages=WEATHER_Q, tools=[WEATHER, TIME])
    counted = c.messages.count_tokens(**body).input_tokens
    msg = c.messages.create(max_tokens=4, metadata={"user_id": "u1"}, **body)
    assert counted == msg.usage.input_tokens + msg.usage.cache_read_input_tokens > 100
    again = c.messages.create(max_tokens=4, **body)  # read from the prompt cache this time
    assert again.usage.cache_read_input_tokens > 0 and counted == again.usage.input_tokens + \
        again.usage.cache_read_input_tokens
    assert c.messages.count_tokens(model="m", messages=ASK, thinking={"type": "disabled"}).input_tokens == \
        c.messages.count_tokens(model="m", messages=ASK).input_tokens  # no thinking switch: no effect


def test_output_config_format_constrains_the_text(drafted):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]}
    msg = client_for(drafted).messages.create(model="m", max_tokens=24, messages=ASK, output_config={
        "format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    jsonschema.validate(json.loads(text_of(msg)), schema)


def test_the_key_may_come_as_x_api_key(drafted):
    ok = sdk(drafted, None, default_headers={"x-api-key": KEY})  # what Anthropic's clients send
    assert ok.messages.count_tokens(model="m", messages=ASK).input_tokens > 0
    assert sdk(drafted, KEY).messages.create(model="m", max_tokens=2, messages=ASK).content
    with pytest.raises(anthropic.AuthenticationError) as exc:
        sdk(drafted, None, default_headers={"x-api-key": "wrong"}).messages.create(model="m", max_tokens=2,
                                                                                   messages=ASK)
    assert_anthropic_error(exc.value.body, "authentication_error")
    status, _, body = raw(drafted, "POST", "/v1/messages", {"max_tokens": 2, "messages": ASK})
    assert status == 401
    assert_anthropic_error(body, "authentication_error")
    status, _, body = raw(drafted, "POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 1},
                          headers={"x-api-key": KEY})
    assert status == 200, body


def _wait_idle(server, cancelled_before: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        queue = health(server)["queue"]
        if queue["cancelled"] > cancelled_before and not queue["running"]:
            return
        assert time.monotonic() < deadline, queue
        time.sleep(0.1)


def _post(server, body: dict) -> socket.socket:
    """Send a request and read nothing back (a client that will hang up)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


LONG = {"max_tokens": 600, "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}


def test_disconnect_cancels_and_a_full_queue_is_overloaded(plain):
    before = health(plain)["queue"]["cancelled"]
    with sdk(plain).messages.create(model="m", stream=True, **LONG) as stream:
        for i, _ in enumerate(stream):
            if i == 4:
                break
    _wait_idle(plain, before)  # stopped at a round, not after 600 tokens
    before = health(plain)["queue"]["cancelled"]
    running = _post(plain, LONG)  # a whole message whose client leaves while it runs ...
    while not health(plain)["queue"]["running"]:
        time.sleep(0.05)
    waiting = _post(plain, {**LONG, "stream": True})  # ... one waiting behind it (the server has --max-queue 1)
    while not health(plain)["queue"]["waiting"]:
        time.sleep(0.05)
    with pytest.raises(anthropic.InternalServerError) as exc:  # 503: the queue is full
        sdk(plain).messages.create(model="m", max_tokens=2, messages=ASK)
    assert exc.value.status_code == 503 and exc.value.response.headers["Retry-After"]
    assert_anthropic_error(exc.value.body, "overloaded_error")
    waiting.close()
    running.close()
    _wait_idle(plain, before + 1)


def _msg(**fields):
    return {"max_tokens": 2, "messages": ASK, **fields}


def _turns(*messages):
    return {"max_tokens": 2, "tools": [WEATHER], "messages": list(messages)}


CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                          "input": {"city": "Paris", "unit": "celsius"}}]}
HUGE = {"name": "huge", "input_schema": {"type": "object", "properties": {
    f"p{i}": {"type": "string", "maxLength": 16384} for i in range(64)}}}
# (body or raw bytes, status, a fragment of the message)
HOSTILE = [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"messages": ASK}, 400, "'max_tokens' is required"),
    (_msg(max_tokens=0), 400, "max_tokens"),
    (_msg(max_tokens="16"), 400, "max_tokens"),
    (_msg(max_tokens=10 ** 9), 400, "lower max_tokens"),
    ({"max_tokens": 2}, 400, "'messages' is required"),
    (_msg(messages=[]), 400, "non-empty"),
    (_msg(messages="hi"), 400, "non-empty list"),
    (_msg(messages=[{"role": "system", "content": "x"}]), 400, "top-level 'system'"),
    (_msg(messages=[{"role": "tool", "content": "x"}]), 400, "'user' or 'assistant'"),
    (_msg(messages=[{"role": "user"}]), 400, "content is required"),
    (_msg(messages=[{"role": "user", "content": 5}]), 400, "string or a list"),
    (_msg(messages=[{"role": "user", "content": []}]), 400, "at least one"),
    (_msg(messages=[{"role": "user", "content": [{"text": "no type"}]}]), 400, "string 'type'"),
    (_msg(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]), 400, "text must be a string"),
    (_msg(messages=[{"role": "user", "content": [{"type": "video", "text": "x"}]}]), 400, "'video'"),
    (_msg(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]),
     400, "text-only model"),
    (_msg(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]), 400, "'document'"),
    (_msg(messages=[{"role": "user", "content": "x", "name": "bob"}]), 400, "'name'"),
    (_msg(messages=[*ASK, {"role": "assistant", "content": "Red"}]), 400, "prefill"),
    (_msg(system=5), 400, "system"),
    (_msg(system=[{"type": "image"}]), 400, "text block"),
    (_msg(temperature=1.5), 400, "[0, 1]"),
    (_msg(temperature="hot"), 400, "temperature"),
    (_msg(top_p=0), 400, "top_p"),
    (_msg(top_k=-1), 400, "top_k"),
    (_msg(stop_sequences="x"), 400, "list of strings"),
    (_msg(stop_sequences=[""]), 400, "empty string"),
    (_msg(stop_sequences=["x"] * 65), 400, "stop_sequences"),
    (_msg(stream="yes"), 400, "stream"),
    (_msg(model=7), 400, "model"),
    (_msg(metadata="u"), 400, "metadata"),
    (_msg(metadata={"user_id": "u", "tier": 1}), 400, "'tier'"),
    (_msg(thinking={"type": "enabled"}), 400, "budget_tokens"),
    (_msg(thinking={"type": "enabled", "budget_tokens": 2048}), 400, "less than max_tokens"),
    (_msg(thinking="on"), 400, "thinking"),
    (_msg(mcp_servers=[{"url": "x"}]), 400, "not supported"),
    (_msg(output_config={"format": {"type": "json_schema"}}), 400, "output_config.format"),
    (_msg(output_config={"effort": "extreme"}), 400, "effort"),
    (_msg(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}}, tools=[WEATHER]), 400,
     "tool_choice"),
    (_msg(output_config={"format": {"type": "json_schema", "schema": {"type": "string", "maxLength": 10 ** 6}}}),
     400, "output_config.format.schema"),
    (_msg(frequency_penalty=1), 400, "unknown"),
    (_msg(cache_control={"type": "forever"}), 400, "ephemeral"),
    (_msg(tools={"name": "x"}), 400, "list of tools"),
    (_msg(tools=[{"name": "x"}]), 400, "input_schema"),
    (_msg(tools=[{"name": "x", "input_schema": {"type": "string"}}]), 400, "\"type\": \"object\""),
    (_msg(tools=[{"name": "bad name!", "input_schema": {"type": "object"}}]), 400, "letters, digits"),
    (_msg(tools=[{"name": {"a": 1}, "input_schema": {"type": "object"}}]), 400, "name must be a string"),
    (_msg(tools=[{"name": "x", "description": 5, "input_schema": {"type": "object"}}]), 400, "description"),
    (_msg(tools=[{"type": "web_search_20250305", "name": "web_search"}]), 400, "server tools"),
    (_msg(tools=[WEATHER, WEATHER]), 400, "twice"),
    (_msg(tools=[{**TIME, "input_schema": {"type": "object", "properties": {"a": {"type": "string",
                                                                                   "maxLength": 10 ** 6}}}}],
          tool_choice={"type": "any"}), 400, "input_schema"),  # forced: decoded under its grammar
    (_msg(tools=[HUGE], tool_choice={"type": "any"}), 400, "limit"),
    (_msg(tools=[{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(129)]), 400, "limit"),
    (_msg(tools=[WEATHER], tool_choice="auto"), 400, "tool_choice"),
    (_msg(tools=[WEATHER], tool_choice={"type": "function"}), 400, "tool_choice"),
    (_msg(tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}), 400, "not one of the tools"),
    (_msg(tool_choice={"type": "any"}), 400, "no 'tools'"),
    (_msg(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": "no"}), 400, "true or false"),
    (_turns(WEATHER_Q[0], CALL, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_other", "content": "x"}]}), 400, "answers no tool call"),
    (_turns(WEATHER_Q[0], CALL, {"role": "user", "content": "no result"}), 400, "without a tool_result"),
    (_turns(WEATHER_Q[0], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}), 400, "no tool_use"),
    (_turns(WEATHER_Q[0], CALL, {"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "tool_result", "tool_use_id": "toolu_1"}]}), 400,
     "before any text"),
    (_turns(WEATHER_Q[0], CALL, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image", "source": {}}]}]}),
     400, "text-only"),
    (_turns(WEATHER_Q[0], CALL, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes"}]}), 400, "is_error"),
    (_turns(WEATHER_Q[0], {**CALL, "content": [{**CALL["content"][0], "name": "unknown"}]}, *ASK), 400, "not one"),
    (_turns(WEATHER_Q[0], {**CALL, "content": [{**CALL["content"][0], "name": ["x"]}]}, *ASK), 400, "not one"),
    (_turns(WEATHER_Q[0], CALL, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": ["toolu_1"]}]}), 400, "answers no tool call"),
    (_msg(tools=[WEATHER], tool_choice={"type": "tool", "name": {"n": 1}}), 400, "not one of the tools"),
    (_msg(messages=[{"role": ["user"], "content": "x"}]), 400, "'user' or 'assistant'"),
    (_turns(WEATHER_Q[0], {**CALL, "content": [{**CALL["content"][0], "input": "city=Paris"}]}, *ASK), 400,
     "input must be an object"),
    (_turns(WEATHER_Q[0], {**CALL, "content": [{**CALL["content"][0], "id": ""}]}, *ASK), 400, "non-empty"),
    ({**_msg(), "messages": [{"role": "user", "content": "x" * 40000}]}, 400, "context"),
    (_msg(context_management={"edits": "all"}), 400, "context_management"),
    (_msg(context_management=[{"type": "clear_thinking_20251015"}]), 400, "context_management"),
]


def test_hostile_requests_get_one_anthropic_error_each(plain):
    for body, status, fragment in HOSTILE:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        got, headers, answer = raw(plain, "POST", "/v1/messages", data)
        assert got == status, (body, got, answer)
        assert_anthropic_error(answer, "invalid_request_error")
        assert fragment in answer["error"]["message"], (fragment, answer)
        assert "Traceback" not in answer["error"]["message"]
        if not isinstance(body, bytes) and got == 400 and "max_tokens" in body:  # count_tokens refuses it too
            counted = dict(body)
            if counted.get("max_tokens") in (10 ** 9,):
                continue
            got, _, answer = raw(plain, "POST", "/v1/messages/count_tokens", counted)
            assert got == 400, (body, answer)
            assert_anthropic_error(answer, "invalid_request_error")
    got, _, answer = raw(plain, "POST", "/v1/messages", b'{"system": "' + b"x" * (17 << 20) + b'"}')
    assert got == 413
    assert_anthropic_error(answer, "request_too_large")
    for method, path, want in (("GET", "/v1/messages", 405), ("POST", "/v1/messages/nope", 404)):
        got, _, answer = raw(plain, method, path)
        assert got == want
        assert_anthropic_error(answer, "not_found_error" if want == 404 else None)
    got, _, answer = raw(plain, "POST", "/v1/messages", _msg(), headers={"Host": "evil.example.com"})
    assert got == 403
    assert_anthropic_error(answer, "permission_error")
    with pytest.raises(anthropic.BadRequestError) as exc:  # as the SDK reports it
        sdk(plain).messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert exc.value.status_code == 400 and "text-only" in exc.value.body["error"]["message"]
    assert_anthropic_error(exc.value.body, "invalid_request_error")
    got, _, answer = raw(plain, "POST", "/v1/chat/completions", {"max_tokens": 0})  # the chat endpoint's own shape
    assert got == 400 and set(answer) == {"error"}
    assert health(plain)["status"] == "ok"  # alive, and still answering
    assert text_of(sdk(plain).messages.create(model="m", max_tokens=4, messages=ASK))


def test_the_python_function_and_thinking_switch(tmp_path):
    """SpecGGUF.create_message (messagereply.create); thinking reaches a template's enable_thinking,
    and what the model then reasons comes back as a thinking block (here a template that opens
    <think> itself, as Qwen3's thinking models do; the synthetic target writes random tokens)."""
    from specgguf.api import SpecGGUF
    from specgguf.request import messages
    from specgguf.synthetic.qwen3 import QwenShape, write_qwen3

    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
                "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}")
    target = write_qwen3(tmp_path / "thinking.gguf", QwenShape(), seed=0, chat_template=template)
    with SpecGGUF(target, n_ctx=256, n_threads=1) as llm:
        default = messages.count_tokens(llm, {"messages": ASK})["input_tokens"]
        off = messages.count_tokens(llm, {"messages": ASK, "thinking": {"type": "disabled"}})["input_tokens"]
        on = messages.count_tokens(llm, {"messages": ASK, "thinking": {"type": "adaptive"}})["input_tokens"]
        assert off > default == on  # disabled closes the template's think block in the prompt
        for thinking, kind in (("adaptive", "thinking"), ("disabled", "text")):
            body = {"max_tokens": 4, "messages": ASK, "thinking": {"type": thinking}}
            msg = llm.create_message(**body)
            assert [b["type"] for b in msg["content"]] == [kind] and msg["stop_reason"] == "max_tokens"
            events = list(llm.create_message(**body, stream=True))
            assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
            deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
            assert "".join(d.get(kind, "") for d in deltas) == msg["content"][0][kind]
            assert deltas[-1]["type"] == ("signature_delta" if kind == "thinking" else "text_delta")
        with pytest.raises(ValueError, match="max_tokens"):
            llm.create_message(messages=ASK)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_thinking_splits_off_whatever_the_pieces(size):
    from specgguf.request.messagereply import Thinking, split_thinking

    text = "  <think>\nFirst, red.</thin then </think>\n\nRed, green and blue."
    splitter, parts = Thinking(), {"thinking": "", "text": ""}
    for i in range(0, len(text), size):
        for kind, piece in splitter.feed(text[i:i + size]):
            parts[kind] += piece
    for kind, piece in splitter.finish():
        parts[kind] += piece
    assert parts == {"thinking": "\nFirst, red.</thin then ", "text": "Red, green and blue."}
    assert split_thinking(text) == (parts["thinking"], parts["text"])
    assert split_thinking("No reasoning <think> here") == ("", "No reasoning <think> here")
    assert split_thinking("cut by max_tokens", opened=True) == ("cut by max_tokens", "")
    assert split_thinking("<thi") == ("", "<thi")


def test_pings_keep_a_quiet_stream_open(chat_model_path, monkeypatch):
    """Between events a `ping` goes out every PING_INTERVAL (shortened here), in the stream's own
    `event:`/`data:` form: what keeps a client waiting on a long prompt from timing out."""
    import threading

    import uvicorn

    from specgguf.api import SpecGGUF
    from specgguf.server import anthropic as wire
    from specgguf.server.app import create_app

    monkeypatch.setattr(wire, "PING_INTERVAL", 0.05)
    with SpecGGUF(chat_model_path, n_ctx=512, n_threads=1) as llm:
        app = create_app(llm)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            while not server.started:
                time.sleep(0.02)
            local = type("Local", (), {"port": sock.getsockname()[1]})
            status, _, body = _stream_raw(local, {"max_tokens": 48, "stream": True, "messages": ASK})
        finally:
            server.should_exit = True
            thread.join(10)
            app.state.scheduler.close()
    assert status == 200
    pairs = [part.split("\n") for part in body.strip().split("\n\n")]
    pings = [p for p in pairs if p[0] == "event: ping"]
    assert len(pings) > 1 and all(p == ["event: ping", 'data: {"type": "ping"}'] for p in pings)
    assert pairs[-1][0] == "event: message_stop"


def _paths(value, path=()):
    """Every place in a JSON value, as key paths."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _paths(item, (*path, key))


def _replaced(value, path, new):
    if not path:
        return new
    out = dict(value) if isinstance(value, dict) else list(value)
    out[path[0]] = _replaced(value[path[0]], path[1:], new)
    return out


def test_every_field_of_a_body_swapped_for_any_type_is_refused_in_words(qwen3_target):
    """Each place of a full body, given each JSON type in turn, is prepared (translated, checked,
    rendered, tokenized) or refused with a RequestError, never anything else (a 500 on the wire)."""
    from specgguf.api import SpecGGUF
    from specgguf.errors import RequestError
    from specgguf.request.messages import prepare

    body = {"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s", "cache_control": {
        "type": "ephemeral", "ttl": "5m"}}], "stop_sequences": ["x"], "temperature": 0.5, "top_p": 0.9, "top_k": 4,
        "metadata": {"user_id": "u"}, "thinking": {"type": "enabled", "budget_tokens": 1024}, "service_tier": "auto",
        "output_config": {"effort": "low"}, "tools": [WEATHER], "tool_choice": {"type": "auto"},
        "messages": [WEATHER_Q[0], CALL, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
             "content": [{"type": "text", "text": "18 C"}]}, {"type": "text", "text": "and?"}]}]}
    body["max_tokens"] = 2048
    swaps = [None, 0, -1, 1.5, True, "x", "", [], [1], {}, {"type": "text"}, {"a": [1]}]
    with SpecGGUF(qwen3_target, n_ctx=4096, n_threads=1) as llm:
        prepare(llm, body)  # the whole body is fine
        for path in _paths(body):
            for new in swaps:
                try:
                    prepare(llm, _replaced(body, path, new))
                except RequestError as exc:
                    assert str(exc) and "Traceback" not in str(exc)


def test_what_claude_code_sends_is_taken(plain):
    """Fields Claude Code sends on every request (seen from Claude Code 2.1 against this server):
    context_management (accepted, no edit made), thinking with a budget, a metadata user_id that
    is JSON text, and tool schemas with keywords a grammar could not enforce (maximum, a 512k
    maxLength): under tool_choice auto they only reach the prompt."""
    body = _msg(metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
                tools=[{"name": "Bash", "description": "Run a command", "input_schema": {
                    "type": "object", "required": ["command"], "properties": {
                        "command": {"type": "string", "maxLength": 524288},
                        "timeout": {"type": "number", "maximum": 600000}}}}])
    msg = sdk(plain).messages.create(model="claude-sonnet-4-5", **body, extra_body={
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
