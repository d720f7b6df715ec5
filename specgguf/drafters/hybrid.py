"""`suffix` + a draft model (`--draft suffix --draft DRAFT.gguf`, API draft="suffix+DRAFT.gguf"):
each round drafts from a suffix match where that is expected to commit more tokens per second
than the model's draft, and from the model elsewhere (docs/loop.md §4.7).

The suffix lookup costs next to nothing, so it runs every round; its draft is scored by the
engine's cost model (`LengthController.value`: calibrated confidence, the measured verify
curve) and compared with the model's best planned length (`LengthController.next_length`, from
the model's acceptance on this text and its measured draft cost). The model draft is only
computed when it wins. Both are ordinary drafts to the verifier, so the output is the
target's either way (suffix tokens are point masses under the `ratio` rule). With a fixed
--draft-max (no cost model), a suffix draft is used when its first token is likely
(a match of several tokens), else the model's.
"""

from __future__ import annotations

from .base import Drafter
from .suffix import SuffixDrafter

FIXED_RULE_CONFIDENCE = 0.75  # fixed lengths: suffix drafts from a match of >= 3 tokens


class HybridDrafter(Drafter):
    lookup = True  # the engine offers the longest length; this drafter picks source and length

    def __init__(self, suffix: SuffixDrafter, model: Drafter):
        self.suffix, self.model = suffix, model
        self.kind = f"suffix+{model.kind}"
        self.max_length = max(suffix.max_length, model.max_length)
        self.block, self.samples = model.block, model.samples
        self.supports_lazy = model.supports_lazy
        self.source: str | None = None  # "suffix", "model" or None (no draft), for the last round
        self.rounds = {"suffix": 0, "model": 0}

    def start(self, chooser, lazy: bool = False) -> None:
        """The chooser is the hybrid's (it picks source and length); the model drafts to the
        length it is given, and may queue its catch-up."""
        self.chooser = chooser
        self.model.start(None, lazy)

    @property
    def profile_id(self):
        return ("suffix", self.model.profile_id)

    @property
    def model_path(self) -> str | None:
        return self.model.model_path

    @property
    def reads_hidden(self) -> bool:
        return self.model.reads_hidden

    def describe(self) -> str:
        return f"{self.suffix.describe()}, else {self.model.describe()}"

    def reset(self) -> None:
        self.suffix.reset()
        self.model.reset()

    @property
    def reads_target(self) -> bool:
        return self.model.reads_target

    def resume(self, n: int) -> int:
        self.suffix.resume(n)
        return self.model.resume(n)

    def save(self):
        return self.model.save()

    def restore(self, state) -> bool:
        self.suffix.restore(())
        return self.model.restore(state)

    def begin(self, history) -> None:
        self.suffix.begin(history)
        self.model.begin(history)

    def process(self, tokens, pos0: int) -> None:
        self.model.process(tokens, pos0)

    def rollback(self, pos: int) -> None:
        self.model.rollback(pos)

    def accept(self, n_accepted: int) -> None:
        self.model.accept(n_accepted)

    def draft(self, history, id_last: int, pos0: int, n_max: int, sampler=None) -> list[int]:
        found = self.suffix.draft(history, id_last, pos0, min(n_max, self.suffix.max_length))
        conf = self.suffix.last_confidence or []
        chooser, n_model = self.chooser, min(n_max, self.model.max_length)
        if chooser is None:
            use_suffix = bool(found) and conf[0] >= FIXED_RULE_CONFIDENCE
            n_suffix = len(found)
        else:
            n_suffix, rate_suffix = chooser.value(conf) if found else (0, 0.0)
            n_model = min(chooser.next_length(), n_model)
            rate_model = chooser.plan_rate(n_model)
            use_suffix = n_suffix > 0 and rate_suffix >= rate_model
        self.last_q = None
        if use_suffix:
            self.source = "suffix"
            self.rounds["suffix"] += 1
            self.last_confidence = conf[:n_suffix]
            return found[:n_suffix]
        if n_model <= 0:
            self.source = None
            self.last_confidence = []  # a lookup-only round: its cost is the lookup's
            return []
        self.source = "model"
        self.rounds["model"] += 1
        self.last_confidence = None
        out = self.model.draft(history, id_last, pos0, n_model, sampler=sampler)
        self.last_q = self.model.last_q
        return out

    def close(self) -> None:
        self.suffix.close()
        self.model.close()
