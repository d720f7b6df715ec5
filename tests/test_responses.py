"""The Responses API (`POST /v1/responses`, request/responses.py and responseshape.py) with the real
`openai` SDK and an `openai-agents` agent against a real `specgguf serve` of SmolLM2-135M-Instruct
with `--draft ngram`.

The translation is proved by equality: a greedy Responses answer is the chat endpoint's answer
for the same conversation, token for token, also when the conversation comes from a stored
response through previous_response_id. Then the stream's events, a JSON-schema answer, the
store (retrieve, store: false, delete), an agent's tool round trip, and a hostile corpus that
gets one OpenAI-shaped 4xx per request while the server lives on.
"""

from __future__ import annotations

import asyncio
import http.client
import json

import openai
import pytest

from serverproc import start_server
from test_server import _wait_cancelled, assert_openai_error, health, raw

ASK = "What is the capital of France? Answer with one word."
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"]}, "strict": True}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def server(chat_model_path):
    with start_server(chat_model_path, "--draft", "ngram", "--ctx", 1024, "--draft-max", 4) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)


def chat_text(client, messages, max_tokens, **kw) -> str:
    r = client.chat.completions.create(model="x", messages=messages, max_tokens=max_tokens, temperature=0, **kw)
    return r.choices[0].message.content


def test_plain_answer_is_the_chat_answer(client):
    r = client.responses.create(model="gpt-4o-mini", instructions="You are brief.", input=ASK, max_output_tokens=12)
    expected = chat_text(client, [{"role": "system", "content": "You are brief."}, {"role": "user", "content": ASK}],
                         12)
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output_text == expected and "Paris" in expected, (r.output_text, expected)
    (item,) = r.output
    assert item.type == "message" and item.id.startswith("msg_") and item.content[0].type == "output_text"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "You are brief." and r.max_output_tokens == 12 and r.store is True
    assert r.model_extra["specgguf"]["generated_tokens"] == r.usage.output_tokens
    # items (text parts, a developer turn): the same conversation as chat messages
    items = [{"role": "developer", "content": "You are brief."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}]
    again = client.responses.create(model="x", input=items, max_output_tokens=12)
    assert again.output_text == chat_text(client, [{"role": "developer", "content": "You are brief."},
                                                   {"role": "user", "content": ASK}], 12)


