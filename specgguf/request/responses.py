"""OpenAI's Responses API (`POST /v1/responses`) as the checked chat request the server already runs.

A Responses body is translated, field by field, into the OpenAI chat body `prepare` takes
(`input` items -> `messages`, flat function `tools` -> chat `tools`, `text.format` ->
`response_format`, `max_output_tokens` -> `max_tokens`), so every drafter, the prompt cache,
parallel slots, grammars and the stats work unchanged; `responseshape.py` turns the chat
response (or its chunks) back into a Response object (or its events). docs/server.md, "The
Responses API", lists what is supported, what is refused and what is accepted with no effect.

`previous_response_id` is the caller's: it looks the id up in its store and hands the stored
conversation (input items, then output items) to `prepare` as `history`; nothing here keeps state.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..errors import RequestError
from . import params
from .chat import EFFORTS
from .prepare import Request, prepare as prepare_chat

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")
ITEM_TYPES = ("message", "function_call", "function_call_output")
MAX_METADATA = 16  # OpenAI's bounds on metadata: 16 pairs, keys of 64 characters, values of 512
INCLUDABLE = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
              "message.input_image.image_url", "computer_call_output.output.image_url",
              "code_interpreter_call.outputs", "reasoning.encrypted_content")  # none of these items exist here
SUMMARIES = ("auto", "concise", "detailed")

HANDLED = {"input", "instructions", "model", "tools", "tool_choice", "text", "max_output_tokens", "temperature",
           "top_p", "stream", "parallel_tool_calls", "metadata", "truncation", "reasoning", "include", "store",
           "previous_response_id"}
# accepted with no effect (docs/server.md says why): who the end user is, and OpenAI's billing and cache routing
NO_EFFECT = {"user": None, "safety_identifier": None, "prompt_cache_key": None,
             "service_tier": ("auto", "default"), "prompt_cache_retention": ("in_memory", "24h")}
# features this server does not have: only their "off" value (or null) passes
OFF = {"background": False, "conversation": None, "prompt": None, "max_tool_calls": None, "top_logprobs": 0,
       "stream_options": None, "context_management": None, "prompt_cache_options": None}


@dataclass
class Turn:
    """One checked Responses request: the chat request it became, and what its response echoes."""

    req: Request
    items: list[dict]  # the conversation so far, as input items (history, then this input): what a store keeps
    echo: dict = field(default_factory=dict)  # the request fields the Response object repeats
    store: bool = True
    stream: bool = False


def _err(message: str, param: str | None, code: str = "invalid_value") -> RequestError:
    return RequestError(message[:400], param=param, code=code)


def previous_id(body: dict) -> str | None:
    """`previous_response_id`: None or a non-empty string (the caller looks it up)."""
    value = body.get("previous_response_id")
    if value is not None and (not isinstance(value, str) or not value):
        raise _err(f"'previous_response_id' must be a response id string (got {params.json_type(value)})",
                   "previous_response_id", "invalid_type")
    return value


def prepare(llm, body: dict, history: list[dict] | None = None) -> Turn:
    """Check a Responses body, translate it into a chat body and prepare that (tokens, grammar, tools).

    history: the stored conversation `previous_response_id` names (its caller found it), or None."""
    _check_fields(body)
    if body.get("previous_response_id") is not None and history is None:
        raise _err("'previous_response_id' needs a store of responses (`specgguf serve` keeps one); send the "
                   "whole conversation in 'input' instead", "previous_response_id", "unsupported_parameter")
    if "input" not in body or body["input"] is None:
        raise _err("'input' is required: a string or a list of items", "input", "missing_field")
    items = [*(history or []), *input_items(body["input"])]
    _check_call_ids(items, len(history or []))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _err(f"'instructions' must be a string (got {params.json_type(instructions)})", "instructions",
                   "invalid_type")
    stream, store = params.flag(body, "stream"), params.flag(body, "store", True)
    chat = {"messages": messages(items, instructions), "stream": stream}
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(name) is not None:
            chat[name] = body[name]
    tools = function_tools(body.get("tools"))
    if tools:
        chat["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                           if t.get(k) is not None}} for t in tools]
    choice = tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    fmt = text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _err(f"'max_output_tokens' must be a whole number >= 1 (got {limit!r})"[:200], "max_output_tokens",
                       "invalid_type" if not isinstance(limit, int) or isinstance(limit, bool) else "invalid_value")
        chat["max_tokens"] = limit
    try:
        effort = _reasoning(body.get("reasoning"))["effort"]
        if effort is not None:
            chat["reasoning_effort"] = effort  # the template's thinking switch (chat.effort_thinks)
        req = prepare_chat(llm, chat, chat=True)
    except RequestError as exc:
        raise _renamed(exc) from None
    echo = {"instructions": instructions, "tools": tools, "tool_choice": body.get("tool_choice") or "auto",
            "temperature": _given(body, "temperature", 0.0), "top_p": _given(body, "top_p", 1.0),  # greedy default
            "text": {"format": body["text"]["format"]} if (body.get("text") or {}).get("format") else
            {"format": {"type": "text"}}, "max_output_tokens": limit,
            "previous_response_id": body.get("previous_response_id"),
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False, "store": store,
            "metadata": _metadata(body.get("metadata")), "truncation": "disabled",
            "reasoning": _reasoning(body.get("reasoning")), "user": body.get("user"), "background": False,
            "service_tier": body.get("service_tier") or "default", "top_logprobs": 0, "max_tool_calls": None}
    return Turn(req, items, echo, store, stream)


def _given(body: dict, name: str, default):
    return default if body.get(name) is None else body[name]


def _check_fields(body: dict) -> None:
    """Every top-level field is known: handled, accepted with no effect, or off."""
    for name, value in body.items():
        if name in HANDLED:
            continue
        if name in NO_EFFECT:
            allowed = NO_EFFECT[name]
            if value is not None and (not isinstance(value, str) or (allowed and value not in allowed)):
                want = " or ".join(repr(a) for a in allowed) if allowed else "a string"
                raise _err(f"'{name}' must be {want} (got {value!r})"[:200], name)
            continue
        if name in OFF:
            if value is not None and not (value == OFF[name] and type(value) is type(OFF[name])):
                raise _err(f"'{name}' is not supported by specgguf's /v1/responses: leave it out", name,
                           "unsupported_parameter")
            continue
        raise _err(f"unknown field '{name[:60]}': /v1/responses takes {', '.join(sorted(HANDLED))} "
                   "(docs/server.md, The Responses API)", name[:60], "unknown_parameter")
    if body.get("truncation") not in (None, "disabled"):
        raise _err("'truncation' must be 'disabled': an input past the context is refused, never cut "
                   "(send a shorter conversation)", "truncation", "unsupported_parameter")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
            raise _err("'include' must be a list of strings", "include", "invalid_type")
        for x in include:
            if x not in INCLUDABLE:
                raise _err(f"'include' value {x[:60]!r} is not supported (logprobs are on /v1/chat/completions; "
                           f"accepted: {', '.join(INCLUDABLE)})", "include", "unsupported_parameter")
    _metadata(body.get("metadata"))
    _reasoning(body.get("reasoning"))


def _metadata(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise _err(f"'metadata' must be an object of at most {MAX_METADATA} string pairs", "metadata",
                   "invalid_type" if not isinstance(value, dict) else "invalid_value")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str) or len(k) > 64 or len(v) > 512:
            raise _err(f"'metadata' entry {str(k)[:64]!r}: keys are strings of at most 64 characters and values "
                       "strings of at most 512", "metadata")
    return value


def _reasoning(value) -> dict:
    """{effort, summary}, checked and echoed; the effort turns a template's thinking switch
    (chat.effort_thinks: none/minimal off, the others on); `summary` has no effect."""
    if value is None:
        return {"effort": None, "summary": None}
    if not isinstance(value, dict) or set(value) - {"effort", "summary", "generate_summary"}:
        raise _err("'reasoning' must be an object with 'effort' (and 'summary')", "reasoning", "invalid_type")
    effort, summary = value.get("effort"), value.get("summary", value.get("generate_summary"))
    if effort is not None and effort not in EFFORTS:
        raise _err(f"'reasoning.effort' must be one of {', '.join(EFFORTS)} (got {effort!r})"[:200], "reasoning.effort")
    if summary is not None and summary not in SUMMARIES:
        raise _err(f"'reasoning.summary' must be one of {', '.join(SUMMARIES)} (got {summary!r})"[:200],
                   "reasoning.summary")
    return {"effort": effort, "summary": summary}


# -- input items ------------------------------------------------------------------------------

def input_items(value) -> list[dict]:
    """`input`: a string (one user message) or a non-empty list of items, each checked and
    normalized to the input items a store keeps (message text flattened)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": params.text_value(value, "input")}]
    if not isinstance(value, list) or not value:
        raise _err(f"'input' must be a string or a non-empty list of items (got {params.json_type(value)})", "input",
                   "invalid_type")
    return [_item(x, f"input[{i}]") for i, x in enumerate(value)]


