"""The speculative loop: prefill, draft, verify in one target batch, accept, roll back.

It follows llama.cpp's `llama-speculative-simple` (docs/loop.md §2) so that
rounds, drafts and accepted counts can be compared with the C++ loop one to one:
the prompt minus its last token is prefilled without outputs, and every round verifies
[id_last, d1..dn] with the target. With no drafter the very same loop runs with n = 0,
which is plain decoding: the fair baseline.

Verification is `verify.py`'s: greedy (the target's arg-max at each position; a draft token
is accepted while it equals it, an end-of-generation token ends acceptance,
`sampling.cpp:687-699`) unless `SamplingParams` ask for temperature or penalties; then the
target's logits go through `Sampler.probs` and the `exact` or `ratio` rule decides.
"""

from __future__ import annotations

import time
from typing import Iterator

from ..errors import UserError
from .promptcache import MIN_REUSE, PromptCache  # noqa: F401  (MIN_REUSE: the engine's reuse threshold, named here too)
from .health import DraftHealth
from .rollback import Rollback
from .sampling import Sampler, SamplingParams
from .stats import GenerationStats
from .verify import coupled as accept_coupled, greedy as accept_greedy, ratio as accept_ratio


AUTO = "auto"
AUTO_MAX = 8  # the longest draft `auto` considers for token-by-token drafters
# logits scanned per arg-max call: a narrow vocabulary takes every verified row in one numpy
# call; a wide one (262k: a row is 1 MB, ~60 us to scan) goes a few rows at a time, so the
# rows after the first rejection are never scanned
ROW_SCAN = 1 << 16


