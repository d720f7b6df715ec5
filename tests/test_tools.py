"""Tool calls (specgguf/request/tools.py): tools through the chat template, calls parsed into OpenAI's
`tool_calls`, streamed as OpenAI streams them, and forced calls constrained by a grammar built
from the function's JSON schema; the real `openai` client and `langchain-openai` against
`specgguf serve`.

The synthetic qwen3 target here carries a Hermes/Qwen3-style template (tools in a <tools>
block, calls as <tool_call> JSON); the embedded Gemma 3 270M has no template, so it gets the
documented fallback: a system message listing the tools, and Gemma's `[name(key=value)]` format.
"""

from __future__ import annotations

import json
import re

import pytest

from specgguf.api import SpecGGUF
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3
from specgguf.request.tools import ToolSet

# A compact Hermes-style template written for these tests (the shape Qwen3's template has).
TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each function call, return a json object with function name and arguments within <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role != 'system' %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% endif %}{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                       "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_target(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("tools") / "qwen3-tools.gguf", QwenShape(), seed=0,
                       chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def tool_draft(tmp_path_factory):
    return write_qwen3(tmp_path_factory.mktemp("tools-draft") / "qwen3-tools-draft.gguf", QwenShape(), seed=0,
                       perturb=0.1, chat_template=TEMPLATE)


def check_call(call: dict, fn: dict) -> dict:
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == fn["name"]
    args = json.loads(call["function"]["arguments"])
    props = fn["parameters"]["properties"]
    assert set(fn["parameters"]["required"]) <= set(args) <= set(props)
    for k, v in args.items():
        if "enum" in props[k]:
            assert v in props[k]["enum"]
        else:
            assert isinstance(v, str) and re.fullmatch(props[k]["pattern"][1:-1], v), v
    return args


def assemble(chunks) -> tuple[str, list[dict], str]:
    """(content, tool calls, finish_reason) of a chat stream, put together as OpenAI clients do."""
    content, calls, reason = "", {}, None
    for ch in chunks:
        for choice in ch["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for d in delta.get("tool_calls") or []:
                call = calls.setdefault(d["index"], {"id": None, "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                call["id"] = d.get("id") or call["id"]
                call["function"]["name"] += d.get("function", {}).get("name") or ""
                call["function"]["arguments"] += d.get("function", {}).get("arguments") or ""
            reason = choice["finish_reason"] or reason
    return content, [calls[i] for i in sorted(calls)], reason


# -- parsing (pure text) ---------------------------------------------------------------------

def test_hermes_calls_parse_and_stream_in_pieces():
    ts = ToolSet(TOOLS, "auto", TEMPLATE, "qwen3")
    assert ts.in_template and ts.format == "hermes"
    text = ('Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
            '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "cet"}}</tool_call>')
    content, calls = ts.parse(text)
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    for size in (1, 3, 7, 1000):  # any split of the text gives the same calls
        out = list(ts.stream(text[i:i + size] for i in range(0, len(text), size)))
        streamed = "".join(p for p in out if isinstance(p, str))
        deltas = [d for p in out if not isinstance(p, str) for d in p]
        assert streamed.strip() == "Let me look."
        assert [d["function"]["name"] for d in deltas if "id" in d] == ["get_weather", "get_time"]
        assert [d["index"] for d in deltas] == [0, 0, 1, 1]
    assert ts.parse("no call here, only < and <tool") == ("no call here, only < and <tool", [])
    none = ToolSet(TOOLS, "none", TEMPLATE, "qwen3")
    assert none.parse(text) == (text, [])


def test_gemma_calls_parse():
    ts = ToolSet(TOOLS, "auto", None, "gemma3")
    assert not ts.in_template and ts.format == "gemma"
    content, calls = ts.parse('[get_weather(city="Paris", unit="celsius"), get_time(zone="utc")]')
    assert content is None and [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris", "unit": "celsius"}, {"zone": "utc"}]
    content, calls = ts.parse('Sure.\n```tool_code\nget_weather(city="Rome", unit="celsius")\n```')
    assert content == "Sure." and calls[0]["function"]["name"] == "get_weather"
    assert ts.parse("[1, 2, 3] are numbers") == ("[1, 2, 3] are numbers", [])
    out = list(ts.stream(iter(["[get_", 'time(zone=', '"utc")]'])))
    assert len(out) == 1 and out[0][0]["function"]["name"] == "get_time"
    assert list(ts.stream(iter(["Hello", " there"]))) == ["Hello", " there"]


def test_fallback_prompt_lists_tools_and_rewrites_history():
    ts = ToolSet([WEATHER], "auto", None, "llama")
    msgs = ts.messages([{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                        {"role": "tool", "content": "12 C", "tool_call_id": "c1"}])
    assert msgs[0]["role"] == "system" and '"get_weather"' in msgs[0]["content"]
    assert "<tool_call>" in msgs[0]["content"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in msgs[2]["content"]
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n12 C\n</tool_response>"}


# -- generation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_is_valid_streamed_and_lossless(tool_target, tool_draft, choice):
    with SpecGGUF(tool_target, draft=str(tool_draft), n_ctx=1024, draft_max=4) as llm:
        r = llm.create_chat_completion(ASK, max_tokens=160, tools=TOOLS, tool_choice=choice)
        chunks = list(llm.create_chat_completion(ASK, max_tokens=160, tools=TOOLS, tool_choice=choice, stream=True))
        req = llm.prepare({"messages": ASK, "tools": TOOLS, "tool_choice": choice}, chat=True)
        prompt = llm.target.model.detokenize(req.tokens, special=True)
        plain, _ = llm.stream_tokens(req.tokens, 160, grammar=req.grammar, speculate=False)
        _, plain_calls = req.tools.parse(llm.target.model.detokenize(list(plain)))
    choice0 = r["choices"][0]
    assert "<tools>" in prompt and '"get_weather"' in prompt  # the template rendered the tools
    assert choice0["finish_reason"] == "tool_calls" and choice0["message"]["content"] is None
    (call,) = choice0["message"]["tool_calls"]
    fn = WEATHER["function"] if isinstance(choice, dict) else next(
        t["function"] for t in TOOLS if t["function"]["name"] == call["function"]["name"])
    args = check_call(call, fn)
    content, calls, reason = assemble(chunks)
    assert reason == "tool_calls" and content == ""
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (call["function"]["name"], args)]
    # speculative == plain decoding with the same grammar
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in plain_calls] == [
        (call["function"]["name"], call["function"]["arguments"])]
    assert r["specgguf"]["drafted"] > 0


def test_auto_and_none_answer_in_openai_shape(tool_target):
    with SpecGGUF(tool_target, draft="ngram", n_ctx=1024, draft_max=4) as llm:
        auto = llm.create_chat_completion(ASK, max_tokens=24, tools=TOOLS)
        none = llm.create_chat_completion(ASK, max_tokens=24, tools=TOOLS, tool_choice="none")
        plain = llm.create_chat_completion(ASK, max_tokens=24)
    for r in (auto, none):
        msg = r["choices"][0]["message"]
        assert msg["role"] == "assistant"
        if msg.get("tool_calls"):
            assert r["choices"][0]["finish_reason"] == "tool_calls"
        else:
            assert isinstance(msg["content"], str) and r["choices"][0]["finish_reason"] in ("stop", "length")
    # tools change the prompt (the template lists them) but "none" never parses calls
    assert auto["usage"]["prompt_tokens"] == none["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    assert "tool_calls" not in none["choices"][0]["message"]


def test_gemma_forced_call_in_gemma_format(gemma_path):
    with SpecGGUF(gemma_path, draft="ngram", n_ctx=1024, draft_max=4) as llm:
        req = llm.prepare({"messages": ASK, "tools": [WEATHER], "tool_choice": "required"}, chat=True)
        assert req.tools.format == "gemma" and "[func_name1(" in llm.target.model.detokenize(req.tokens)
        r = llm.create_chat_completion(ASK, max_tokens=40, tools=[WEATHER], tool_choice="required")
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    check_call(r["choices"][0]["message"]["tool_calls"][0], WEATHER["function"])


def test_tool_history_reaches_the_template(tool_target):
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]
    with SpecGGUF(tool_target, n_ctx=1024) as llm:
        req = llm.prepare({"messages": history, "tools": TOOLS}, chat=True)
        text = llm.target.model.detokenize(req.tokens, special=True)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in text
    assert "<tool_response>\n21 degrees\n</tool_response>" in text


@pytest.mark.parametrize("kwargs, param", [
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
    ({"functions": [WEATHER["function"]]}, "functions"),
])
def test_refused_tool_options(tool_target, kwargs, param):
    with SpecGGUF(tool_target, n_ctx=512) as llm:
        with pytest.raises(ValueError) as err:
            llm.create_chat_completion(ASK, max_tokens=4, **kwargs)
    assert err.value.param == param, str(err.value)


# -- over HTTP: the real openai client and langchain-openai against `specgguf serve` ----------------

@pytest.fixture(scope="module")
def tool_server(tool_target, tool_draft):
    from serverproc import start_server

    with start_server(tool_target, "--draft", tool_draft, "--ctx", 1024, "--draft-max", 4) as server:
        yield server


def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)


def test_openai_client_tools_forced_and_auto(tool_server):
    c = openai_client(tool_server)
    model = c.models.list().data[0].id
    forced = c.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=160,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    args = check_call(call.model_dump(), WEATHER["function"])
    stream = c.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=160, stream=True,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    content, calls, reason = assemble(ch.model_dump() for ch in stream)
    assert reason == "tool_calls" and [json.loads(c["function"]["arguments"]) for c in calls] == [args]
    assert forced.model_extra["specgguf"]["drafted"] > 0
    auto = c.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=24)
    msg = auto.choices[0].message
    if msg.tool_calls:
        assert auto.choices[0].finish_reason == "tool_calls"
    else:
        assert isinstance(msg.content, str) and auto.choices[0].finish_reason in ("stop", "length")


def test_openai_client_response_format(tool_server):
    c = openai_client(tool_server)
    schema = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                               "rain": {"type": "boolean"}}, "required": ["city", "rain"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": True}}
    r = c.chat.completions.create(model=c.models.list().data[0].id, messages=ASK, max_tokens=80, response_format=fmt)
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"city", "rain"} and re.fullmatch("[a-z]{1,8}", value["city"])
    assert isinstance(value["rain"], bool)
    r = c.chat.completions.create(model=c.models.list().data[0].id, messages=ASK, max_tokens=120,
                                  response_format={"type": "json_object"})
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        json.loads(text)
    assert text.startswith(("{", " {", "\n{"))


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}},
     "response_format.json_schema.schema"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"grammar": "root ::= missing"}, "grammar"),
])
def test_refused_options_get_the_openai_error_shape(tool_server, body, param):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", tool_server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"messages": ASK, "max_tokens": 4, **body}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    assert resp.status == 400
    assert set(out) == {"error"} and set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["param"] == param and out["error"]["message"]
    assert tool_server.alive()


