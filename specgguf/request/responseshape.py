"""Chat responses and chunks (completions.py) reshaped as OpenAI Responses objects and stream events.

`response(turn, chat)` makes a Response object of a whole chat.completion; `Events` turns a
chat stream's chunks into the Responses stream (`response.created` ... `response.completed`)
as it goes. The speculative stats ride along in the `specgguf` field, as on the chat endpoint.
docs/server.md, "The Responses API", shows the shapes.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable, Iterable, Iterator

from .responses import Turn


def _id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def usage(chat_usage: dict | None) -> dict | None:
    """A chat usage as a Responses usage (cached_tokens: the prompt cache's, decoding/promptcache.py)."""
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id or _id("msg_"), "role": "assistant", "status": status,
            "content": content}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed", item_id: str | None = None):
    return {"type": "function_call", "id": item_id or _id("fc_"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class Shaper:
    """The Response objects of one turn: one id and creation time for all of them."""

    def __init__(self, turn: Turn, model: str):
        self.turn, self.model = turn, model
        self.id, self.created_at = _id("resp_"), int(time.time())

    def response(self, status: str, output: list[dict], chat_usage: dict | None = None, stats: dict | None = None,
                 error: dict | None = None) -> dict:
        out = {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
               "error": error, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
               else None, "model": self.model, "output": output, "usage": usage(chat_usage), **self.turn.echo}
        if stats is not None:
            out["specgguf"] = stats
        return out


def status_of(finish_reason: str | None) -> str:
    """A chat finish_reason as a Response status: a length limit (max_output_tokens, or a full
    context) leaves the response incomplete."""
    return "incomplete" if finish_reason == "length" else "completed"


def response(turn: Turn, model: str, chat: dict) -> dict:
    """The Response object of a whole chat.completion (completions.full)."""
    shaper = Shaper(turn, model)
    choice = chat["choices"][0]
    status = status_of(choice["finish_reason"])
    content, calls = choice["message"].get("content"), choice["message"].get("tool_calls") or []
    output = []
    if content or not calls:
        output.append(message_item(content or "", status))
    output += [call_item(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    return shaper.response(status, output, chat.get("usage"), chat.get("specgguf"))


class Events:
    """The Responses stream of one turn, fed the chat stream's chunks (one choice, usage on the last).

    Each event is (type, dict); `sequence_number` counts them from 0. `opening()` comes first
    (the server sends it before the job starts), then `feed(chunk)` for every chunk; the last
    chunk (its finish_reason) closes what is open and ends with response.completed (or
    .incomplete); `failed(message)` ends a stream that broke."""

    def __init__(self, turn: Turn, model: str):
        self.shaper = Shaper(turn, model)
        self.seq = 0
        self.output: list[dict] = []  # finished items
        self.text: str | None = None  # the open message's text, None when no message is open
        self.call: dict | None = None  # the open function call
        self.final: dict | None = None  # the last Response object, once the stream ended

    def _event(self, kind: str, **fields) -> tuple[str, dict]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, event

    def opening(self) -> list[tuple[str, dict]]:
        head = self.shaper.response("in_progress", [])
        return [self._event("response.created", response=head), self._event("response.in_progress", response=head)]

    def feed(self, chunk: dict) -> list[tuple[str, dict]]:
        out = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            for d in delta.get("tool_calls") or []:
                out += self._call_delta(d)
            if choice.get("finish_reason") is not None:
                status = status_of(choice["finish_reason"])
                out += self._close(status)
                if not self.output:  # nothing was said: an empty message, as the whole response has
                    out += self._text("") + self._close(status)
                self.final = self.shaper.response(status, self.output, chunk.get("usage"), chunk.get("specgguf"))
                out.append(self._event("response." + status, response=self.final))
        return out

    def failed(self, message: str) -> tuple[str, dict]:
        self.final = self.shaper.response("failed", self.output, error={"code": "server_error", "message": message})
        return self._event("response.failed", response=self.final)

    # -- items ----------------------------------------------------------------------------------
    def _where(self) -> dict:
        return {"output_index": len(self.output), "item_id": self._open_id}

    def _text(self, piece: str) -> list[tuple[str, dict]]:
        out = []
        if self.text is None:
            out += self._close("completed")
            self._open_id, self.text = _id("msg_"), ""
            item = message_item(None, "in_progress", self._open_id)
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
            out.append(self._event("response.content_part.added", **self._where(), content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        if piece:
            self.text += piece
            out.append(self._event("response.output_text.delta", **self._where(), content_index=0, delta=piece,
                                   logprobs=[]))
        return out

    def _call_delta(self, d: dict) -> list[tuple[str, dict]]:
        out = []
        if d.get("id"):  # a new call: tools.call_deltas sends id and name first
            out += self._close("completed")
            self._open_id = _id("fc_")
            self.call = call_item(d["id"], d["function"]["name"], "", "in_progress", self._open_id)
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=dict(self.call)))
        args = (d.get("function") or {}).get("arguments")
        if args and self.call is not None:
            self.call["arguments"] += args
            out.append(self._event("response.function_call_arguments.delta", **self._where(), delta=args))
        return out

    def _close(self, status: str) -> list[tuple[str, dict]]:
        """Finish the open item (a message's text part, or a call's arguments)."""
        out = []
        if self.text is not None:
            item = message_item(self.text, status, self._open_id)
            part = item["content"][0]
            out.append(self._event("response.output_text.done", **self._where(), content_index=0, text=self.text,
                                   logprobs=[]))
            out.append(self._event("response.content_part.done", **self._where(), content_index=0, part=part))
            out.append(self._event("response.output_item.done", output_index=len(self.output), item=item))
            self.output.append(item)
            self.text = None
        elif self.call is not None:
            item = {**self.call, "status": "completed"}
            out.append(self._event("response.function_call_arguments.done", **self._where(),
                                   name=item["name"], arguments=item["arguments"]))
            out.append(self._event("response.output_item.done", output_index=len(self.output), item=item))
            self.output.append(item)
            self.call = None
        return out


def events(turn: Turn, model: str, chunks: Iterable[dict], cancelled: Callable[[], bool] = lambda: False,
           stream: Events | None = None) -> Iterator[tuple[str, dict]]:
    """The whole Responses stream of `chunks` (the opening events too, unless `stream` was
    opened by the caller already)."""
    if stream is None:
        stream = Events(turn, model)
        yield from stream.opening()
    for chunk in chunks:
        if cancelled():
            return
        yield from stream.feed(chunk)


def create(llm, body: dict, history: list[dict] | None = None, cancelled: Callable[[], bool] = lambda: False):
    """The Python API's face of /v1/responses: a Response object, or with "stream": true an
    iterator of (event type, event) pairs. history: what previous_response_id names (the caller's store)."""
    from .completions import chunks, full
    from .responses import prepare

    turn = prepare(llm, body, history)
    model = turn.req.model or llm.model_name
    if turn.stream:
        return events(turn, model, chunks(llm, turn.req, cancelled), cancelled)
    chat = full(llm, turn.req, cancelled)
    return None if chat is None else response(turn, model, chat)
