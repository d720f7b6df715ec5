"""Anthropic's Messages API (`POST /v1/messages`) as a chat completion.

An Anthropic body is checked here and translated into the OpenAI-shaped chat body that
`prepare.prepare` already takes (docs/server.md, "The Anthropic Messages API"): `system` becomes
the first message, content blocks become text, `tool_use` blocks an assistant's `tool_calls`,
`tool_result` blocks `tool` messages, `tools` OpenAI function tools and `tool_choice` the
OpenAI choice that forces the same grammar. So every drafter, the prompt cache, the slots and
the grammars work as they do for /v1/chat/completions, and the same conversation renders to the
same prompt tokens. messagereply.py shapes what comes back.

Errors are `RequestError`s whose `param` is the Anthropic path (`messages[2].content[0]`); the
server turns them into Anthropic's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError
from .chat import thinking_effort
from .params import json_type

# Fields of Anthropic's create body this server reads (CREATE) or refuses by name (REFUSED, with
# why); anything else is refused as unknown, as Anthropic's API does ("Extra inputs are not permitted").
# count_tokens takes the same body (max_tokens optional there), so a client may count what it sends.
CREATE = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
          "tools", "tool_choice", "metadata", "thinking", "service_tier", "cache_control", "output_config",
          "context_management"}
REFUSED = {"container": "code-execution containers", "mcp_servers": "remote MCP servers",
           "inference_geo": "inference regions",
           "speed": "speed tiers", "diagnostics": "diagnostics"}
EFFORTS = ("low", "medium", "high", "xhigh", "max")
MAX_MESSAGES = 100_000  # Anthropic's own limit on messages per request
IS_ERROR_PREFIX = "Error: "  # how a tool_result with is_error reaches a template, which has no error flag


def _fail(message: str, param: str, code: str = "invalid_value"):
    raise RequestError(message[:400], param=param, code=code)


def _keys(obj: dict, allowed: set, param: str) -> None:
    """Refuse keys this server does not read; a key set to null counts as absent."""
    extra = sorted(k for k, v in obj.items() if k not in allowed and v is not None)
    if extra:
        _fail(f"{param}: unknown or unsupported field(s) {', '.join(map(repr, extra))}; "
              f"accepted here: {', '.join(sorted(allowed))}", param)


def _cache_control(value, param: str) -> None:
    """Accepted and checked; the prompt cache is automatic (docs/server.md), so it changes nothing."""
    if value is None:
        return
    field = f"{param}.cache_control" if param else "cache_control"
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        _fail(f'{field} must be {{"type": "ephemeral"}} (optionally with "ttl")', field)
    _keys(value, {"type", "ttl"}, field)
    if value.get("ttl") not in (None, "5m", "1h"):
        _fail(f"{field}.ttl must be '5m' or '1h'", field)


def _text_block(block: dict, param: str) -> str:
    _keys(block, {"type", "text", "cache_control", "citations"}, param)
    if not isinstance(block.get("text"), str):
        _fail(f"{param}.text must be a string (got {json_type(block.get('text'))})", param, "invalid_type")
    if block.get("citations") not in (None, []):
        _fail(f"{param}.citations: citations are not supported (this server cites no documents)", param)
    _cache_control(block.get("cache_control"), param)
    return block["text"]


def _blocks(content, param: str, allow_string: bool = True) -> list[dict]:
    """Content as a list of block objects (a string is one text block)."""
    if isinstance(content, str) and allow_string:
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        _fail(f"{param} must be a string or a list of content blocks (got {json_type(content)})", param, "invalid_type")
    if not content:
        _fail(f"{param} must hold at least one content block", param)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            _fail(f"{param}[{j}] must be an object with a string 'type'", f"{param}[{j}]", "invalid_type")
    return content


def _refuse_block(kind: str, param: str, where: str):
    if kind in ("image", "document", "search_result", "container_upload"):
        _fail(f"{param}: '{kind}' blocks are not supported: this server runs a text-only model; send the "
              "content as text", param, "unsupported_content")
    _fail(f"{param}: a block of type {kind[:40]!r} is not supported in {where}; use "
          f"{'text and tool_use' if where == 'an assistant message' else 'text and tool_result'} blocks", param)


def system_text(value) -> str | None:
    """`system`: a string or a list of text blocks (joined with blank lines, as separate paragraphs)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    blocks = _blocks(value, "system", allow_string=False)
    texts = []
    for j, block in enumerate(blocks):
        if block["type"] != "text":
            _fail(f"system[{j}] must be a text block (got {block['type'][:40]!r})", f"system[{j}]")
        texts.append(_text_block(block, f"system[{j}]"))
    return "\n\n".join(texts)