def _item(x, where: str) -> dict:
    if not isinstance(x, dict):
        raise _err(f"{where} must be an object (a message, function_call or function_call_output item)", where,
                   "invalid_type")
    kind = x.get("type", "message" if "role" in x else None)
    if kind == "message":
        role = x.get("role")
        if role not in ROLES:
            raise _err(f"{where}.role {str(role)[:40]!r} is not one of {', '.join(ROLES)}", f"{where}.role")
        return {"type": "message", "role": role, "content": _text(x.get("content"), f"{where}.content")}
    if kind == "function_call":
        call = {"type": "function_call"}
        for key in ("call_id", "name", "arguments"):
            if not isinstance(x.get(key), str) or (key != "arguments" and not x[key]):
                raise _err(f"{where}.{key} must be a non-empty string", f"{where}.{key}", "invalid_type")
            call[key] = x[key]
        try:
            args = json.loads(call["arguments"] or "{}")
        except (ValueError, RecursionError):
            args = None
        if not isinstance(args, dict):
            raise _err(f"{where}.arguments must be a JSON object as text", f"{where}.arguments")
        return call
    if kind == "function_call_output":
        if not isinstance(x.get("call_id"), str) or not x["call_id"]:
            raise _err(f"{where}.call_id must be a non-empty string", f"{where}.call_id", "invalid_type")
        return {"type": "function_call_output", "call_id": x["call_id"],
                "output": _text(x.get("output"), f"{where}.output")}
    if kind is None:
        raise _err(f"{where} needs a 'type' ({', '.join(ITEM_TYPES)}) or a 'role'", where, "missing_field")
    raise _err(f"{where}.type {str(kind)[:40]!r} is not supported: send {', '.join(ITEM_TYPES)} items (no "
               "built-in tools, reasoning items or item references here)", f"{where}.type")


