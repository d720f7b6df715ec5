"""What a Messages API request (messages.py) gets back: Anthropic's message, its stream of
events, its errors (docs/server.md, "The Anthropic Messages API").

The generation is the chat endpoint's own: `completions.full` and `completions.chunks` run the
translated request, and their OpenAI dicts are reshaped here: text and tool calls (already
parsed by tools.py) into `text` and `tool_use` blocks, finish reasons into stop reasons, usage
into Anthropic's, and the speculative stats kept in `specgguf`, as the chat endpoint keeps them.
"""

from __future__ import annotations

import json
import uuid
from typing import Callable, Iterator

from . import completions

# status -> Anthropic's error type (docs/server.md, "The Anthropic Messages API": errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


class _Observed:
    """The SpecGGUF with one addition: it remembers the generation it last started and its text
    stream, so that a stop can be told apart: a stop sequence's text, or the end of the turn."""

    def __init__(self, llm):
        self._llm, self.generation, self.text = llm, None, None

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def stream_tokens(self, *args, **kwargs):
        self.generation, self.text = self._llm.stream_tokens(*args, **kwargs)
        return self.generation, self.text


def _stop(seen: _Observed, finish_reason: str, called: bool, stops: list[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished generation."""
    if finish_reason in ("length", "context"):
        return "max_tokens", None
    if called:
        return "tool_use", None
    gen, text = seen.generation, seen.text
    if stops and gen is not None and gen.finish_reason == "stop":
        # the text stream releases the text before a stop string; what the tokens hold past it
        # begins with the stop string that ended the generation (decoding/textstream.py)
        model = text.model
        whole = b"".join(model.token_to_piece(t) for t in gen.tokens).decode("utf-8", "replace")
        rest = whole[len(text.text):]
        found = next((s for s in stops if rest.startswith(s)), None)
        if found is not None:
            return "stop_sequence", found
    return "end_turn", None


def usage(openai_usage: dict) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens read now, cache_read_input_tokens
    those the prompt cache already held (their sum is the prompt, count_tokens' number)."""
    cached = (openai_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": openai_usage["prompt_tokens"] - cached, "output_tokens": openai_usage["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def tool_use_block(call: dict) -> dict:
    return {"type": "tool_use", "id": _tool_id(call["id"]), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def _tool_id(openai_id: str) -> str:
    return "toolu_" + openai_id.removeprefix("call_")


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class Thinking:
    """Splits the reasoning a thinking template's model writes first, `<think>...</think>`, off
    its answer: text pieces in, ("thinking" | "text", piece) out, whatever the pieces' sizes
    (the whitespace after `</think>` is the template's separator and dropped)."""

    def __init__(self, opened: bool = False):  # opened: the prompt ended with <think> already
        self.state, self.held = ("thinking" if opened else "start"), ""

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.held += piece
        out = []
        if self.state == "start":
            lead = self.held.lstrip()
            if lead.startswith(THINK_OPEN):
                self.state, self.held = "thinking", lead[len(THINK_OPEN):]
            elif THINK_OPEN.startswith(lead):  # could still become the opening tag
                return out
            else:
                self.state = "text"
        if self.state == "thinking":
            end = self.held.find(THINK_CLOSE)
            if end < 0:
                keep = next((n for n in range(min(len(THINK_CLOSE) - 1, len(self.held)), 0, -1)
                             if THINK_CLOSE.startswith(self.held[-n:])), 0)
                out.append(("thinking", self.held[:len(self.held) - keep]))
                self.held = self.held[len(self.held) - keep:]
                return [o for o in out if o[1]]
            out.append(("thinking", self.held[:end]))
            self.state, self.held = "after", self.held[end + len(THINK_CLOSE):]
        if self.state == "after":
            self.held = self.held.lstrip()
            if not self.held:
                return [o for o in out if o[1]]
            self.state = "text"
        out.append(("text", self.held))
        self.held = ""
        return [o for o in out if o[1]]

    def finish(self) -> list[tuple[str, str]]:
        """What is held at the end: an unclosed reasoning (cut by max_tokens) stays reasoning."""
        kind = "thinking" if self.state == "thinking" else "text"
        out, self.held = ([(kind, self.held)] if self.held and self.state != "after" else []), ""
        return out


def split_thinking(text: str | None, opened: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole text."""
    splitter, parts = Thinking(opened), {"thinking": "", "text": ""}
    for kind, piece in [*splitter.feed(text or ""), *splitter.finish()]:
        parts[kind] += piece
    return parts["thinking"], parts["text"]


def message(llm, req, asked, cancelled: Callable[[], bool] = lambda: False) -> dict | None:
    """The whole Anthropic message for a prepared request (`messages.Asked`; None when cancelled)."""
    seen = _Observed(llm)
    out = completions.full(seen, req, cancelled)
    if out is None:
        return None
    choice = out["choices"][0]
    text, calls = choice["message"]["content"], choice["message"].get("tool_calls") or []
    thought, text = split_thinking(text, asked.opened) if asked.thinks else ("", text)
    content = ([{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []) + \
        ([{"type": "text", "text": text}] if text else []) + [tool_use_block(c) for c in calls]
    reason, sequence = _stop(seen, choice["finish_reason"], bool(calls), asked.stops)
    return {"id": message_id(), "type": "message", "role": "assistant", "model": out["model"], "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(out["usage"]),
            "specgguf": out["specgguf"]}


def start_event(req, msg_id: str, model: str) -> dict:
    """message_start: sent before the prompt is read, so the whole prompt counts as input here;
    the final message_delta carries the split into read and cached tokens (its usage overrides)."""
    return {"type": "message_start", "message": {
        "id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": len(req.tokens), "output_tokens": 0, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 0}}}


PING = {"type": "ping"}


class _Blocks:
    """The content blocks of a stream: which one is open, and the events that open and close them."""

    def __init__(self):
        self.index, self.kind = -1, None

    def open(self, block: dict) -> list[dict]:
        out = self.close()
        self.index, self.kind = self.index + 1, block["type"]
        return out + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def text(self, text: str, kind: str = "text") -> list[dict]:
        """A text_delta (or, kind "thinking", a thinking_delta), in a block of that kind."""
        out = [] if self.kind == kind else self.open({"type": kind, kind: "", **({"signature": ""} if
                                                                                  kind == "thinking" else {})})
        delta = {"type": f"{kind}_delta", kind: text}
        return out + [{"type": "content_block_delta", "index": self.index, "delta": delta}]

    def close(self) -> list[dict]:
        if self.kind is None:
            return []
        out = []
        if self.kind == "thinking":  # Anthropic's thinking blocks end with their signature (none here)
            out.append({"type": "content_block_delta", "index": self.index,
                        "delta": {"type": "signature_delta", "signature": ""}})
        self.kind = None
        return out + [{"type": "content_block_stop", "index": self.index}]


def events(llm, req, asked, cancelled: Callable[[], bool] = lambda: False) -> Iterator[dict]:
    """The stream's events after message_start: content blocks as the chat chunks come, then
    message_delta (stop reason, usage, `specgguf`) and message_stop; nothing more once cancelled.
    Whitespace at the end of a text is held until more text follows, so text that only led up to
    a tool call is not sent (the whole message drops it the same way, tools.py `parse`)."""
    seen, blocks = _Observed(llm), _Blocks()
    thinking = Thinking(asked.opened) if asked.thinks else None
    held, called, last = "", False, None
    for chunk in completions.chunks(seen, req, cancelled):
        if not chunk["choices"]:
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        for kind, piece in (thinking.feed(delta.get("content") or "") if thinking else
                            [("text", delta.get("content"))]):
            if kind == "thinking":
                yield from blocks.text(piece, "thinking")
            elif piece:
                text = held + piece
                held = text[len(text.rstrip()):]
                if len(text) > len(held):
                    yield from blocks.text(text[:len(text) - len(held)])
        for d in delta.get("tool_calls") or []:
            if "id" in d:  # a call's head (tools.call_deltas): a new tool_use block
                held, called = "", True
                yield from blocks.open({"type": "tool_use", "id": _tool_id(d["id"]), "name": d["function"]["name"],
                                        "input": {}})
            elif d.get("function", {}).get("arguments"):
                yield {"type": "content_block_delta", "index": blocks.index,
                       "delta": {"type": "input_json_delta", "partial_json": d["function"]["arguments"]}}
        if choice["finish_reason"] is not None:
            last = chunk
    if last is None:  # cancelled
        return
    for kind, piece in thinking.finish() if thinking else []:
        if kind == "thinking":
            yield from blocks.text(piece, "thinking")
        else:
            held += piece
    if held:
        yield from blocks.text(held)
    yield from blocks.close()
    reason, sequence = _stop(seen, last["choices"][0]["finish_reason"], called, asked.stops)
    yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
           "usage": usage(last["usage"]), "specgguf": last["specgguf"]}
    yield {"type": "message_stop"}


def create(llm, body: dict):
    """The Python API's Messages call (SpecGGUF.create_message): the message dict, or with
    "stream": true an iterator of the event dicts (message_start first; no pings, which only
    keep an HTTP connection open)."""
    from . import messages

    req, asked = messages.prepare(llm, body)
    if not req.stream:
        return message(llm, req, asked)

    def stream():
        yield start_event(req, message_id(), req.model or llm.model_name)
        yield from events(llm, req, asked)
    return stream()
