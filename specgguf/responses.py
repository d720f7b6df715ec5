"""The dict shapes of llama_cpp.Llama's create_completion / create_chat_completion (which are
OpenAI's), plus one extra field, `specgguf`, that carries the speculative statistics.

An app written against `Llama` or the OpenAI client reads these unchanged; the stats ride along
in a field neither of them knows, on the full response and on the last stream chunk.
"""

from __future__ import annotations

import time
import uuid


class Shaper:
    """Builds the responses of one request: one id and one creation time for all its chunks."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(n_prompt: int, n_completion: int) -> dict:
        return {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                "total_tokens": n_prompt + n_completion}

    def full(self, text: str, finish_reason: str, n_prompt: int, n_completion: int, stats: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
            out = self._head("chat.completion")
        else:
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
            out = self._head("text_completion")
        out["choices"] = [choice]
        out["usage"] = self.usage(n_prompt, n_completion)
        out["specgguf"] = stats
        return out

    def first(self) -> dict | None:
        """Chat streams open with a chunk that only names the role (as Llama's and OpenAI's do)."""
        if not self.chat:
            return None
        return self._chunk({"role": "assistant"}, None)

    def delta(self, text: str) -> dict:
        return self._chunk({"content": text} if self.chat else text, None)

    def last(self, finish_reason: str, n_prompt: int, n_completion: int, stats: dict) -> dict:
        out = self._chunk({} if self.chat else "", finish_reason)
        out["usage"] = self.usage(n_prompt, n_completion)
        out["specgguf"] = stats
        return out

    def _chunk(self, payload, finish_reason) -> dict:
        if self.chat:
            out = self._head("chat.completion.chunk")
            out["choices"] = [{"index": 0, "delta": payload, "logprobs": None, "finish_reason": finish_reason}]
        else:
            out = self._head("text_completion")
            out["choices"] = [{"text": payload, "index": 0, "logprobs": None, "finish_reason": finish_reason}]
        return out


def openai_finish_reason(reason: str | None) -> str:
    """The engine's reasons mapped onto OpenAI's: a full context is a length limit too."""
    if reason in ("length", "context"):
        return "length"
    return "stop"