def _text(content, where: str) -> str:
    """A string, or text parts (input_text / output_text) joined; images and files are refused."""
    if isinstance(content, str):
        return params.text_value(content, where)
    if not isinstance(content, list):
        raise _err(f"{where} must be a string or a list of input_text parts (got {params.json_type(content)})", where,
                   "invalid_type")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise _err(f"{where}[{j}] is an {kind} part: this server runs a text model; send input_text parts",
                       f"{where}[{j}]", "unsupported_content")
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise _err(f"{where}[{j}] must be an input_text or output_text part with a string 'text'",
                       f"{where}[{j}]", "invalid_type")
        out.append(params.text_value(part["text"], f"{where}[{j}].text"))
    return "".join(out)


def _check_call_ids(items: list[dict], first: int) -> None:
    """A function_call_output answers a function_call that came before it (OpenAI refuses one that does not)."""
    seen = set()
    for i, it in enumerate(items):
        if it["type"] == "function_call":
            seen.add(it["call_id"])
        elif it["type"] == "function_call_output" and it["call_id"] not in seen:
            where = f"input[{i - first}]"
            raise _err(f"{where}: no function_call with call_id {it['call_id'][:60]!r} comes before this "
                       "function_call_output; send that call (or the previous_response_id that made it) first",
                       f"{where}.call_id")