def greedy_ids(ctx, draft, is_eog, block=None) -> list[int]:
    """`verify.greedy` over the target's arg-max of the last decode's rows [id_last, *draft]
    (`block`: those rows, when the caller has them already)."""
    if block is None:
        block = ctx.logits_block(len(draft) + 1)
    step = max(1, ROW_SCAN // ctx.n_vocab)
    if step > len(draft):
        return accept_greedy(block.argmax(axis=1).tolist().__getitem__, draft, is_eog)
    if step == 1:  # verify.greedy inlined, a row at a time: no slice, list or closure per row
        ids: list[int] = []
        n = len(draft)
        for i in range(n + 1):
            tok = int(block[i].argmax())
            ids.append(tok)
            if i == n or tok != draft[i] or is_eog(tok):
                break
        return ids
    top: list[int] = []

    def argmax_at(i: int) -> int:
        while i >= len(top):
            top.extend(block[len(top):len(top) + step].argmax(axis=1).tolist())
        return top[i]

    return accept_greedy(argmax_at, draft, is_eog)


class Engine:
    """A target plus an optional drafter; `generate()` yields the target's tokens (greedy by
    default; sampled, with the same distribution as plain sampling, given `SamplingParams`).

    draft_max: a fixed draft length, or "auto": each round's length is chosen from costs
    measured on this machine and acceptance measured on this text (tuning.py); the choice of
    length never changes the output, only the speed.

    deterministic: auto lengths that depend only on the generation's tokens (and seed), never
    on timing or on a profile on disk (`tuning.prior_costs`, docs/loop.md §2.4). A generation
    given a sampling seed gets them too: on quantised targets the lengths decide the verify
    batches' widths, and those move logits (§6.4), so timed lengths would part two runs with
    one seed."""

    def __init__(self, target, drafter=None, draft_max: int | str = 8, deterministic: bool = False):
        self.target, self.drafter = target, drafter
        self.lengths = self.profile = None
        self.health = DraftHealth.watch(drafter)  # says so when a draft file accepts next to nothing
        if not isinstance(deterministic, bool):
            raise UserError(f"deterministic must be True or False (got {deterministic!r})", param="deterministic")
        self.deterministic = deterministic
        self._prior = 0.6
        if draft_max == AUTO:
            from .profiling import ProfileStore
            from .tuning import LengthController

            self.draft_max = AUTO_MAX if drafter is None else drafter.max_length
            self._fit_verify_width(auto=True)
            spec = None if drafter is None else drafter.profile_id
            self.profile = ProfileStore(target.info.path, spec, target.n_threads, target.n_gpu_layers,
                                        drafter is not None and drafter.block,
                                        reads_features=drafter is not None and drafter.reads_hidden,
                                        rpc_servers=target.rpc_servers,
                                        kernels=getattr(target, "kernels", None),
                                        seed_kernels=getattr(target, "seed_kernels", getattr(target, "kernels", None)))
            # prior acceptance: an n-gram continuation found in the text is usually right
            self._prior = 0.7 if drafter is not None and drafter.kind == "ngram" else 0.6
            self.lengths = LengthController(self.draft_max, prior=self._prior)
            if drafter is not None:
                # how far the drafter's confidence can be trusted, as earlier runs measured it
                if drafter.lookup:
                    self.lengths.calibration = self.profile.load_calibration(self.lengths.calibration)
                else:
                    self.lengths.draft_calibration = self.profile.load_calibration(self.lengths.draft_calibration)
        else:
            if not isinstance(draft_max, int) or draft_max < 1:
                raise UserError(f"draft_max must be 'auto' or a whole number >= 1 (got {draft_max!r})",
                                param="draft_max")
            self.draft_max = draft_max
            self._fit_verify_width(auto=False)

    def _fit_verify_width(self, auto: bool) -> None:
        """The batch-invariant mode: no verify batch wider than the target's measured invariant
        width (Target.verify_width), so that every round computes one-token decoding's logits."""
        width = getattr(self.target, "verify_width", None)
        if width is None or self.drafter is None:
            return
        if width < 2:
            raise UserError("batch-invariant mode: on this target a verify batch of 2 rows already gives other "
                            "logits than one-token decoding (its matrices take a kernel the mode cannot switch "
                            "off, e.g. F32/F16 weights through llamafile's sgemm; docs/machines.md), so no draft "
                            "can be verified losslessly: drop the draft or the mode", param="batch_invariant")
        if auto:
            self.draft_max = min(self.draft_max, width - 1)
        elif self.draft_max > width - 1:
            raise UserError(f"draft_max {self.draft_max} needs verify batches of {self.draft_max + 1} rows, but on "
                            f"this target batches are batch-invariant up to {width} rows: use at most "
                            f"{width - 1}, or auto", param="draft_max")

    def generate(self, prompt_tokens: list[int], max_tokens: int = 256,
                 sampling: SamplingParams | None = None, cancelled=None, grammar: str | None = None,
                 **hooks) -> "Generation":
        """grammar: GBNF text the output must follow (constraints.py), or None. hooks:
        Generation's on_verified, draft_limit, trace and prediction."""
        n_ctx = self.target.n_ctx
        if not prompt_tokens:
            raise UserError("the prompt is empty: give some text", param="prompt")
        if len(prompt_tokens) + 1 > n_ctx:
            raise UserError(f"the prompt has {len(prompt_tokens)} tokens but the context holds {n_ctx}: "
                            "shorten the prompt or raise n_ctx", param="n_ctx")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise UserError(f"max_tokens must be a whole number >= 0 (got {max_tokens!r})", param="max_tokens")
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, not {type(sampling).__name__}")
        return Generation(self, list(prompt_tokens), int(max_tokens), sampling, cancelled, grammar, **hooks)

    def generate_on(self, engines, pool, prompt_tokens, max_tokens=256, sampling=None, cancelled=None,
                    grammar=None, **hooks) -> "Generation":
        """generate(), on whichever engine of `engines` (one per slot of `pool`, all built like
        this one) has the best free slot when the generation starts (decoding/slots.py)."""
        gen = self.generate(prompt_tokens, max_tokens, sampling, cancelled, grammar, **hooks)
        gen.slots = (pool, engines)
        return gen

    def fixed_lengths(self):
        """A fresh LengthController on `tuning.prior_costs`, with fresh calibrations: what it
        chooses depends on this generation's tokens only (nothing timed, nothing read from or
        written to the profile, nothing carried from an earlier generation)."""
        from .tuning import LengthController, prior_costs

        drafter = self.drafter
        step = 0.0 if drafter is None else draft_weight(self.target, drafter)
        return LengthController(self.draft_max, prior_costs(step, drafter is not None and drafter.block),
                                prior=self._prior)


def draft_weight(target, drafter) -> float:
    """A draft model's pass in units of the target's: the ratio of their file sizes (a CPU pass
    reads every weight once), at least 1%. Lookup drafters (no file): 0."""
    import os

    path = drafter.model_path
    if path is None:
        return 0.0
    try:
        return max(os.path.getsize(path) / os.path.getsize(target.info.path), 0.01)
    except OSError:
        return 0.0


class Generation:
    """One generation: iterate it for tokens; `stats` and `finish_reason` fill in as it runs.

    finish_reason: "stop" (end-of-generation token, or a stop string found by the caller),
    "length" (max_tokens reached), "context" (the context window is full), "cancelled"
    (`cancelled()` said yes: it is asked between prefill chunks and before every round, from
    the thread that iterates, so another thread can stop a long prompt).

    The target's context is held from the first token asked for until the generation ends or
    is closed (`Target.acquire`): one generation at a time per model.
    """

    def __init__(self, engine: Engine, prompt: list[int], max_tokens: int, sampling: SamplingParams | None = None,
                 cancelled=None, grammar: str | None = None, on_verified=None, draft_limit=None, trace=None,
                 prediction=None):
        self.engine, self.prompt, self.max_tokens = engine, prompt, max_tokens
        # Predicted Outputs: prediction(drafter, verify_width) -> the drafter this generation runs,
        # the request's prediction in front of the engine's drafter (drafters/prediction.py, built
        # above this layer); None: no prediction
        self.prediction = prediction
        self.grammar, self.constraint = grammar, None  # the constraint is built when the run starts
        self.cancelled = cancelled or (lambda: False)
        # None: plain greedy, the hot path that touches no probability vector at all
        plain = sampling is None or (sampling.greedy and not sampling.penalized and not sampling.logit_bias)
        self.sampler = None if plain else Sampler(sampling)
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self._seeded = sampling is not None and sampling.seed is not None
        self._bind(engine)
        # (pool, engines): the engine is chosen among these, one per slot, when the run starts
        self.slots = None
        if self.sampler is not None and not sampling.greedy:
            self.stats.seed = self.sampler.seed  # drawn when none was given: repeat the run with it
        self.finish_reason: str | None = None
        self.tokens: list[int] = []
        # the tokens every cache holds, consistently (None in the middle of a change)
        self._synced: list[int] | None = None
        # the hooks, given when the generation is built:
        # on_verified(ctx, ids): called once a round with the committed ids; row i of the target's
        # logits is the one ids[i] was chosen from (logprobs.py reads them there)
        self.on_verified = on_verified
        # draft_limit(draft) -> how many of the draft's tokens can still be output (a stop
        # string ends the generation: textstream.StopStrings.useful_draft); None: all
        self.draft_limit = draft_limit
        # a trace.RoundTrace: per-phase Python time of every round (scripts/gpu_check.py --trace)
        self.trace = trace
        self._it = self._run()

    def _bind(self, engine: Engine) -> None:
        """Run on `engine`: its drafter, and its length chooser (deterministic when asked for
        or when a seed is given: Engine's doc)."""
        self.engine = engine
        # the loop's drafter: the engine's, behind the request's prediction when there is one
        self.drafter = engine.drafter
        if self.prediction is not None:
            self.drafter = self.prediction(engine.drafter, getattr(engine.target, "verify_width", None))
            self.stats.prediction = {"tokens": len(self.drafter.tokens), "rounds": 0, "drafted": 0, "accepted": 0}
        self._drafter_samples = self.sampler is not None and self.drafter is not None and self.drafter.samples
        self.lengths = engine.lengths
        if self.lengths is not None and (engine.deterministic or self._seeded):
            self.lengths = engine.fixed_lengths()
        self.stats.lengths = ("none" if self.drafter is None else "fixed" if engine.lengths is None
                              else "auto" if self.lengths is engine.lengths else "deterministic")
        self.stats.verify_width = getattr(engine.target, "verify_width", None)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._it)

    def close(self, reason: str = "stop") -> None:
        """Stop early (for example at a stop string); the caches are left consistent."""
        if self.finish_reason is None:
            self.finish_reason = reason
        self._it.close()

    def _prefill(self) -> bool:
        """Put the prompt minus its last token into the caches, reading only what the last
        generation (or a saved state) did not leave there; False: cancelled."""
        target, drafter, prompt = self.engine.target, self.drafter, self.prompt
        ctx, batch = target.ctx, target.batch
        t0 = time.perf_counter()
        body = prompt[:-1]
        n_cached = PromptCache.of(target).reuse(body, self.engine.drafter)  # the state is the engine's drafter's
        self.stats.cached_tokens = n_cached
        self._synced = body[:n_cached]
        for start in range(n_cached, len(body), ctx.n_batch):
            if self.cancelled():
                return False
            chunk = body[start:start + ctx.n_batch]
            batch.clear().add_tokens(chunk, start, "none")
            self._synced = None  # until the chunk is in every cache
            ctx.decode(batch)
            if drafter is not None:
                drafter.process(chunk, start)
            ctx.outputs_read()  # a shared pass's layer inputs are read: the next may overwrite them
            self._synced = body[:start + len(chunk)]
        if len(body) > n_cached:
            PromptCache.of(target).checkpoint(body)  # a recurrent state: the next prompt may go on from here
        if drafter is not None:
            drafter.begin(body)
        self.stats.prefill_s = time.perf_counter() - t0
        return True

    def _draft(self, history, id_last: int, pos0: int, n_max: int):
        """(draft tokens, their q vectors or None = point masses), cut to this round's cap."""
        drafter, sampler = self.drafter, self.sampler
        if not self._drafter_samples:
            return drafter.draft(history, id_last, pos0, n_max)[:n_max], None
        draft = drafter.draft(history, id_last, pos0, n_max, sampler=sampler)[:n_max]
        qs = drafter.last_q
        if qs is not None:
            if len(qs) < len(draft):
                raise RuntimeError(f"{drafter.kind} drafter gave {len(qs)} q vectors for {len(draft)} tokens")
            qs = qs[:len(draft)]
        return draft, qs

    def _constrain(self, draft: list[int], qs):
        """Drop drafts from the first one the grammar forbids: they could never be accepted."""
        kept = self.constraint.cut(draft)
        return kept, (qs[:len(kept)] if qs is not None else None)

    def _verify(self, history, id_last: int, draft: list[int], qs) -> list[int]:
        """Sampled, penalised or grammar-constrained acceptance over the target's logits of this
        round; with a grammar, position i is masked by its state after d_1..d_i (constraints.py)."""
        sampler, ctx, is_eog = self.sampler, self.engine.target.ctx, self.engine.target.model.is_eog
        walk = None if self.constraint is None else self.constraint.walk(draft)
        # position i sees the text up to d_i: the window the penalties count over
        recent = sampler.window(history, id_last) if sampler is not None else []
        rule = sampler.params.rule if sampler is not None else "greedy"
        if rule == "greedy" and walk is None:
            return accept_greedy(lambda i: sampler.argmax(ctx.logits(i), recent + draft[:i]), draft, is_eog)
        if rule == "greedy":
            score = ctx.logits if sampler is None else lambda i: sampler.penalize(ctx.logits(i), recent + draft[:i])
            ids = accept_greedy(lambda i: walk.argmax(i, score(i)), draft, is_eog)
        else:
            logits = ctx.logits if walk is None else lambda i: walk.mask(i, ctx.logits(i))
            p_at = lambda i: sampler.dist(logits(i), recent + draft[:i])  # noqa: E731
            # noise is keyed by the absolute position of the token chosen: id_last sits at
            # len(history) (the KV cache holds history), round position i chooses len(history) + 1 + i
            pos = len(history) + 1
            if rule == "ratio":
                ids = accept_ratio(p_at, qs, draft, sampler.noise, pos, is_eog)
            else:  # coupled and exact verify alike (verify.py)
                ids = accept_coupled(p_at, draft, sampler.noise, pos, is_eog)
        if walk is not None:
            walk.finish(ids)
        return ids

    def _run(self) -> Iterator[int]:
        if self.slots is not None:  # parallel sequences: the free slot that holds most of the prompt
            pool, engines = self.slots
            engine = pool.choose(self, engines)
            if engine is None:
                self.finish_reason = "cancelled"
                return
            self._bind(engine)
        target, drafter = self.engine.target, self.engine.drafter
        target.acquire(self)
        try:
            if self.grammar is not None:
                from .grammar import Constraint

                self.constraint = Constraint(target.model, self.grammar)
            yield from self._rounds()
        finally:
            try:
                # what the caches hold for the next generation (None: unknown, start afresh)
                synced = self._synced
                PromptCache.of(target).commit(synced if synced is not None and not target.ctx.closed else None,
                                              drafter)
            finally:
                if self.constraint is not None:
                    self.constraint.close()
                target.release()

    def _rounds(self) -> Iterator[int]:
        engine, stats = self.engine, self.stats
        target, drafter = engine.target, self.drafter
        ctx, batch, model = target.ctx, target.batch, target.model
        lengths = self.lengths
        timed = lengths is not None and lengths is engine.lengths  # costs from the profile, by depth
        if lengths is not None:
            lengths.reset()
        if drafter is not None:
            # the generation's settings: the length chooser in auto mode (None with a fixed
            # length), and lazy catch-up (auto only: fixed lengths keep llama.cpp's eager
            # order, bit for bit)
            drafter.start(lengths, lazy=engine.lengths is not None)
        clock = time.perf_counter
        batch_view = getattr(ctx, "batch_others", None)  # parallel sequences: the rest of the pass
        if lengths is not None:
            lengths.batch = None
        if not self._prefill():
            self.finish_reason = "cancelled"
            return
        history = self.prompt[:-1]  # tokens in the target's KV cache
        self._synced = history
        rollback = Rollback(ctx, batch)
        id_last, pos0 = self.prompt[-1], len(self.prompt) - 1
        tr = self.trace
        if tr is not None:
            tr.start()
        t_start = clock()
        try:
            while True:
                if tr is not None:
                    tr.mark("bookkeeping")  # the last round's yields, this round's checks
                left = self.max_tokens - stats.generated_tokens
                if left <= 0:
                    self.finish_reason = "length"
                    return
                if pos0 >= ctx.n_ctx:
                    self.finish_reason = "context"
                    return
                if self.cancelled():
                    self.finish_reason = "cancelled"
                    return
                # draft: as llama-speculative-simple, cap by the context and the token budget
                t0 = clock()
                self._synced = None  # the round changes the caches until its bookkeeping is done
                conf = None
                if lengths is not None:
                    if timed:
                        lengths.costs = engine.profile.costs_for(pos0)
                    if batch_view is not None:
                        lengths.batch = batch_view()
                    if drafter is None:
                        n_round = 0
                    else:  # a lookup drafter offers all it has, then the prefix that pays is kept
                        n_round = drafter.max_length if drafter.lookup else lengths.next_length()
                        drafter.last_confidence = None
                else:
                    n_round = engine.draft_max if drafter is not None else 0
                n_max = min(n_round, ctx.n_ctx - pos0 - 2, left - 1)
                draft, qs = self._draft(history, id_last, pos0, n_max) if drafter and n_max > 0 else ([], None)
                if self.constraint is not None:
                    draft, qs = self._constrain(draft, qs)
                if draft and self.draft_limit is not None:
                    n_useful = self.draft_limit(draft)
                    draft, qs = draft[:n_useful], (qs[:n_useful] if qs is not None else None)
                own_conf = None  # a sequential drafter's scores of its tokens (it stopped by them)
                if lengths is not None and drafter is not None and drafter.last_confidence is not None:
                    if drafter.lookup:
                        conf = drafter.last_confidence[:len(draft)]
                        n_keep = lengths.cut(conf)
                        draft, conf = draft[:n_keep], conf[:n_keep]
                        qs = qs[:n_keep] if qs is not None else None
                    else:
                        own_conf = drafter.last_confidence[:len(draft)]
                if drafter is not None:
                    drafter.rollback(pos0)
                t1 = clock()
                if tr is not None:
                    tr.mark("draft")
                # verify [id_last, d1..dn] in one target pass, every position with logits
                verify = [id_last, *draft]
                rollback.before_pass(pos0, len(verify))
                batch.clear().add_tokens(verify, pos0, "all")
                if tr is not None:
                    tr.mark("batch")
                ctx.decode(batch)
                if tr is not None:
                    tr.mark("decode")
                if self.sampler is None and self.constraint is None:
                    block = ctx.logits_block(len(verify))
                    if tr is not None:
                        tr.mark("logits")
                    ids = greedy_ids(ctx, draft, model.is_eog, block)
                else:
                    if tr is not None:
                        tr.mark("logits")  # sampled rules read their rows inside _verify
                    ids = self._verify(history, id_last, draft, qs)
                t2 = clock()
                if tr is not None:
                    tr.mark("verify")
                if self.on_verified is not None:
                    self.on_verified(ctx, ids)
                k = len(ids) - 1
                if drafter is not None:
                    # the rows the target kept: cells past them would be rolled back at once (an
                    # eagle3 head's catch-up pass costs about as much per row as the target's)
                    drafter.process(verify[:k + 1], pos0)
                    drafter.accept(k)
                    drafter.rollback(pos0 + k + 1)
                if tr is not None:
                    tr.mark("process")
                # a recurrent state's rollback is the target's work, part of what the width cost:
                # a checkpoint restore and re-decode (past n_rs_seq) prices the widths that need it
                t_back = clock()
                rollback.keep(pos0, verify[:k + 1])
                back_s = clock() - t_back
                if draft and not rollback.trims:
                    stats.rollback = rollback.stats()
                ctx.outputs_read(k + 1)  # a shared context's next pass may overwrite the logits now
                t3 = clock()
                stats.draft_s += (t1 - t0) + (t3 - t2) - back_s
                stats.verify_s += t2 - t1 + back_s
                stats.record_round(len(draft), k, self.prediction is not None and drafter.source == "prediction")
                if engine.health is not None and drafter is not None and drafter.source in (None, "model", "drafter"):
                    engine.health.observe(len(draft), k)  # the draft file's own rounds, not lookups'
                    stats.draft_warning = engine.health.warning
                stats.draft_lengths.append(len(draft) if conf is not None else max(n_max, 0))
                if lengths is not None:
                    # a cold pass (the first this wide: native.Context._process) is not a cost
                    # a shared pass is timed by the pool (its width is everybody's rows), not here
                    lengths.record(max(n_max, 0), len(draft), k, (t1 - t0) + (t3 - t2) - back_s,
                                   None if ctx.cold or batch_view is not None else t2 - t1 + back_s, conf, own_conf)
                history.extend(verify[:k + 1])
                self._synced = history
                id_last, pos0 = ids[-1], pos0 + k + 1
                for tok in ids:
                    if model.is_eog(tok):
                        self.finish_reason = "stop"
                        return
                    stats.generated_tokens += 1
                    self.tokens.append(tok)
                    stats.decode_s = clock() - t_start
                    yield tok
        finally:
            stats.decode_s = clock() - t_start
            if tr is not None:
                tr.stop()
            if self.finish_reason is None:
                self.finish_reason = "stop"
            if engine.profile is not None:
                engine.profile.save()

