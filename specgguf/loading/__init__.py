"""The loader: from checked options to what generation needs (as `mlx_lm.utils.load` does).

`load()` resolves Hugging Face ids (the target's, the draft's; a checkpoint repo given as a
draft is converted for the target once, cached), loads the target, builds the drafter from the
`DraftSpec`, the engine, and with n_parallel > 1 the slots (one drafter and engine per slot),
and returns them as one `Loaded`, which frees them in the right order. `SpecGGUF` calls it and
is only the face. `options` checks `SpecGGUF(...)`'s keywords (llama_cpp.Llama's names).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..decoding.engine import Engine
from ..decoding.promptcache import PromptCache, StateCache
from ..drafters import DraftSpec, make_drafter
from ..errors import RequestError
from ..runtime import hub
from ..runtime.target import Target

MAX_PARALLEL = 64  # sequences per context: our bound (each holds n_ctx cells of its own; llama.cpp allows more)


@dataclass
class Loaded:
    """A loaded target and what runs on it. With n_parallel > 1, `pool` holds the slots and
    `engine` / `drafter` are slot 0's."""

    target: Target
    draft: DraftSpec | None  # with its model resolved to a local GGUF
    engine: Engine | None = None
    drafter: object = None
    pool: object = None  # decoding.slots.SlotPool

    @property
    def caches(self) -> list[PromptCache]:
        """The prompt cache of every sequence: the target's, or each slot's."""
        if self.pool is None:
            return [PromptCache.of(self.target)]
        return [PromptCache.of(slot) for slot in self.pool.slots]

    def set_saved_states(self, capacity_bytes: int) -> None:
        """Saved states beyond the live context, up to `capacity_bytes` (0: none); the slots
        share one store, so that a state saved by one loads into any."""
        states = StateCache(capacity_bytes) if capacity_bytes else None
        for cache in self.caches:
            cache.states = states

    def close(self) -> None:
        """Free the drafters, then the target (a draft context may point at the target's).
        Safe to call twice, and on a load that stopped halfway."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()  # waits for the running generations
            for engine in pool.engines:
                if engine.drafter is not None and engine.drafter is not self.drafter:
                    engine.drafter.close()
        drafter, self.drafter = self.drafter, None
        if drafter is not None:
            drafter.close()
        target, self.target = self.target, None
        if target is not None:
            target.close()


def load(target, draft: DraftSpec | None = None, *, draft_max: int | str = "auto", n_ctx: int | None = None,
         n_threads: int | None = None, n_threads_batch: int | None = None, n_gpu_layers: int = 0,
         n_batch: int = 512, rpc_servers=None, flash_attn: bool | None = False, batch_invariant: bool = False,
         n_parallel: int = 1, draft_p_min: float = 0.0, deterministic: bool = False,
         cache_dir=None) -> Loaded:
    """Build target, drafter, engine (and slots) from options the caller has checked
    (loading.options). `target`: a path or Hub id (None: the embedded Gemma 3 270M). Raises
    UserError for what cannot be loaded; nothing stays allocated when it does."""
    if n_parallel > MAX_PARALLEL:
        raise RequestError(f"n_parallel must be at most {MAX_PARALLEL} (got {n_parallel})", param="n_parallel")
    if n_parallel > 1 and batch_invariant:
        raise RequestError("n_parallel > 1 and batch_invariant cannot be combined yet: a batch of several "
                           "sequences is not measured invariant; use one of them", param="n_parallel")
    if target is None:
        from ..runtime.defaults import default_target

        target = default_target()
    target = hub.resolve(target, what="target", cache_dir=cache_dir)
    loaded = Loaded(Target(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                           rpc_servers=rpc_servers, flash_attn=flash_attn, batch_invariant=batch_invariant,
                           n_parallel=n_parallel, n_rs_seq=snapshots_for(draft, draft_max),
                           load_mtp=draft is not None and draft.own_mtp), None)
    try:
        if n_threads_batch is not None:
            loaded.target.ctx.set_threads(loaded.target.n_threads, n_threads_batch)
        loaded.draft = resolve_draft(draft, target, cache_dir=cache_dir)
        build = dict(draft_max=draft_max, n_threads=n_threads, p_min=draft_p_min, deterministic=deterministic)
        if n_parallel > 1:
            loaded.pool = _slot_pool(loaded.target, loaded.draft, **build)
            loaded.engine = loaded.pool.engines[0]
            loaded.drafter = loaded.engine.drafter
        else:
            if loaded.draft is not None:
                loaded.drafter = make_drafter(loaded.draft, loaded.target, draft_max=draft_max, n_threads=n_threads,
                                              p_min=draft_p_min)  # block drafts need the length
            loaded.engine = Engine(loaded.target, loaded.drafter, draft_max, deterministic=deterministic)
    except BaseException:
        loaded.close()
        raise
    return loaded


# the most recurrent-state snapshots a target keeps: each is one more copy of its recurrent state
# (for a gated-DeltaNet hybrid of a few billion parameters, tens of MB), and a longer rejected tail
# is taken back from a checkpoint instead (decoding/rollback.py)
MAX_SNAPSHOTS = 16


def snapshots_for(draft: DraftSpec | None, draft_max) -> int:
    """n_rs_seq for a target drafted by `draft`: enough snapshots to take back the longest
    fixed draft, MAX_SNAPSHOTS in auto mode (0 without a drafter: a prediction's rare rounds
    use checkpoints)."""
    if draft is None:
        return 0
    return MAX_SNAPSHOTS if draft_max == "auto" else max(0, min(int(draft_max), MAX_SNAPSHOTS))


def resolve_draft(draft: DraftSpec | None, target_path, cache_dir=None) -> DraftSpec | None:
    """The spec with its model part as a local GGUF: a Hub id fetched, a checkpoint repo
    converted for the target once (converters/hubdraft.py), a path as it is."""
    if draft is None or draft.model is None:
        return draft
    from ..converters.hubdraft import resolve_draft as resolve_model

    return draft.with_model(resolve_model(draft.model, target_path, cache_dir=cache_dir))


def _slot_pool(target: Target, draft: DraftSpec | None, draft_max, n_threads, p_min, deterministic):
    """n_parallel slots, each with its own drafter and engine; a draft model is loaded once for
    all of them (drafters.open_shared_draft)."""
    from ..decoding.slots import SlotPool
    from ..drafters import open_shared_draft

    shared = []  # a draft model's SharedDraft: one model and context for all the slots

    def make_engine(slot):
        if draft is None:
            return Engine(slot, None, draft_max, deterministic=deterministic)
        if not shared:
            shared.append(open_shared_draft(draft, slot, n_threads=n_threads))
        drafter = make_drafter(draft, slot, draft_max=draft_max, n_threads=n_threads, p_min=p_min,
                               shared_draft=shared[0])
        return Engine(slot, drafter, draft_max, deterministic=deterministic)

    return SlotPool(target, make_engine)


def model_name(loaded: Loaded) -> str:
    """The name responses carry for the model: the target file's stem."""
    return Path(str(loaded.target.info.path)).stem
