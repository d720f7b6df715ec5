"""Predicted Outputs: the text a client expects back (the file it is editing) as a draft source
for one generation, in front of the engine's own drafter or none (docs/loop.md §4.8).

The prediction is aligned with the output as it grows. While the output follows it, each
round drafts the prediction's next tokens. When the output departs (an edit), the alignment
is lost; every round then looks for the output's last tokens in the prediction again, forward
of where it was last aligned first (edits keep the file's order), and drafting resumes where
the output rejoins it (never at a place where the output already declined to go on). Rounds where the prediction offers nothing go to the engine's drafter
(ngram, suffix, a draft model, ...), or draft nothing when there is none.

The prediction never goes through a model: its tokens are point masses to every acceptance
rule, so the output is the target's own, as with any other draft. Its drafts are scored as
the n-gram lookup scores a match (ngram.match_confidence), by how long the output has followed
the prediction, so `--draft-max auto` keeps the prefix that pays; where the engine's drafter
offers a better draft (its own lookup of the output, say), the round takes that one.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from .base import Drafter
from .ngram import MATCH_CAP, match_confidence

MAX_LENGTH = 64  # the longest draft a round takes from the prediction (auto cuts it to what pays)
KEY = 2  # tokens of output that must match the prediction to re-align (one token is too common)
START_RUN = 1  # the output's first tokens are scored as a match this long: an edit may start with
# the file, a chat answer often with a line of its own first
CANDIDATES = 64  # occurrences of a key weighed per re-alignment (the nearest forward ones)
PRIOR_WEIGHT = 2.0  # pseudo-count of the match-length score against this output's own alignments
# a prediction the prompt already holds (an edit request quotes the file): sampled windows of
# WINDOW tokens, and the share of them that must occur in the prompt for it to count as held
WINDOW, SAMPLES, HELD = 8, 16, 0.75


class PredictionDrafter(Drafter):
    """One generation's prediction (`tokens`) in front of `inner` (the engine's drafter, or None).

    `source` says where the last round's draft came from ("prediction", "drafter" or None);
    `verify_width`: the batch-invariant mode's widest verify batch, which no draft may exceed."""

    kind = "prediction"
    lookup = True  # the engine offers the longest length; this drafter cuts the inner's rounds itself

    def __init__(self, tokens: list[int], inner: Drafter | None = None, verify_width: int | None = None):
        self.tokens, self.inner = list(tokens), inner
        longest = MAX_LENGTH if inner is None else max(MAX_LENGTH, inner.max_length)
        self.max_length = longest if verify_width is None else max(min(longest, verify_width - 1), 0)
        if inner is not None:
            self.kind = f"prediction+{inner.kind}"
            self.block, self.samples, self.supports_lazy = inner.block, inner.samples, inner.supports_lazy
            self.reads_hidden, self.reads_target = inner.reads_hidden, inner.reads_target
        self._starts: dict[tuple, list[int]] = {}  # KEY tokens -> the positions they end at, ascending
        for end in range(KEY, len(self.tokens) + 1):
            self._starts.setdefault(tuple(self.tokens[end - KEY:end]), []).append(end)
        self.source: str | None = None
        self._out0 = 0  # where the output starts in history + [id_last]
        self._seen = 0  # output tokens walked so far
        self._at: int | None = 0  # the prediction's index the output continues at (None: lost)
        self._run = START_RUN  # how many tokens the alignment has held (scores the drafts)
        self._ways = 1  # how many places in the prediction the last re-alignment fitted equally well
        self._last_at = 0  # where the output was last aligned: re-alignment looks forward of it
        # places where the output declined to go on with the prediction: a re-alignment never
        # lands on one again (an output in a loop would draft the same refused tokens each time)
        self._refused: set[int] = set()
        # how long each alignment held before the output left it (sorted): this output's own
        # measure of how far the prediction is followed (`_scores`)
        self._segments: list[int] = []
        self._inner_out: list[int] | None = None  # the engine's drafter's draft of this round, if asked
        self.redundant = False  # the engine's lookup has the prediction already (begin): it drafts alone

    def describe(self) -> str:
        base = f"the request's prediction ({len(self.tokens)} tokens)"
        return base if self.inner is None else f"{base}, else {self.inner.describe()}"

    @property
    def profile_id(self):
        return None if self.inner is None else self.inner.profile_id

    @property
    def model_path(self) -> str | None:
        return None if self.inner is None else self.inner.model_path

    # -- the inner drafter's protocol passes through ----------------------------------------
    def start(self, chooser, lazy: bool = False) -> None:
        self.chooser = chooser
        if self.inner is not None:
            self.inner.start(chooser, lazy)

    def begin(self, history) -> None:
        self._out0 = len(history) + 1  # history is the prompt minus its last token (id_last)
        if self.inner is not None:
            self.inner.begin(history)
            # a free lookup over a prompt that holds the prediction already drafts all it would
            # (and learns where the output departs): the prediction then stands aside
            self.redundant = self._free_inner and self._held_in(history)

    @property
    def _free_inner(self) -> bool:
        """The engine's drafter is a lookup with no model (ngram, suffix): asking it costs nothing."""
        return self.inner is not None and self.inner.lookup and self.inner.model_path is None

    def _held_in(self, history) -> bool:
        pred = self.tokens
        if len(pred) < WINDOW:
            return False
        windows = {tuple(history[i:i + WINDOW]) for i in range(len(history) - WINDOW + 1)}
        step = max((len(pred) - WINDOW) // (SAMPLES - 1), 1)
        starts = range(0, len(pred) - WINDOW + 1, step)
        return sum(tuple(pred[i:i + WINDOW]) in windows for i in starts) >= HELD * len(starts)

    def process(self, tokens, pos0: int) -> None:
        if self.inner is not None:
            self.inner.process(tokens, pos0)

    def rollback(self, pos: int) -> None:
        if self.inner is not None:
            self.inner.rollback(pos)

    def accept(self, n_accepted: int) -> None:
        if self.inner is not None:
            self.inner.accept(n_accepted)

    def close(self) -> None:
        pass  # the inner drafter belongs to the engine

    # -- alignment ---------------------------------------------------------------------------
    def _follow(self, history, id_last: int) -> None:
        """Walk the output tokens committed since the last round along the prediction."""
        n_hist, end = len(history), len(history) + 1 - self._out0
        pred, at, run = self.tokens, self._at, self._run
        for i in range(self._seen, end):
            j = self._out0 + i
            tok = history[j] if j < n_hist else id_last
            if at is not None and at < len(pred) and pred[at] == tok:
                at, run = at + 1, run + 1
                self._ways = 1
            else:
                if at is not None:
                    self._last_at = at
                    self._refused.add(at)
                    insort(self._segments, run)
                at, run = None, 0
        if at is not None:
            self._last_at = at
        self._seen, self._at, self._run = max(end, self._seen), at, run

    def _realign(self, history, id_last: int) -> None:
        """Find where the output's last tokens occur in the prediction: the candidate whose match
        reaches furthest back, the nearest one forward of the last alignment among equals (how
        many equals there were discounts the drafts' scores, as the n-gram lookup's `ways`)."""
        n_out = len(history) + 1 - self._out0
        if n_out < KEY:
            return
        tail = [*history[len(history) - KEY + 1:], id_last]
        ends = self._starts.get(tuple(tail))
        if not ends:
            return
        first = bisect_left(ends, self._last_at)
        nearby = ends[first:first + CANDIDATES] + ends[max(first - CANDIDATES, 0):first][::-1]
        pred, best, best_len, ties = self.tokens, None, 0, 0
        for end in nearby:
            if end in self._refused:
                continue
            m = KEY  # extend the match backwards, within the output, up to MATCH_CAP
            while m < min(MATCH_CAP, n_out) and end - m - 1 >= 0 and \
                    pred[end - m - 1] == history[len(history) - m]:
                m += 1
            if m > best_len:
                best, best_len, ties = end, m, 1
            elif m == best_len:
                ties += 1
        self._at, self._run, self._ways = best, best_len, ties

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        if self.redundant:
            return self._inner_draft(history, id_last, pos0, min(n_max, self.max_length), sampler)
        self._follow(history, id_last)
        if self._at is None:
            self._realign(history, id_last)
        n = min(n_max, self.max_length)
        self.last_q = None
        if self._at is None or self._at >= len(self.tokens) or n <= 0:
            return self._inner_draft(history, id_last, pos0, n, sampler)
        out = self.tokens[self._at:self._at + n]
        conf = self._scores(len(out))
        if self._inner_wins(history, id_last, pos0, n, sampler, conf):
            return self._inner_out
        self.source, self.last_confidence, self.last_q = "prediction", conf, None  # point masses
        return out

    def _scores(self, n: int) -> list[float]:
        """Raw confidence of the next n prediction tokens: the match-length score, weighed against
        how long alignments have held in this output so far (of those that reached the run
        length of token i, the share that went on past it). An output that keeps leaving the
        prediction after a line (the block re-indented, say) gets short drafts from it."""
        run = self._run
        ways = [self._ways] * n if self._ways > 1 else None
        base = match_confidence(min(run, MATCH_CAP), n, ways)
        segs = self._segments
        if not segs:
            return base
        out = []
        for i, b in enumerate(base):
            reached = len(segs) - bisect_left(segs, run + i)
            went_on = len(segs) - bisect_right(segs, run + i)
            out.append((went_on + PRIOR_WEIGHT * b) / (reached + PRIOR_WEIGHT))
        return out

    def _inner_wins(self, history, id_last, pos0, n, sampler, conf) -> bool:
        """Does the engine's drafter offer more than the prediction this round? Where the output
        has left the prediction in a way the prediction cannot follow (a block re-indented),
        a lookup of the output's own text drafts better. A pure lookup (ngram, suffix: free) is
        asked every round and the two drafts are valued as the hybrid values its sources
        (tuning.LengthController.value), or by the first token's score with a fixed length; a
        drafter with a model is asked only when its planned draft is worth more."""
        inner, chooser = self.inner, self.chooser
        self._inner_out = None
        if inner is None:
            return False
        if self._free_inner:
            theirs = self._inner_draft(history, id_last, pos0, n, sampler)
            their_conf = self.last_confidence or []
            if not theirs:
                return False
            if chooser is not None:
                wins = chooser.value(their_conf)[1] > chooser.value(conf)[1]
            else:
                wins = their_conf[0] > conf[0]
            self._inner_out = theirs
            return wins
        if chooser is None or inner.lookup:
            return False  # fixed lengths, or a hybrid (it would run its model to compare): the prediction
        n_model = min(chooser.next_length(), inner.max_length, n)
        if n_model <= 0 or chooser.plan_rate(n_model) <= chooser.value(conf)[1]:
            return False
        self._inner_out = self._inner_draft(history, id_last, pos0, n_model, sampler)
        return True

    def _inner_draft(self, history, id_last, pos0, n, sampler) -> list[int]:
        inner = self.inner
        self.source, self.last_confidence = None, []  # a lookup-only round costs the lookup's
        if inner is None or n <= 0:
            return []
        if not inner.lookup:  # a sequential drafter: the length is chosen before drafting
            n = min(n, inner.max_length)
            if self.chooser is not None:
                n = min(n, self.chooser.next_length())
            if n <= 0:
                return []
        out = inner.draft(history, id_last, pos0, n, sampler=sampler)
        self.source = "drafter"
        self.last_q = inner.last_q
        # the engine cuts lookup drafts by their scores; a sequential drafter has stopped itself
        self.last_confidence = inner.last_confidence if inner.lookup else None
        return out
