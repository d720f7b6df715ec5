"""The responses of a checked request, in the dict shapes of llama_cpp.Llama's create_completion /
create_chat_completion (which are OpenAI's), plus one extra field, `specgguf`, that carries the
speculative statistics.

An app written against `Llama` or the OpenAI client reads these unchanged; the stats ride along
in a field neither of them knows, on the full response and on the stream's usage-bearing chunk.
`full()` and `chunks()` run a request's choices (n of them, one after another) through
`SpecGGUF.stream_tokens`, with echo and the target's logprobs where asked for.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable, Iterator

from . import logprobs as lp
from .trace import Trace
from ..decoding.stats import GenerationStats


class Shaper:
    """Builds the responses of one request: one id and one creation time for all its chunks.

    include_usage: OpenAI's stream_options.include_usage: every chunk has "usage": null and a
    last chunk with no choices carries the usage (and `specgguf`); without it the usage rides
    on the last choice's finishing chunk, as specgguf has always sent it."""

    def __init__(self, model: str, chat: bool, include_usage: bool = False):
        self.model, self.chat, self.include_usage = model, chat, include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(n_prompt: int, n_completion: int, stats: dict) -> dict:
        """OpenAI's usage; prompt_tokens_details.cached_tokens: the prompt tokens the prompt
        cache already held (decoding/promptcache.py), read again by no pass. With a prediction,
        completion_tokens_details: its drafted tokens the target accepted and refused
        (docs/server.md, Predicted Outputs)."""
        out = {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion,
               "prompt_tokens_details": {"cached_tokens": stats["cached_tokens"]}}
        p = stats.get("prediction")
        if p is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": 0, "accepted_prediction_tokens": p["accepted"],
                                                "rejected_prediction_tokens": p["drafted"] - p["accepted"]}
        return out

    def choice(self, index: int, text: str, finish_reason: str, logprobs: dict | None = None,
               tool_calls: list[dict] | None = None) -> dict:
        if self.chat:
            message = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}

    def full(self, choices: list[dict], n_prompt: int, n_completion: int, stats: dict) -> dict:
        out = self._head("chat.completion" if self.chat else "text_completion")
        out["choices"] = choices
        out["usage"] = self.usage(n_prompt, n_completion, stats)
        out["specgguf"] = stats
        return out

    def first(self, index: int = 0) -> dict | None:
        """Chat streams open with a chunk that only names the role (as Llama's and OpenAI's do)."""
        if not self.chat:
            return None
        return self._chunk({"role": "assistant"}, None, index)

    def tool_calls(self, deltas: list[dict], index: int = 0) -> dict:
        """A chat chunk with tool-call deltas (tools.call_deltas)."""
        return self._chunk({"tool_calls": deltas}, None, index)

    def delta(self, text: str, index: int = 0, logprobs: dict | None = None) -> dict:
        return self._chunk({"content": text} if self.chat else text, None, index, logprobs)

    def finish(self, finish_reason: str, index: int = 0) -> dict:
        return self._chunk({} if self.chat else "", finish_reason, index)

    def last(self, finish_reason: str, n_prompt: int, n_completion: int, stats: dict, index: int = 0) -> dict:
        """The last choice's finishing chunk, with the usage and stats (no include_usage)."""
        out = self.finish(finish_reason, index)
        out["usage"] = self.usage(n_prompt, n_completion, stats)
        out["specgguf"] = stats
        return out

    def usage_chunk(self, n_prompt: int, n_completion: int, stats: dict) -> dict:
        """OpenAI's separate final chunk for stream_options.include_usage: no choices, the usage."""
        out = self._head("chat.completion.chunk" if self.chat else "text_completion")
        out["choices"] = []
        out["usage"] = self.usage(n_prompt, n_completion, stats)
        out["specgguf"] = stats
        return out

    def _chunk(self, payload, finish_reason, index: int = 0, logprobs: dict | None = None) -> dict:
        if self.chat:
            out = self._head("chat.completion.chunk")
            out["choices"] = [{"index": index, "delta": payload, "logprobs": logprobs, "finish_reason": finish_reason}]
        else:
            out = self._head("text_completion")
            out["choices"] = [{"text": payload, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}]
        if self.include_usage:
            out["usage"] = None
        return out


def openai_finish_reason(reason: str | None) -> str:
    """The engine's reasons mapped onto OpenAI's: a full context is a length limit too."""
    if reason in ("length", "context"):
        return "length"
    return "stop"


