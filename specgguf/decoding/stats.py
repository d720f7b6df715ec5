"""Per-generation statistics with a stable JSON schema (scripts and later issues rely on it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the caches already held (the prompt cache): not read again
    generated_tokens: int = 0
    rounds: int = 0  # target verify passes (plain decoding: one per token)
    drafted: int = 0
    accepted: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0  # drafting plus the draft's catch-up on verified tokens
    verify_s: float = 0.0  # target decodes of [id_last, drafts...] plus acceptance
    decode_s: float = 0.0  # wall time of the generation loop (after prefill)
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position_n: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)  # the length asked for, per round
    rounds_detail: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    seed: int | None = None  # the sampling seed (drawn when none was given); None: greedy
    # how draft lengths were chosen: "none" (no draft), "fixed" (--draft-max N), "auto" (from
    # timed costs: may differ between runs), "deterministic" (auto on frozen prior costs: a
    # function of the text and the seed only, docs/loop.md §2.4)
    lengths: str = "none"
    # the batch-invariant mode (runtime/invariance.py): None when off; else the widest verify
    # batch measured to compute one-token decoding's logits, which no round exceeded
    verify_width: int | None = None
    # Predicted Outputs (drafters/prediction.py): None without a prediction; else the rounds
    # that drafted from it, their draft tokens and how many of those the target accepted
    prediction: dict | None = None
    # a target with a recurrent state (decoding/rollback.py): None for a KV-only cache; else how
    # its rejected tails were taken back (mode, snapshot rollbacks, checkpoint restores, ...)
    rollback: dict | None = None
    # decoding/health.py: the warning given when this draft file accepts next to nothing, else None
    draft_warning: str | None = None

    @property
    def batch_invariant(self) -> bool:
        """Every verify pass computed the logits one-token decoding computes, bit for bit."""
        return self.verify_width is not None

    @property
    def deterministic(self) -> bool:
        """The draft lengths, hence the verify batches, depend only on the tokens and the seed."""
        return self.lengths != "auto"

    def record_round(self, n_drafted: int, n_accepted: int, predicted: bool = False) -> None:
        """One verify pass; `predicted`: its draft came from the request's prediction."""
        if predicted:
            p = self.prediction
            p["rounds"], p["drafted"], p["accepted"] = p["rounds"] + 1, p["drafted"] + n_drafted, p["accepted"] + n_accepted
        self.rounds += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.rounds_detail.append((n_drafted, n_accepted))
        grow = n_drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position_n += [0] * grow
        for i in range(n_drafted):
            self.drafted_by_position[i] += 1
        for i in range(n_accepted):
            self.accepted_by_position_n[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per target pass: accepted drafts plus the target's own token."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0

    @property
    def accepted_by_position(self) -> list[float]:
        return [round(a / d, 4) if d else 0.0
                for a, d in zip(self.accepted_by_position_n, self.drafted_by_position)]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tau": round(self.tau, 4),
            "accepted_by_position": self.accepted_by_position,
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "verify_s": round(self.verify_s, 4),
            "decode_s": round(self.decode_s, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "draft_lengths": self.draft_lengths,
            # per round [drafted, accepted]: what tests/test_parity.py compares with the C++ loop
            "rounds_detail": [list(r) for r in self.rounds_detail],
            "seed": self.seed,
            "lengths": self.lengths,
            "deterministic": self.deterministic,
            "batch_invariant": self.batch_invariant,
            "verify_width": self.verify_width,
            "prediction": None if self.prediction is None else dict(self.prediction),
            "rollback": None if self.rollback is None else dict(self.rollback),
            "draft_warning": self.draft_warning,
        }

    def summary(self) -> str:
        line = (f"{self.generated_tokens} tokens in {self.decode_s:.2f} s ({self.tokens_per_second:.1f} tok/s), "
                f"{self.rounds} target passes")
        if self.drafted:
            line += (f", {self.accepted}/{self.drafted} drafts accepted ({100 * self.acceptance_rate:.0f}%), "
                     f"tau {self.tau:.2f}")
        if self.prediction is not None:
            p = self.prediction
            line += f"; {p['accepted']}/{p['drafted']} prediction tokens accepted in {p['rounds']} rounds"
        cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
        line += f"; prompt {self.prompt_tokens} tokens{cached} in {self.prefill_s:.2f} s"
        line += f"; seed {self.seed}" if self.seed is not None else ""
        line += "; deterministic lengths" if self.lengths == "deterministic" else ""
        return line + (f"; batch-invariant (verify <= {self.verify_width})" if self.batch_invariant else "")
