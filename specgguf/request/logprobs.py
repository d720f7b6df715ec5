"""Log-probabilities of the generated tokens: the target's own, from the rows it verified.

Each round the target scores [id_last, d1..dn] in one batch; row i holds the logits from
which the round's i-th committed token was chosen (the engine's `on_verified` hook hands
them over). A token's logprob is the log-softmax of those raw logits, before logit_bias,
penalties or truncation, as llama_cpp.Llama reports it: so a speculative run reports the
same numbers as plain decoding, up to the last bits that a wider verify batch may change.

Two shapes: text completions (Llama's and OpenAI's legacy `tokens`/`token_logprobs`/
`top_logprobs`/`text_offset`) and chat (OpenAI's `content` list with `bytes`).
"""

from __future__ import annotations

import numpy as np


class Row:
    """One committed token: its id, its logprob and the k most likely tokens with theirs."""

    __slots__ = ("token", "logprob", "top")

    def __init__(self, token: int, logprob: float, top: list[tuple[int, float]]):
        self.token, self.logprob, self.top = token, logprob, top


def row_of(logits: np.ndarray, token: int, k: int) -> Row:
    """log-softmax in float32 (as Llama.logits_to_logprobs), and the top k by logprob, ties
    to the higher id (as Llama's sort of (logprob, id) pairs, descending)."""
    x = np.asarray(logits, dtype=np.float32)
    shifted = x - x.max()
    lp = shifted - np.float32(np.log(np.exp(shifted).sum(dtype=np.float32)))
    top: list[tuple[int, float]] = []
    if k > 0:
        cand = np.argpartition(-lp, k - 1)[:k] if k < lp.size else np.arange(lp.size)
        # any token tied with the k-th is a candidate too: the tie rule picks among them
        cand = np.union1d(cand, np.flatnonzero(lp == lp[cand].min()))
        order = sorted(((float(lp[i]), int(i)) for i in cand), reverse=True)[:k]
        top = [(i, v) for v, i in order]
    return Row(int(token), float(lp[token]), top)


class Collector:
    """The engine's `on_verified` hook: keeps a Row per committed token (in order)."""

    def __init__(self, k: int):
        self.k, self.rows = k, []

    def __call__(self, ctx, ids) -> None:
        for i, tok in enumerate(ids):
            self.rows.append(row_of(ctx.logits(i), tok, self.k))


def _text(model, token: int) -> str:
    return model.token_to_piece(token).decode("utf-8", "ignore")


class Offsets:
    """Character offsets of tokens in the returned text, as Llama counts them: the length of
    the text before a token, decoded as a whole (a character split over tokens counts once)."""

    def __init__(self, start: int):
        self.start, self.raw = start, b""

    def take(self, piece: bytes) -> int:
        at = self.start + len(self.raw.decode("utf-8", "ignore"))
        self.raw += piece
        return at


def completion(model, rows: list[Row], offsets: Offsets) -> dict:
    """The completion shape for `rows` (a whole response's, or one stream chunk's: `offsets`
    carries on from chunk to chunk)."""
    tokens, text_offset, token_lps, tops = [], [], [], []
    for r in rows:
        raw = model.token_to_piece(r.token)
        piece = raw.decode("utf-8", "ignore")
        tokens.append(piece)
        text_offset.append(offsets.take(raw))
        token_lps.append(r.logprob)
        top = {_text(model, i): v for i, v in r.top}
        top[piece] = r.logprob  # the chosen token is always listed, as in Llama's
        tops.append(top)
    return {"tokens": tokens, "text_offset": text_offset, "token_logprobs": token_lps, "top_logprobs": tops}


def chat(model, rows: list[Row]) -> dict:
    """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}."""
    def entry(tok: int, lp: float) -> dict:
        raw = model.token_to_piece(tok)
        return {"token": raw.decode("utf-8", "ignore"), "logprob": lp, "bytes": list(raw)}

    content = []
    for r in rows:
        e = entry(r.token, r.logprob)
        e["top_logprobs"] = [entry(i, v) for i, v in r.top]
        content.append(e)
    return {"content": content, "refusal": None}
