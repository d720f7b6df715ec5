"""The one protocol every draft kind implements, as a base class: the engine reads what a
drafter can do from these attributes instead of probing for them.

Per generation and per round the engine calls (docs/loop.md):

    start(chooser, lazy)              a generation starts: its length chooser (auto mode;
                                      None with a fixed length) and whether catch-up may queue
    resume(n) -> m                    a new generation starts whose first n prompt tokens
                                      this drafter's state already covers (the prompt cache,
                                      docs/loop.md §7): keep the state of the first m <= n
                                      positions, forget the rest; m = 0 is reset()
    begin(history)                    once, after the prompt is in the target
    process(tokens, pos0)             after EVERY target decode: a prefill chunk's tokens;
                                      of a verify batch [id_last, d1..dn], the k + 1 rows
                                      the target kept (id_last and the accepted drafts)
    draft(history, id_last, pos0, n, sampler=None)
                                      propose up to n tokens following id_last
    rollback(pos)                     forget draft state at positions >= pos
    accept(k)                         k of the proposed tokens were accepted

`history` holds the tokens already in the target's KV cache (prompt and output so far);
`id_last` is the newest token, not yet in the cache, at position `pos0`.

Sampling (`coupled` draws draft tokens with the target's keyed noise; `ratio` needs the
distribution each token was drafted from): a kind with `samples = True` takes the engine's
`sampling.Sampler` in `draft(..., sampler=)`, picks the token for absolute position
pos0 + 1 + j with `tok, q = sampler.propose(logits, sampler.window(history, id_last) +
drafted_so_far, pos0 + 1 + j)` and leaves one q per returned token in `last_q` (None for a
point mass or where the rule needs no q; the attribute None when no token has a q). A kind
with `samples = False` drafts as it always does and the rules treat its tokens as point
masses: still exact, only less accepted. Never stop or discard a draft because of a token you drew: decide on the
draft's own top candidate first (see ModelDrafter's p_min), or the q you report is not the
one the tokens came from.

Confidence (`--draft-max auto`, tuning.py): a kind that knows how sure it is sets
`last_confidence` in `draft()`: one number in [0, 1] per returned token, its own estimate
that the token is accepted once all before it were (a lookup drafter: from how long the
match is and how often its continuation followed it; a model draft: its probabilities). The
engine treats these as raw scores: it calibrates them against what verification accepts
(tuning.Calibration) and keeps the prefix of the draft with the best expected tokens per
second. None: no estimate; acceptance measured per position on this text is used instead.
A sequential drafter (a draft model, eagle3, mtp) scores each token as it drafts it and
asks `keep_drafting(confidences, n_max)` before the next: in auto mode the chooser says
whether one more token still pays (an unsure draft stops early), with a fixed length it
drafts on (to n_max, or to its --draft-p-min) as llama.cpp does.

`lookup = True` (ngram, suffix): a draft costs next to nothing whatever its length, so in
auto mode the engine asks for `max_length` tokens every round and cuts the draft to the
length that pays, instead of choosing the length before drafting. `chooser` is the engine's
`tuning.LengthController` in auto mode (None with a fixed --draft-max): a drafter that picks
between sources (drafters/hybrid.py) asks it what each source's draft is worth.
"""

from __future__ import annotations

from typing import Sequence


class Drafter:
    """Base of every draft kind; the defaults are those of a stateless drafter."""

    kind: str = "?"
    # the longest draft one round can offer (auto lengths consider 0..max_length)
    max_length: int = 8
    # one draft pass makes the whole block (dflash/dspark): no per-token draft cost
    block: bool = False
    # draft(..., sampler=) draws tokens from a q it reports in last_q (see the module doc)
    samples: bool = False
    # lazy: may queue its catch-up on verified tokens until the next draft needs it, so
    # rounds that do not draft cost nothing; the engine turns it on in auto mode only
    supports_lazy: bool = False
    lazy: bool = False
    last_q: list | None = None
    # per returned token, the drafter's own estimate that it is accepted (see the module doc)
    last_confidence: list | None = None
    # drafting is a lookup: free whatever the length (auto asks for max_length, then cuts)
    lookup: bool = False
    # the generation's LengthController in auto mode, else None (given by start())
    chooser = None
    # the state is built from the target's own passes (layer inputs, hidden states), so the
    # target must decode again whatever the drafter cannot keep (the prompt cache)
    reads_target: bool = False
    # the drafters.model.SharedDraft its model is borrowed from (slots of a parallel target)
    shared_draft = None
    # a drafter with several sources (hybrid.py, prediction.py): the one the last draft came from
    source: str | None = None

    # reads the target's layer inputs (eagle3, dflash, dspark): the target's passes extract
    # them, so verify costs follow a curve of their own (the cost profile keys on it)
    reads_hidden: bool = False

    @property
    def model_path(self) -> str | None:
        """The draft GGUF this drafter runs, or None (lookups)."""
        info = getattr(self, "info", None)
        return str(info.path) if info is not None else None

    @property
    def profile_id(self):
        """What identifies this draft in cost profiles: the draft file, or the kind's name
        (a hybrid: both parts, drafters/hybrid.py)."""
        path = self.model_path
        return path if path is not None else self.kind

    def describe(self) -> str:
        return self.kind

    def start(self, chooser, lazy: bool = False) -> None:
        """A generation starts: `chooser` is its tuning.LengthController in auto mode (None with
        a fixed length); `lazy` allows queued catch-up where the kind supports it."""
        self.chooser = chooser
        self.lazy = lazy and self.supports_lazy

    def reset(self) -> None:
        pass

    def resume(self, n: int) -> int:
        """Keep the state of the first n positions if the kind can (see the module doc);
        the default keeps nothing."""
        self.reset()
        return 0

    def save(self):
        """The drafter's state as an object `restore` takes back (the prompt cache's saved
        states), or None when the kind cannot save it."""
        return None

    def restore(self, state) -> bool:
        """Put back a state from `save`; False: it could not, and the drafter was reset."""
        self.reset()
        return False

    def begin(self, history: Sequence[int]) -> None:
        pass

    def process(self, tokens: Sequence[int], pos0: int) -> None:
        pass

    def draft(self, history: Sequence[int], id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        raise NotImplementedError

    def rollback(self, pos: int) -> None:
        pass

    def accept(self, n_accepted: int) -> None:
        pass

    def close(self) -> None:
        pass

    def _close_handles(self, *owned: str) -> None:
        """Close the llama.cpp handles this drafter owns (attribute names, in order), then its
        model, or hand back the model borrowed from a SharedDraft. Safe to call twice, and on
        a drafter whose construction stopped halfway."""
        for name in owned:
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
        shared, self.shared_draft = self.shared_draft, None
        if shared is not None:
            shared.release()
        elif getattr(self, "model", None) is not None:
            self.model.close()

    def keep_drafting(self, confidence: list, n_max: int) -> bool:
        """A sequential drafter's check before drafting token len(confidence) + 1 of at most
        n_max (see the module doc): the auto chooser decides, a fixed length drafts on."""
        chooser = self.chooser
        return len(confidence) < n_max and (chooser is None or chooser.keep_drafting(confidence, n_max))


def top10_prob(logits, tok: int) -> float:
    """llama.cpp's draft confidence for --draft-p-min: the softmax over the 10 best logits
    (not the whole vocabulary) at token `tok`."""
    import numpy as np

    top = np.partition(logits, -10)[-10:]
    top = np.exp(top - top.max())
    return float(np.exp(logits[tok] - logits.max()) / top.sum())
