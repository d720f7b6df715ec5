"""specgguf's own stream extension: what a chat page needs to show speculation as it happens.

A request asks for it with `"specgguf": {"trace": true}` (streaming only). Every content chunk
of its stream then carries `specgguf_trace`: the tokens committed since the last chunk, each
with its text and where it came from (1: a draft token the target accepted, 0: the target's own
token, the one every round ends with), the rounds finished since then as [drafted, accepted],
and the running counts. A stream that does not ask is byte for byte what it was: OpenAI
clients never see the field.
"""

from __future__ import annotations

import codecs

from ..errors import RequestError


def trace_option(body: dict, stream: bool) -> bool:
    """Whether the request asks for the trace (`"specgguf": {"trace": true}`), checked."""
    ext = body.get("specgguf")
    if ext is None:
        return False
    if not isinstance(ext, dict):
        raise RequestError("'specgguf' must be an object, e.g. {\"trace\": true}", param="specgguf",
                           code="invalid_type")
    unknown = sorted(set(ext) - {"trace"})
    if unknown:
        raise RequestError(f"'specgguf' has unknown fields: {', '.join(unknown)} (it takes 'trace')",
                           param="specgguf", code="invalid_value")
    trace = ext.get("trace", False)
    if not isinstance(trace, bool):
        raise RequestError("'specgguf.trace' must be true or false", param="specgguf", code="invalid_type")
    if trace and not stream:
        raise RequestError("'specgguf.trace' needs 'stream': true (the trace rides on the stream's chunks)",
                           param="specgguf", code="invalid_value")
    return trace


class Trace:
    """The trace of one generation: call `since_last()` whenever a chunk is sent."""

    def __init__(self, model, generation):
        self.model, self.gen = model, generation
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._origins: list[int] = []  # per committed token: 1 accepted draft, 0 the target's own
        self._rounds = 0  # rounds folded into _origins
        self._tokens = 0  # tokens already sent

    def since_last(self) -> dict:
        stats, tokens = self.gen.stats, self.gen.tokens
        detail = stats.rounds_detail
        new_rounds = [list(r) for r in detail[self._rounds:]]
        for _drafted, accepted in detail[self._rounds:]:
            self._origins += [1] * accepted + [0]  # a round commits its accepted drafts, then one target token
        self._rounds = len(detail)
        pieces = []
        for i in range(self._tokens, len(tokens)):
            text = self._decoder.decode(self.model.token_to_piece(tokens[i]))
            pieces.append([text, self._origins[i] if i < len(self._origins) else 0])
        self._tokens = len(tokens)
        return {"tokens": pieces, "rounds": new_rounds, "generated": stats.generated_tokens,
                "decode_s": round(stats.decode_s, 6), "drafted": stats.drafted, "accepted": stats.accepted}