def stats_dict(all_stats: list[GenerationStats]) -> dict:
    """The `specgguf` field: one generation's stats, or the n choices' added up."""
    if len(all_stats) == 1:
        return all_stats[0].to_dict()
    # the request's prompt is read once for the first choice; the others find it cached
    m = GenerationStats(prompt_tokens=all_stats[0].prompt_tokens, cached_tokens=all_stats[0].cached_tokens)
    for s in all_stats:
        m.generated_tokens += s.generated_tokens
        for drafted, accepted in s.rounds_detail:
            m.record_round(drafted, accepted)
        m.prefill_s += s.prefill_s
        m.draft_s += s.draft_s
        m.verify_s += s.verify_s
        m.decode_s += s.decode_s
        m.draft_lengths += s.draft_lengths
        if s.prediction is not None:
            m.prediction = {k: v + s.prediction[k] for k, v in (m.prediction or dict.fromkeys(s.prediction, 0)).items()}
    return m.to_dict()


# -- running a request ----------------------------------------------------------------------

def _choice(llm, req, index: int, cancelled):
    """(generation, text pieces, logprob collector or None) of choice `index`: choice i > 0
    of a seeded request runs with seed + i (mod 2**64, the range of seeds), so that the n
    choices differ but repeat."""
    sampling = dict(req.sampling)
    if index and sampling.get("seed") is not None:
        sampling["seed"] = (sampling["seed"] + index) % (1 << 64)
    rows = None if req.logprobs is None else lp.Collector(req.logprobs)
    gen, text = llm.stream_tokens(req.tokens, req.max_tokens, req.stop, sampling, cancelled=cancelled,
                                  grammar=req.grammar, on_verified=rows, prediction=req.prediction)
    return gen, text, rows


def _shape_logprobs(llm, req, rows, offsets):
    model = llm.target.model
    return lp.chat(model, rows) if req.chat else lp.completion(model, rows, offsets)


def full(llm, req, cancelled: Callable[[], bool] = lambda: False) -> dict | None:
    """The whole response of `req` (None when cancelled before the end)."""
    shaper = Shaper(req.model or llm.model_name, req.chat)
    choices, n_completion, stats = [], 0, []
    for index in range(req.n):
        gen, text, rows = _choice(llm, req, index, cancelled)
        pieces = []
        try:
            for piece in text:
                if cancelled():
                    return None
                pieces.append(piece)
        finally:
            gen.close("cancelled")
        out = (req.prompt_text if req.echo else "") + "".join(pieces)
        logprobs = None
        if rows is not None:
            logprobs = _shape_logprobs(llm, req, rows.rows[:len(gen.tokens)], lp.Offsets(len(req.prompt_text)))
        reason, calls = openai_finish_reason(gen.finish_reason), None
        if req.tools is not None and req.tools.parses:
            out, calls = req.tools.parse(out)
            reason = "tool_calls" if calls and reason == "stop" else reason
        choices.append(shaper.choice(index, out, reason, logprobs, calls))
        n_completion += len(gen.tokens)
        stats.append(gen.stats)
    return shaper.full(choices, len(req.tokens), n_completion, stats_dict(stats))


def chunks(llm, req, cancelled: Callable[[], bool] = lambda: False) -> Iterator[dict]:
    """The stream of `req` as chunk dicts; `cancelled` is asked after every chunk: when it says
    yes the generation is closed (the engine stops at that round) and nothing more is yielded."""
    shaper = Shaper(req.model or llm.model_name, req.chat, req.include_usage)
    n_completion, stats = 0, []
    for index in range(req.n):
        gen, text, rows = _choice(llm, req, index, cancelled)
        trace = Trace(llm.target.model, gen) if req.trace else None
        try:
            first = shaper.first(index)
            if first is not None:
                yield first
            if req.echo:
                yield shaper.delta(req.prompt_text, index)
            sent, offsets = 0, lp.Offsets(len(req.prompt_text))
            called = False
            for piece in (text if req.tools is None else req.tools.stream(text)):
                if cancelled():
                    return
                if not isinstance(piece, str):  # tool-call deltas (tools.py)
                    called = True
                    yield shaper.tool_calls(piece, index)
                    continue
                logprobs = None
                if rows is not None:  # the tokens whose text this piece releases
                    logprobs = _shape_logprobs(llm, req, rows.rows[sent:len(gen.tokens)], offsets)
                    sent = len(gen.tokens)
                chunk = shaper.delta(piece, index, logprobs)
                if trace is not None:
                    chunk["specgguf_trace"] = trace.since_last()
                yield chunk
            if cancelled():
                return
        finally:
            gen.close("cancelled")
        n_completion += len(gen.tokens)
        stats.append(gen.stats)
        reason = openai_finish_reason(gen.finish_reason)
        if called and reason == "stop":
            reason = "tool_calls"
        if index == req.n - 1 and not req.include_usage:
            last = shaper.last(reason, len(req.tokens), n_completion, stats_dict(stats), index)
        else:
            last = shaper.finish(reason, index)
        if trace is not None:
            last["specgguf_trace"] = trace.since_last()
        yield last
    if req.include_usage:
        yield shaper.usage_chunk(len(req.tokens), n_completion, stats_dict(stats))