def test_a_cut_answer_is_incomplete(client):
    r = client.responses.create(model="x", input="Write a long story about a cat.", max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4 and r.output[0].status == "incomplete"


def test_stream_events_in_order_and_deltas_join_to_the_text(client):
    whole = client.responses.create(model="x", input=ASK, max_output_tokens=12)
    events = list(client.responses.create(model="x", input=ASK, max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    head = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response." + whole.status]
    assert kinds[:4] == head and kinds[-4:] == tail, kinds
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == events[-4].text == whole.output_text
    assert final.id == events[0].response.id and events[0].response.status == "in_progress"
    assert client.responses.retrieve(final.id).output_text == text  # a streamed response is stored too
    # the SDK's stream helper reads the same events into its final response
    with client.responses.stream(model="x", input=ASK, max_output_tokens=12) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == whole.output_text


def test_stream_wire_format_and_a_disconnect_cancels(server):
    before = health(server)["queue"]["cancelled"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/responses", json.dumps({"input": "Write a long story about a cat.", "stream": True,
                                                      "max_output_tokens": 900}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    frames = []
    while len(frames) < 5:  # event: <type> / data: <json> / a blank line
        kind = resp.readline().decode()
        if kind.startswith(":"):  # a keep-alive comment
            continue
        data, blank = resp.readline().decode(), resp.readline().decode()
        assert kind.startswith("event: ") and data.startswith("data: ") and blank.strip() == "", (kind, data, blank)
        event = json.loads(data[len("data: "):])
        assert event["type"] == kind[len("event: "):].strip() and event["sequence_number"] == len(frames)
        frames.append(event["type"])
    assert frames[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added"]
    conn.close()  # the client goes away mid-stream: its generation stops at the next round
    _wait_cancelled(server, before)


def test_objects_and_events_validate_against_the_sdk_models(server):
    """Strict pydantic validation of the raw JSON (the SDK itself parses leniently): every field
    the SDK's models require is there, with its type."""
    import pydantic
    from openai.types.responses import Response, ResponseStreamEvent

    event_model = pydantic.TypeAdapter(ResponseStreamEvent)
    for body in ({"input": ASK, "max_output_tokens": 6, "metadata": {"a": "b"}, "reasoning": {"effort": "low"}},
                 {"input": "What is the weather in Paris?", "tools": [WEATHER], "tool_choice": "required",
                  "max_output_tokens": 40}):
        status, _, payload = raw(server, "POST", "/v1/responses", body)
        assert status == 200, payload
        Response.model_validate(payload)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/v1/responses", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        events = [json.loads(line[len(b"data: "):]) for line in conn.getresponse() if line.startswith(b"data: ")]
        conn.close()
        for event in events:
            event_model.validate_python(event)
        assert events[-1]["response"]["output"][0]["type"] == payload["output"][0]["type"]


def test_json_schema_output_validates(client):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = client.responses.create(model="x", input="Alice is 30 years old. Give her as JSON.", text={"format": fmt},
                                max_output_tokens=40)
    person = json.loads(r.output_text)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int) and isinstance(person["name"], str)
    assert r.text.format.type == "json_schema"
    obj = client.responses.create(model="x", input="Alice is 30. Give her as a JSON object.",
                                  text={"format": {"type": "json_object"}}, max_output_tokens=30)
    assert obj.status == "incomplete" or isinstance(json.loads(obj.output_text), dict)


def test_function_call_round_trip_through_previous_response_id(client):
    first = client.responses.create(model="x", input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert call.id.startswith("fc_") and json.loads(call.arguments)["city"] == "Paris"
    follow = client.responses.create(model="x", previous_response_id=first.id, tools=[WEATHER], tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "Sunny, 22 C"}], max_output_tokens=16)
    assert follow.previous_response_id == first.id and follow.output[0].type == "message"
    # the stored turn came first: the same conversation as chat messages gives the same answer
    chat_tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call.call_id, "type": "function", "function": {"name": call.name,
                                                                          "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 22 C"}]
    assert follow.output_text == chat_text(client, messages, 16, tools=[chat_tool], tool_choice="none")
    assert follow.usage.input_tokens > first.usage.input_tokens
    streamed = list(client.responses.create(model="x", input="What is the weather in Paris?", tools=[WEATHER],
                                            tool_choice="required", max_output_tokens=40, stream=True))
    kinds = [e.type for e in streamed]
    assert kinds[2:] == ["response.output_item.added", "response.function_call_arguments.delta",
                         "response.function_call_arguments.done", "response.output_item.done",
                         "response.completed"], kinds
    assert streamed[-1].response.output[0].arguments == call.arguments


def test_retrieve_store_false_and_delete(client, server):
    r = client.responses.create(model="x", input=ASK, max_output_tokens=4, metadata={"run": "7"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"run": "7"}
    unstored = client.responses.create(model="x", input=ASK, max_output_tokens=4, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.retrieve(unstored.id)
    assert unstored.id in exc.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="x", input="more", previous_response_id=unstored.id)
    status, _, body = raw(server, "DELETE", f"/v1/responses/{r.id}")
    assert status == 200 and body["deleted"] is True
    status, _, body = raw(server, "GET", f"/v1/responses/{r.id}")
    assert status == 404
    assert_openai_error(body, code="response_not_found")


def test_an_agent_calls_the_function_tool_and_answers(server):
    agents = pytest.importorskip("agents")
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather of a city."""
        calls.append(city)
        return f"Sunny, 22 C in {city}"

    agents.set_tracing_disabled(True)

    async def run():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120) as c:
            agent = agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                                 model=agents.OpenAIResponsesModel(model="gpt-4o-mini", openai_client=c),
                                 model_settings=agents.ModelSettings(tool_choice="required", max_tokens=40),
                                 reset_tool_choice=True)
            whole = await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)
            streamed = agents.Runner.run_streamed(agent, "What is the weather in Rome?", max_turns=3)
            async for _ in streamed.stream_events():
                pass
            return whole, streamed
    whole, streamed = asyncio.run(run())
    assert len(calls) == 2 and all(c.strip() for c in calls), calls
    for result in (whole, streamed):  # a forced call, the tool's output sent back, then a text answer
        assert len(result.raw_responses) == 2
        assert [type(i).__name__ for i in result.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                "MessageOutputItem"]
        assert isinstance(result.final_output, str) and result.final_output.strip(), result.final_output


HUGE = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 200} for i in range(400)}}
HOSTILE = [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [7]}, "input[0]"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"}]},
     "input[0].arguments"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": "hi", "previous_response_id": 12}, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "big", "parameters": HUGE}]}, None),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "hi", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "text.format.schema"),
    ({"input": "hi", "text": "json"}, "text"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "hi", "metadata": {"k": 1}}, "metadata"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "store": "yes"}, "store"),
    ({"input": "hi", "frobnicate": 1}, "frobnicate"),
    ({"input": "hi", "model": 3}, "model"),
]


def test_hostile_requests_get_one_openai_error_each(server):
    for body, param in HOSTILE:
        status, _, payload = raw(server, "POST", "/v1/responses", body)
        assert 400 <= status < 500, (body, status, payload)
        assert_openai_error(payload, param=param)
    status, _, payload = raw(server, "POST", "/v1/responses", b"{not json")
    assert status == 400
    assert_openai_error(payload, code="invalid_json")
    status, _, payload = raw(server, "GET", "/v1/responses/resp_nothing")
    assert status == 404 and "resp_nothing" in payload["error"]["message"]
    status, _, payload = raw(server, "POST", "/v1/responses", {"input": "Say hi.", "max_output_tokens": 2})
    assert status == 200 and payload["object"] == "response" and server.alive()


def test_the_python_entry_point(chat_model_path):
    """SpecGGUF.create_response (responseshape.create), the Python API's method: the same objects and
    events in process; previous_response_id needs the caller's stored conversation."""
    from openai.types.responses import Response

    from specgguf.api import SpecGGUF
    from specgguf.server.responsestore import ResponseStore

    with SpecGGUF(chat_model_path, draft="ngram", n_ctx=512, draft_max=4) as llm:
        whole = llm.create_response(input=ASK, max_output_tokens=6)
        events = list(llm.create_response(input=ASK, max_output_tokens=6, stream=True))
        with pytest.raises(ValueError, match="previous_response_id"):
            llm.create_response(input="more", previous_response_id=whole["id"])
        store = ResponseStore()
        store.put(whole, [{"type": "message", "role": "user", "content": ASK}])
        follow = llm.create_response(input="And of Italy?", previous_response_id=whole["id"], max_output_tokens=6,
                                     history=store.get(whole["id"])[1])
    Response.model_validate(whole)
    assert [k for k, _ in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == Response(**whole).output_text
    assert follow["usage"]["input_tokens"] > whole["usage"]["input_tokens"] + whole["usage"]["output_tokens"]


def test_the_store_keeps_its_bounds():
    from specgguf.server.responsestore import ResponseStore

    def response(i, text="x"):
        return {"id": f"resp_{i}", "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]}
    store = ResponseStore(max_responses=3, max_bytes=2000)
    for i in range(4):
        assert store.put(response(i), [])
    assert len(store) == 3 and store.get("resp_0") is None  # the least recently used went first
    store.get("resp_1")  # used: now the newest
    store.put(response(4, "y" * 600), [])
    assert store.get("resp_1") is not None and store.get("resp_2") is None
    assert not store.put(response(5, "z" * 3000), [])  # alone over the byte bound: not kept
    assert store.get("resp_5") is None and store._bytes <= 2000
    assert store.get("resp_1")[1] == [{"type": "message", "role": "assistant", "content": "x"}]
    assert store.delete("resp_1") and store.get("resp_1") is None and not store.delete("resp_1")


def test_reasoning_effort_turns_a_templates_thinking_switch(tmp_path):
    """Chat Completions' reasoning_effort and the Responses API's reasoning.effort reach a
    template's enable_thinking (none/minimal off, the others on); bad efforts are refused."""
    from specgguf.synthetic.qwen3 import QwenShape, write_qwen3

    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}"
                "<think>\n\n</think>\n\n{% endif %}")
    target = write_qwen3(tmp_path / "thinking.gguf", QwenShape(), seed=0, chat_template=template)
    ask = [{"role": "user", "content": "Hi"}]
    from specgguf.api import SpecGGUF

    with SpecGGUF(target, n_ctx=256, n_threads=1) as llm:
        def prompt_len(**kw):
            return llm.create_chat_completion(ask, max_tokens=1, **kw)["usage"]["prompt_tokens"]

        default, off, on = prompt_len(), prompt_len(reasoning_effort="minimal"), prompt_len(reasoning_effort="high")
        assert off > default == on  # off closes the think block in the prompt
        for effort, want in (("none", off), ("low", default)):
            r = llm.create_response(input="Hi", max_output_tokens=1, reasoning={"effort": effort})
            assert r["usage"]["input_tokens"] == want
        with pytest.raises(ValueError, match="reasoning_effort"):
            prompt_len(reasoning_effort="max")
