"""`suffix`: model-free drafts from the longest match in this text and in earlier outputs,
after SuffixDecoding (Oliaro et al., NeurIPS 2025; docs/loop.md §4.6).

Two token stores answer the same question, "what followed the longest earlier occurrence of
the text's end?":
- the generation's own (prompt and output so far), rebuilt per generation, or extended when
  the next prompt continues the last text (a chat);
- a shared one of earlier outputs, kept in the drafter object, so the Python API object, the
  server and `chat` reuse it across requests; it holds at most `max_shared_tokens` tokens and
  forgets the oldest outputs first.

Each store indexes every 2- and 4-gram by the positions it ended at; a lookup takes the
occurrences of the text's last 4 (else 2) tokens, measures how far back each keeps matching,
and keeps those with the longest match: the node of a suffix tree at that depth. The draft
walks forward from there, token by token, taking the continuation most of them share and
dropping the ones that part ways, so the draft is the most frequent continuation of the
longest match. Each token's confidence is the share of occurrences that continue with it,
discounted by how little matched text backs it (base.Drafter: the engine calibrates it and
keeps the prefix that pays).
"""

from __future__ import annotations

from collections import deque

from .base import Drafter

SIZES = (4, 2)  # n-gram sizes indexed, the longer looked up first
MATCH_CAP = 32  # a match is measured up to this many tokens (longer ones predict no better)
CANDIDATES = 32  # occurrences of an n-gram examined per lookup: the most recent ones
SEP = -1  # between outputs in the shared store: no match or continuation crosses it
_SHIFT = 1 << 24  # n-gram keys pack token ids (< 2**24) into one int


def _key(toks, end: int, n: int) -> int | None:
    """The packed key of toks[end-n+1 .. end] (None when a separator is inside)."""
    k = 0
    for t in toks[end - n + 1:end + 1]:
        if t < 0:
            return None
        k = k * _SHIFT + t
    return k


class TokenStore:
    """Tokens at absolute positions [base, base + len(toks)) and, per n-gram size, the
    positions where each n-gram ended (ascending), for n-grams whose next token is known."""

    def __init__(self):
        self.toks: list[int] = []
        self.base = 0
        self.index: dict[int, dict[int, list[int]]] = {n: {} for n in SIZES}

    def __len__(self) -> int:
        return len(self.toks)

    def extend(self, tokens) -> None:
        toks, base, index = self.toks, self.base, self.index
        for tok in tokens:
            toks.append(tok)
            end = len(toks) - 2  # the n-grams ending here now have a continuation
            if tok < 0 or end < 0:
                continue
            for n in SIZES:
                k = _key(toks, end, n) if end - n + 1 >= 0 else None
                if k is not None:
                    index[n].setdefault(k, []).append(base + end)

    def drop_front(self, count: int) -> None:
        """Forget the oldest `count` tokens (and every index entry that points at them)."""
        toks, base = self.toks, self.base
        count = min(count, len(toks))
        for end in range(min(count, len(toks) - 1)):  # entries were made for ends < len - 1
            if toks[end + 1] < 0:
                continue  # an n-gram followed by a separator was never indexed
            for n in SIZES:
                k = _key(toks, end, n) if end - n + 1 >= 0 else None
                if k is None:
                    continue
                positions = self.index[n].get(k)
                if positions and positions[0] == base + end:
                    del positions[0]
                    if not positions:
                        del self.index[n][k]
        del toks[:count]
        self.base = base + count

    def entries(self) -> int:
        return sum(len(p) for idx in self.index.values() for p in idx.values())

    def lookup(self, tail: list[int], n_max: int) -> tuple[list[int], list[float]]:
        """(draft, raw confidences) continuing `tail` (the text's last tokens, newest last)."""
        toks, base = self.toks, self.base
        occ = None
        for n in SIZES:
            if len(tail) >= n:
                k = _key(tail, len(tail) - 1, n)
                occ = self.index[n].get(k) if k is not None else None
                if occ:
                    break
        if not occ:
            return [], []
        # how far back each recent occurrence keeps matching: the suffix-tree node's depth
        best, node = 0, []
        limit = min(MATCH_CAP, len(tail))
        for pos in occ[-CANDIDATES:]:
            e = pos - base
            m = n
            while m < limit and e - m >= 0 and toks[e - m] == tail[-1 - m]:
                m += 1
            if m > best:
                best, node = m, [e + 1]
            elif m == best:
                node.append(e + 1)
        return self._walk(node, best, n_max)

    def _walk(self, node: list[int], depth: int, n_max: int) -> tuple[list[int], list[float]]:
        """Follow the most frequent continuation of the occurrences in `node` (indices of
        their next tokens) for up to n_max tokens."""
        toks, size = self.toks, len(self.toks)
        out: list[int] = []
        conf: list[float] = []
        while len(out) < n_max and node:
            if len(node) == 1:  # one occurrence left: the rest of its text, until a separator
                p = node[0]
                rest = toks[p:p + n_max - len(out)]
                if SEP in rest:
                    rest = rest[:rest.index(SEP)]
                c = depth + len(out)
                conf.extend(1.0 - 1.0 / (c + i + 1) for i in range(len(rest)))
                out.extend(rest)
                break
            counts: dict[int, int] = {}
            for p in node:
                if p < size and toks[p] >= 0:
                    counts[toks[p]] = counts.get(toks[p], 0) + 1
            if not counts:
                break
            tok = max(counts, key=counts.__getitem__)
            share = counts[tok] / len(node)
            support = counts[tok] + depth + len(out)
            out.append(tok)
            conf.append(share * (1.0 - 1.0 / (support + 1)))
            node = [p + 1 for p in node if p < size and toks[p] == tok]
        return out, conf


