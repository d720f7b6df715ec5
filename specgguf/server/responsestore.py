"""The responses `/v1/responses` keeps (store: true), for `previous_response_id` and `GET /v1/responses/{id}`.

In memory and bounded twice (docs/server.md, The Responses API): at most MAX_RESPONSES
responses and MAX_BYTES of their JSON; past either bound the least recently used go first. A
response is kept with its conversation as input items (its input, history included, then its
output), which is what a later request's `previous_response_id` puts before its own input.
No HTTP here.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

MAX_RESPONSES = 1000  # responses kept at once
MAX_BYTES = 64 * 1024 * 1024  # JSON bytes of the kept responses and their conversations together


def output_items(response: dict) -> list[dict]:
    """A response's output as input items (the shape responses.input_items keeps)."""
    items = []
    for it in response.get("output", []):
        if it["type"] == "message":
            text = "".join(p.get("text", "") for p in it["content"] if p.get("type") == "output_text")
            items.append({"type": "message", "role": "assistant", "content": text})
        elif it["type"] == "function_call":
            items.append({"type": "function_call", "call_id": it["call_id"], "name": it["name"],
                          "arguments": it["arguments"]})
    return items


class ResponseStore:
    """An LRU of responses by id; safe to share between threads."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._entries: OrderedDict[str, tuple[dict, list[dict], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict, items: list[dict]) -> bool:
        """Keep `response` and its conversation (`items`: its input items, then its output's);
        False when it alone is over the byte bound (then it is not kept)."""
        conversation = [*items, *output_items(response)]
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if size > self.max_bytes:
            return False
        with self._lock:
            self._drop(response["id"])
            self._entries[response["id"]] = (response, conversation, size)
            self._bytes += size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, response_id: str) -> tuple[dict, list[dict]] | None:
        """(response, conversation) of a kept response, or None (never kept, evicted or deleted)."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None:
                return None
            self._entries.move_to_end(response_id)
            return entry[0], entry[1]

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[2]
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)