def tools_value(value) -> list[dict] | None:
    """Anthropic's client tools ({name, description?, input_schema}) as OpenAI function tools
    (ToolSet checks the names, the count and the schemas)."""
    if value is None:
        return None
    if not isinstance(value, list):
        _fail(f"'tools' must be a list of tools (got {json_type(value)})", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            _fail(f"{param} must be an object with 'name' and 'input_schema'", param, "invalid_type")
        if tool.get("type") not in (None, "custom"):
            _fail(f"{param}: server tools (type {str(tool['type'])[:40]!r}) are not supported: only client "
                  "tools, {name, description, input_schema}, which your code runs", param)
        _keys(tool, {"type", "name", "description", "input_schema", "cache_control"}, param)
        if not isinstance(tool.get("name"), str):  # its form is ToolSet's to check
            _fail(f"{param}.name must be a string (got {json_type(tool.get('name'))})", f"{param}.name", "invalid_type")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            _fail(f"{param}.input_schema must be a JSON schema object with \"type\": \"object\"",
                  f"{param}.input_schema", "invalid_type" if not isinstance(schema, dict) else "invalid_value")
        _cache_control(tool.get("cache_control"), param)
        fn = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def tool_choice_value(value, tools: list[dict] | None) -> tuple[object, bool | None]:
    """(OpenAI tool_choice, parallel_tool_calls) for Anthropic's tool_choice."""
    if value is None:
        return None, None
    if not isinstance(value, dict) or value.get("type") not in ("auto", "any", "tool", "none"):
        _fail('\'tool_choice\' must be {"type": "auto"}, {"type": "any"}, {"type": "tool", "name": ...} or '
              '{"type": "none"}', "tool_choice")
    kind = value["type"]
    _keys(value, {"type", "name", "disable_parallel_tool_use"} if kind == "tool" else
          {"type", "disable_parallel_tool_use"} if kind != "none" else {"type"}, "tool_choice")
    names = [t["function"]["name"] for t in tools or []]
    if kind in ("any", "tool") and not names:
        _fail(f"'tool_choice' is {kind!r} but no 'tools' were given", "tool_choice")
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        _fail("tool_choice.disable_parallel_tool_use must be true or false", "tool_choice", "invalid_type")
    if kind == "tool":
        if value.get("name") not in names:
            _fail(f"tool_choice.name {str(value.get('name'))[:64]!r} is not one of the tools: "
                  f"{', '.join(names)[:200]}", "tool_choice.name")
        choice = {"type": "function", "function": {"name": value["name"]}}
    else:
        choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    return choice, (None if parallel is None else not parallel)


def chat_messages(value, system: str | None, tool_names: set[str]) -> list[dict]:
    """Anthropic's `messages` as OpenAI chat messages (system first)."""
    if value is None:
        _fail("'messages' is required", "messages", "missing_field")
    if not isinstance(value, list) or not value:
        _fail("'messages' must be a non-empty list of {\"role\", \"content\"}", "messages", "invalid_type")
    if len(value) > MAX_MESSAGES:
        _fail(f"'messages' has {len(value)} messages; the limit is {MAX_MESSAGES}", "messages")
    out = [{"role": "system", "content": system}] if system is not None else []
    waiting: list[str] = []  # tool_use ids of the last assistant turn that want a tool_result next
    seen: set[str] = set()
    for i, m in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            _fail(f"{param} must be an object with 'role' and 'content'", param, "invalid_type")
        _keys(m, {"role", "content"}, param)
        role = m.get("role")
        if role not in ("user", "assistant"):
            hint = " (put system text in the top-level 'system' field)" if role == "system" else ""
            _fail(f"{param}.role must be 'user' or 'assistant' (got {str(role)[:40]!r}){hint}", f"{param}.role")
        if "content" not in m or m["content"] is None:
            _fail(f"{param}.content is required", f"{param}.content", "missing_field")
        blocks = _blocks(m["content"], f"{param}.content")
        if role == "assistant":
            if waiting:
                _fail(f"messages[{i - 1}] has tool_use ids without a tool_result in the next user message: "
                      f"{', '.join(waiting)[:200]}", f"messages[{i - 1}]")
            msg, waiting = _assistant(blocks, f"{param}.content", tool_names, seen)
            out.append(msg)
        else:
            out.extend(_user(blocks, f"{param}.content", waiting, i))
            waiting = []
    if value[-1].get("role") == "assistant":
        _fail("the last message is an assistant's: prefilling an answer is not supported here; end with a "
              "user message", f"messages[{len(value) - 1}]", "unsupported_parameter")
    return out


def _assistant(blocks: list[dict], param: str, tool_names: set[str], seen: set[str]) -> tuple[dict, list[str]]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        where, kind = f"{param}[{j}]", block["type"]
        if kind == "text":
            texts.append(_text_block(block, where))
        elif kind == "tool_use":
            _keys(block, {"type", "id", "name", "input", "cache_control"}, where)
            tid, name, args = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(tid, str) or not tid:
                _fail(f"{where}.id must be a non-empty string", f"{where}.id", "invalid_type")
            if tid in seen:
                _fail(f"{where}.id {tid[:64]!r} is used twice in the conversation", f"{where}.id")
            if not isinstance(name, str) or name not in tool_names:
                _fail(f"{where}.name {str(name)[:64]!r} is not one of the request's 'tools' (send the tools the "
                      "conversation used)", f"{where}.name")
            if not isinstance(args, dict):
                _fail(f"{where}.input must be an object (got {json_type(args)})", f"{where}.input", "invalid_type")
            _cache_control(block.get("cache_control"), where)
            seen.add(tid)
            calls.append({"id": tid, "type": "function", "function": {"name": name, "arguments": args}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier turns' thinking leaves the context, as Anthropic's API does (docs/server.md)
        else:
            _refuse_block(kind, where, "an assistant message")
    msg = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg, [c["id"] for c in calls]


def _user(blocks: list[dict], param: str, waiting: list[str], i: int) -> list[dict]:
    out, texts, answered = [], [], set()
    for j, block in enumerate(blocks):
        where, kind = f"{param}[{j}]", block["type"]
        if kind == "text":
            texts.append(_text_block(block, where))
        elif kind == "tool_result":
            if texts:
                _fail(f"{where}: tool_result blocks must come before any text in a user message", where)
            _keys(block, {"type", "tool_use_id", "content", "is_error", "cache_control"}, where)
            tid = block.get("tool_use_id")
            if not isinstance(tid, str) or tid not in waiting:
                shown = f"the previous message's tool_use ids: {', '.join(waiting)}" if waiting else \
                    "no tool_use in the previous assistant message"
                _fail(f"{where}.tool_use_id {str(tid)[:64]!r} answers no tool call ({shown})"[:400],
                      f"{where}.tool_use_id")
            if tid in answered:
                _fail(f"{where}: tool_use_id {tid[:64]!r} is answered twice", f"{where}.tool_use_id")
            answered.add(tid)
            is_error = block.get("is_error")
            if is_error is not None and not isinstance(is_error, bool):
                _fail(f"{where}.is_error must be true or false", f"{where}.is_error", "invalid_type")
            _cache_control(block.get("cache_control"), where)
            text = _result_text(block.get("content"), f"{where}.content")
            out.append({"role": "tool", "tool_call_id": tid, "content": (IS_ERROR_PREFIX if is_error else "") + text})
        else:
            _refuse_block(kind, where, "a user message")
    missing = [t for t in waiting if t not in answered]
    if missing:
        _fail(f"messages[{i - 1}] has tool_use ids without a tool_result in messages[{i}]: "
              f"{', '.join(missing)[:200]}", f"messages[{i}]")
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _result_text(content, param: str) -> str:
    """A tool_result's content: absent, a string, or text blocks (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(_blocks(content, param, allow_string=False)):
        if block["type"] != "text":
            _refuse_block(block["type"], f"{param}[{j}]", "a tool_result")
        texts.append(_text_block(block, f"{param}[{j}]"))
    return "".join(texts)


def _thinking(value, max_tokens: int | None) -> bool | None:
    """`thinking` as the template's switch: True (enabled, adaptive), False (disabled), None (absent)."""
    if value is None:
        return None
    kinds = ("enabled", "disabled", "adaptive")
    if not isinstance(value, dict) or value.get("type") not in kinds:
        _fail('\'thinking\' must be {"type": "enabled", "budget_tokens": N}, {"type": "adaptive"} or '
              '{"type": "disabled"}', "thinking")
    _keys(value, {"type", "budget_tokens"} if value["type"] == "enabled" else {"type", "display"}, "thinking")
    if value["type"] == "enabled":
        budget = value.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
            _fail("thinking.budget_tokens must be a whole number >= 1024", "thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            _fail(f"thinking.budget_tokens ({budget}) must be less than max_tokens ({max_tokens})",
                  "thinking.budget_tokens")
    if value.get("display") not in (None, "summarized", "omitted"):
        _fail("thinking.display must be 'summarized' or 'omitted'", "thinking.display")
    return value["type"] != "disabled"


def _output_config(value) -> dict | None:
    """output_config: `format` (a JSON schema the answer's text follows) as the chat endpoint's
    response_format, the same grammar; `effort` checked, and moot: one model at one speed."""
    if value is None:
        return None
    if not isinstance(value, dict):
        _fail("'output_config' must be an object ({\"format\": ..., \"effort\": ...})", "output_config",
              "invalid_type")
    _keys(value, {"format", "effort"}, "output_config")
    if value.get("effort") not in (None, *EFFORTS):
        _fail(f"output_config.effort must be one of {', '.join(EFFORTS)}", "output_config.effort")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        _fail('output_config.format must be {"type": "json_schema", "schema": {...}}', "output_config.format")
    _keys(fmt, {"type", "schema"}, "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _metadata(value) -> None:
    """Accepted and checked; Anthropic uses it to trace abuse, which one local server has no use for."""
    if value is None:
        return
    if not isinstance(value, dict):
        _fail("'metadata' must be an object ({\"user_id\": ...})", "metadata", "invalid_type")
    _keys(value, {"user_id"}, "metadata")
    if value.get("user_id") is not None and not isinstance(value["user_id"], str):
        _fail("metadata.user_id must be a string", "metadata.user_id", "invalid_type")


def _context_management(value) -> None:
    """Server-side context editing (`{"edits": [{"type": ...}, ...]}`, which Claude Code sends on
    every request): checked, and accepted with no edit made. The conversation is rendered as sent
    (earlier turns' thinking blocks are always dropped, as `clear_thinking` asks), and one past
    the context is refused rather than cut (docs/server.md)."""
    if value is None:
        return
    if not isinstance(value, dict) or set(value) - {"edits"} or not isinstance(value.get("edits", []), list) \
            or not all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in value.get("edits", [])):
        _fail("'context_management' must be {\"edits\": [{\"type\": ...}, ...]}", "context_management", "invalid_type")


def chat_body(body: dict, counting: bool = False) -> tuple[dict, bool | None]:
    """(the OpenAI chat body, the thinking switch) for an Anthropic create (or count_tokens) body."""
    if not isinstance(body, dict):
        _fail(f"the request body must be an object (got {json_type(body)})", "body", "invalid_type")
    for name in sorted(set(body) & set(REFUSED)):
        if body[name] is not None:
            _fail(f"'{name}' ({REFUSED[name]}) is not supported by specgguf: leave it out", name,
                  "unsupported_parameter")
    _keys(body, CREATE, "the request")
    max_tokens = body.get("max_tokens")
    if max_tokens is None and not counting:
        _fail("'max_tokens' is required: the most tokens the answer may have, e.g. 1024", "max_tokens",
              "missing_field")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        _fail(f"'max_tokens' must be a whole number >= 1 (got {max_tokens!r})"[:200], "max_tokens")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        _fail(f"'model' must be a string (got {json_type(model)})", "model", "invalid_type")
    _cache_control(body.get("cache_control"), "")
    _metadata(body.get("metadata"))
    _context_management(body.get("context_management"))
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        _fail("'service_tier' must be 'auto' or 'standard_only' (one tier here)", "service_tier")
    thinking = _thinking(body.get("thinking"), max_tokens)
    tools = tools_value(body.get("tools"))
    choice, parallel = tool_choice_value(body.get("tool_choice"), tools)
    names = {t["function"].get("name") for t in tools or []}
    messages = chat_messages(body.get("messages"), system_text(body.get("system")), names)
    out = {"messages": messages, "max_tokens": 0 if counting else max_tokens}
    if model is not None:
        out["model"] = model
    response_format = _output_config(body.get("output_config"))
    if response_format is not None:
        if tools and choice != "none":  # one grammar per answer: a tool call's or the text's (prepare.py)
            _fail("'output_config.format' with 'tools' needs tool_choice {\"type\": \"none\"}: the answer here is "
                  "either a tool call or text in that format", "output_config.format", "unsupported_parameter")
        out["response_format"] = response_format
    if tools:
        out["tools"] = tools
    for key, value in (("tool_choice", choice), ("parallel_tool_calls", parallel)):
        if value is not None:
            out[key] = value
    out.update(_sampling(body))  # counting: checked by prepare all the same, and change no count
    return out, thinking


def _sampling(body: dict) -> dict:
    """stream, stop_sequences, temperature (Anthropic's range, [0, 1]), top_p, top_k; the values
    themselves are checked by params.py as the chat endpoint's are."""
    out = {}
    stream = body.get("stream")
    if stream is not None:
        if not isinstance(stream, bool):
            _fail("'stream' must be true or false", "stream", "invalid_type")
        out["stream"] = stream
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            _fail("'stop_sequences' must be a list of strings", "stop_sequences", "invalid_type")
        if any(not s for s in stops):
            _fail("'stop_sequences' holds an empty string; each must have at least one character",
                  "stop_sequences")
        out["stop"] = stops
    temperature = body.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 1:
        _fail(f"'temperature' must be in [0, 1] (got {temperature!r})", "temperature")
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    return out


@dataclass
class Asked:
    """What the reply needs to know of an Anthropic request beyond its chat request."""

    stops: list[str]  # the request's own stop_sequences: the ones stop_reason "stop_sequence" names
    thinks: bool = False  # the template's thinking switch is on: a leading <think> block is reasoning
    opened: bool = False  # the prompt ends with <think> itself (thinking templates that open the block)


# params.py and tools.py speak OpenAI's names; a refusal from them is told in Anthropic's
_RENAMES = (("function.parameters", "input_schema"), ("function.name", "name"),
            ("function.description", "description"), ("'stop'", "'stop_sequences'"),
            ("response_format.json_schema.schema", "output_config.format.schema"),
            ("'tool_choice' is 'required'", "'tool_choice' is 'any'"))


def anthropic_words(exc: RequestError) -> RequestError:
    """A refusal from the shared checks with the field names an Anthropic client sent."""
    message, param = str(exc), exc.param
    for old, new in _RENAMES:
        message = message.replace(old, new)
        param = param.replace(old, new) if isinstance(param, str) else param
    if isinstance(param, str) and param.startswith("messages"):
        param = "messages"  # the translated list has other indices (system first, results split)
        message = message.replace("messages[", "the translated messages[")
    if param == "stop":
        param = "stop_sequences"
    return RequestError(message, param=param, code=exc.code, status=exc.status, kind=exc.kind)


def prepare(llm, body: dict, counting: bool = False) -> tuple:
    """(the checked, tokenized `prepare.Request`, `Asked`) for an Anthropic body; counting: a
    count_tokens body (max_tokens optional, nothing generated)."""
    from . import prepare as preparing

    chat, thinking = chat_body(body, counting)
    if thinking is not None:
        chat["reasoning_effort"] = thinking_effort(thinking)
    try:
        req = preparing.prepare(llm, chat, chat=True)
    except RequestError as exc:
        raise anthropic_words(exc) from None
    # absent thinking leaves the template's default, which is on for Qwen3-style templates
    thinks = llm.chat_format.thinks_on_request and thinking is not False
    tail = llm.detokenize(req.tokens[-16:], special=True).decode("utf-8", "replace").rstrip() if thinks else ""
    return req, Asked(list(body.get("stop_sequences") or []), thinks, tail.endswith("<think>"))


def count_tokens(llm, body: dict) -> dict:
    """POST /v1/messages/count_tokens: the prompt tokens of the same body, nothing generated."""
    req, _ = prepare(llm, body, counting=True)
    return {"input_tokens": len(req.tokens)}