class SuffixDrafter(Drafter):
    """Deterministic drafts (point masses for `ratio`), with a confidence per token."""

    kind = "suffix"
    lookup = True
    max_length = 64

    def __init__(self, max_shared_tokens: int = 1 << 16):
        if not isinstance(max_shared_tokens, int) or max_shared_tokens < 0:
            from ..errors import UserError

            raise UserError(f"max_shared_tokens must be a whole number >= 0 (got {max_shared_tokens!r})",
                            param="max_shared_tokens")
        self.max_shared_tokens = max_shared_tokens
        self.shared = TokenStore()  # earlier outputs, across generations
        self._shared_lengths: deque[int] = deque()  # tokens (separator included) per stored output
        self.text = TokenStore()  # this generation's prompt and output
        self._prompt_len = 0

    def describe(self) -> str:
        return (f"suffix lookup in the text and {len(self._shared_lengths)} earlier outputs "
                f"({len(self.shared)}/{self.max_shared_tokens} tokens)")

    # -- the shared store ------------------------------------------------------------------
    def remember(self, tokens) -> None:
        """Add one finished output to the shared store, forgetting the oldest to stay in bounds."""
        tokens = list(tokens)[-max(self.max_shared_tokens - 1, 0):] if self.max_shared_tokens > 1 else []
        if not tokens:
            return
        need = len(tokens) + 1
        drop = 0
        while self._shared_lengths and len(self.shared) - drop + need > self.max_shared_tokens:
            drop += self._shared_lengths.popleft()
        if drop:
            self.shared.drop_front(drop)
        self.shared.extend(tokens)
        self.shared.extend([SEP])
        self._shared_lengths.append(need)

    def _flush(self) -> None:
        if len(self.text) > self._prompt_len:
            self.remember(self.text.toks[self._prompt_len:])
        self._prompt_len = len(self.text)  # stored once

    # -- the protocol ----------------------------------------------------------------------
    def reset(self) -> None:
        self._flush()

    def resume(self, n: int) -> int:
        self.reset()
        return n  # the text is rebuilt from the history by begin(); the shared store stays

    def save(self):
        return ()

    def restore(self, state) -> bool:
        self.reset()
        return True

    def begin(self, history) -> None:
        old = self.text.toks
        if self.text.base == 0 and old and len(history) >= len(old) and history[:len(old)] == old:
            self.text.extend(history[len(old):])  # the new prompt continues the last text
        else:
            self.text = TokenStore()
            self.text.extend(history)
        self._prompt_len = len(self.text)

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        text = self.text
        if len(history) > len(text):  # the tokens committed since the last round
            text.extend(history[len(text):])
        toks = text.toks
        tail = toks[max(len(toks) - MATCH_CAP + 1, 0):]
        tail.append(id_last)
        best, best_conf, best_score = [], [], 0.0
        for store in (text, self.shared):
            if not len(store):
                continue
            out, conf = store.lookup(tail, n_max)
            score, run = 0.0, 1.0
            for c in conf:
                run *= c
                score += run
            if score > best_score:
                best, best_conf, best_score = out, conf, score
        self.last_confidence = best_conf
        return best

    def close(self) -> None:
        self._flush()