def messages(items: list[dict], instructions: str | None) -> list[dict]:
    """Chat messages: instructions as the system message, function_call items as the assistant's
    tool_calls (joined to the assistant message before them), outputs as tool messages."""
    out = [{"role": "system", "content": instructions}] if instructions else []
    names = {}
    for it in items:
        if it["type"] == "message":
            out.append({"role": it["role"], "content": it["content"]})
        elif it["type"] == "function_call":
            names[it["call_id"]] = it["name"]
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"] or "{}"}}
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": None})
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "tool", "tool_call_id": it["call_id"], "name": names[it["call_id"]],
                        "content": it["output"]})
    return out


# -- tools and formats ------------------------------------------------------------------------

def function_tools(value) -> list[dict]:
    """Responses' flat function tools, checked for their shape (the ToolSet checks the rest)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _err("'tools' must be a list of {\"type\": \"function\", \"name\": ...} objects", "tools",
                   "invalid_type")
    out = []
    for i, t in enumerate(value):
        if not isinstance(t, dict):
            raise _err(f"tools[{i}] must be an object", f"tools[{i}]", "invalid_type")
        if t.get("type") != "function":
            raise _err(f"tools[{i}].type {str(t.get('type'))[:40]!r} is not supported: only function tools run "
                       "here (no built-in tools such as web_search)", f"tools[{i}].type", "unsupported_tool")
        strict = t.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise _err(f"tools[{i}].strict must be true or false", f"tools[{i}].strict", "invalid_type")
        unknown = sorted(set(t) - {"type", "name", "description", "parameters", "strict"})
        if unknown:
            raise _err(f"tools[{i}] has unknown fields: {', '.join(unknown)[:100]}", f"tools[{i}]")
        out.append({"type": "function", "name": t.get("name"), "description": t.get("description"),
                    "parameters": t.get("parameters"), "strict": strict})
    return out


def tool_choice(value):
    """Responses' tool_choice as the chat one ({"type": "function", "name"} -> {"function": {"name"}})."""
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and set(value) <= {"type", "name"}:
        if not isinstance(value.get("name"), str):
            raise _err("'tool_choice.name' must be a function's name", "tool_choice", "invalid_type")
        return {"type": "function", "function": {"name": value["name"]}}
    raise _err("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...} "
               "(no built-in tools here)", "tool_choice")


def text_format(value):
    """`text` ({"format": ...}) as the chat response_format."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"format", "verbosity"}:
        raise _err("'text' must be an object with a 'format'", "text", "invalid_type")
    if value.get("verbosity") is not None:
        raise _err("'text.verbosity' is not supported: this model has no verbosity setting; leave it out",
                   "text.verbosity", "unsupported_parameter")
    fmt = value.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text" and set(fmt) == {"type"}:
        return None
    if kind == "json_object" and set(fmt) == {"type"}:
        return {"type": "json_object"}
    if kind == "json_schema" and set(fmt) <= {"type", "name", "schema", "strict", "description"}:
        if not isinstance(fmt.get("schema"), dict):
            raise _err("'text.format.schema' must be a JSON schema object", "text.format.schema", "invalid_type")
        if fmt.get("name") is not None and not isinstance(fmt["name"], str):
            raise _err("'text.format.name' must be a string", "text.format.name", "invalid_type")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "output", "schema": fmt["schema"]}}
    raise _err("'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
               "\"json_schema\", \"name\": ..., \"schema\": {...}, \"strict\": ...}", "text.format")


# The chat request's names for what the Responses body calls otherwise, for the errors prepare raises.
_RENAMES = [(re.compile(r"^messages(\[\d+\])?.*"), "input"),
            (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
            (re.compile(r"^max_tokens$"), "max_output_tokens"),
            (re.compile(r"^tools\[(\d+)\]\.function"), r"tools[\1]")]


def _renamed(exc: RequestError) -> RequestError:
    param = exc.param
    if param:
        for pattern, name in _RENAMES:
            param = pattern.sub(name, param)
    message = str(exc).replace("'max_tokens'", "'max_output_tokens'").replace("lower max_tokens",
                                                                            "lower max_output_tokens")
    message = message.replace("'messages'", "'input'").replace("'response_format.json_schema.schema",
                                                               "'text.format.schema")
    message = message.replace("'response_format", "'text.format")
    message = re.sub(r"tools\[(\d+)\]\.function\.", r"tools[\1].", message)
    return RequestError(message, param=param, code=exc.code, status=exc.status, kind=exc.kind)
