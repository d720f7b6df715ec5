"""Taking back a verify pass's rejected tail, whatever the cache (docs/loop.md §10).

A KV cache drops the cells past the accepted prefix (`trim`). A recurrent state (LFM2's short
convolutions, Qwen3.5's gated DeltaNet, Mamba's SSM) keeps one state per sequence, not one per
position; the pinned llama.cpp gives two ways back, the two its own loops choose between
(common_context_can_seq_rm, examples/speculative-simple):

- `snapshots`: a context made with n_rs_seq = N keeps the states after each of its last pass's
  last N tokens, so removing up to N trailing positions, once per pass, works like a trim;
- `checkpoint`: the recurrent state is saved before the pass (PARTIAL_ONLY: the attention
  cells are trimmed as usual) and, after a partial acceptance, put back; the accepted tokens
  are then decoded again, without outputs (every decision was made on the verify pass).

A context in snapshot mode falls back to a checkpoint for a pass whose rejected tail could be
longer than N. The counters say what each round cost; the engine's round timing includes the
restore and the re-decode, so the auto lengths price them (decoding/tuning.py).
"""

from __future__ import annotations


class Rollback:
    """The rollback of one sequence of a target context (a native.Context or a SeqContext)."""

    def __init__(self, ctx, batch):
        self.ctx, self.batch = ctx, batch
        self.mode = ctx.rollback  # "trim", "snapshots" or "checkpoint"
        self.n_rs_seq = ctx.n_rs_seq
        self._saved: tuple[int, bytes] | None = None  # (position, partial state) before the pass
        self.snapshot_rollbacks = 0  # rejected tails taken back by a snapshot
        self.restores = 0  # checkpoints put back
        self.redecoded = 0  # tokens decoded again after a restore
        self.checkpoint_bytes = 0  # the size of the last checkpoint

    @property
    def trims(self) -> bool:
        """Whether every rollback is a plain KV trim (a cache without recurrent state)."""
        return self.mode == "trim"

    def before_pass(self, pos0: int, n_tokens: int) -> None:
        """A pass of `n_tokens` at `pos0` is about to run, of which all but the first may be
        taken back: save a checkpoint where a snapshot cannot take that many back."""
        self._saved = None
        if self.mode == "trim" or n_tokens <= 1:
            return
        if self.mode == "checkpoint" or n_tokens - 1 > self.n_rs_seq:
            data = self.ctx.partial_state_bytes()
            self._saved = (pos0, data)
            self.checkpoint_bytes = len(data)

    def keep(self, pos0: int, tokens) -> None:
        """After the pass at `pos0`: the cache keeps `tokens` (its first entries) and nothing
        after them."""
        end = pos0 + len(tokens)
        if self.mode == "trim":
            self.ctx.seq_rm(end)
            return
        if end > self.ctx.pos_max():
            self._saved = None  # all accepted: nothing to take back
            return
        saved, self._saved = self._saved, None
        if saved is None:
            self.ctx.seq_rm(end)  # within the snapshots (llama.cpp refuses, and says so, otherwise)
            self.snapshot_rollbacks += 1
            return
        pos, data = saved
        if pos != pos0:
            raise RuntimeError(f"checkpoint of position {pos} put back for a pass at {pos0}")
        self.ctx.load_partial_state_bytes(data)
        self.ctx.seq_rm(pos0)  # the attention cells of the whole pass
        self.restores += 1
        capacity = self.batch.capacity
        tokens = list(tokens)
        for start in range(0, len(tokens), capacity):
            self.batch.clear().add_tokens(tokens[start:start + capacity], pos0 + start, "none")
            self.ctx.decode(self.batch)
        self.redecoded += len(tokens)

    def stats(self) -> dict:
        return {"mode": self.mode, "n_rs_seq": self.n_rs_seq, "snapshot_rollbacks": self.snapshot_rollbacks,
                "restores": self.restores, "redecoded_tokens": self.redecoded,
                "checkpoint_bytes": self.checkpoint_bytes}