def test_langchain_openai_chat_and_tool_call(tool_server):
    lc = pytest.importorskip("langchain_openai")
    llm = lc.ChatOpenAI(base_url=tool_server.base_url, api_key="none", model="qwen3-tools", max_tokens=160,
                        temperature=0, max_retries=0, timeout=300)
    reply = llm.invoke("Say hello.")
    assert isinstance(reply.content, str) and reply.response_metadata["finish_reason"] in ("stop", "length")
    forced = llm.bind_tools([WEATHER], tool_choice="get_weather")
    msg = forced.invoke("What is the weather in Paris?")
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather"
    check_call({"id": call["id"], "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["args"])}}, WEATHER["function"])


def test_an_agent_loop_reads_only_each_turns_new_tokens(tool_target):
    """Agent traffic: each request resends the system prompt, the tools and every earlier turn
    (its tool calls and results). Their rendering is the same from one request to the next, so
    the prompt of turn k is a prefix of turn k+1's and, with a drafter running, the prompt cache
    reads only what the turn added (the call, its result and the new request)."""
    system = {"role": "system", "content": "You are an agent. " * 40}
    with SpecGGUF(tool_target, draft="ngram", n_ctx=2048) as llm:
        messages, previous = [system, *ASK], None
        for turn in range(3):
            r = llm.create_chat_completion(messages, tools=[TIME], tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=160)
            prompt = llm.chat_prompt(messages, ToolSet([TIME], "required", TEMPLATE, "qwen3"))
            if previous is not None:
                assert prompt[:len(previous)] == previous, f"turn {turn + 1} re-renders an earlier turn"
                # all that the last request read is reused, less its last token (decoded with the output)
                assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(previous) - 1
            previous = prompt
            call = r["choices"][0]["message"]["tool_calls"][0]
            messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"ok": turn})}]


def test_unenforceable_keywords_are_refused_only_where_a_call_is_forced(tool_target):
    """Agents' tool schemas use `maximum`, `format`, ... (Claude Code's do): under auto the schema
    only reaches the prompt, so it is taken; a forced call, decoded under the schema's grammar,
    refuses what the grammar could not enforce."""
    bounded = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 3},
                                         "script": {"type": "string", "maxLength": 524288}}}}}
    with SpecGGUF(tool_target, n_ctx=512) as llm:
        for choice in ("auto", "none", None):
            extra = {} if choice is None else {"tool_choice": choice}
            assert llm.create_chat_completion(ASK, tools=[bounded], max_tokens=2, **extra)["choices"]
        with pytest.raises(ValueError, match="'maxLength' is 524288|'maximum'"):
            llm.create_chat_completion(ASK, tools=[bounded], tool_choice="required", max_tokens=2)
