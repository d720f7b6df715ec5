"""`specgguf profile`'s measurement: the real loop run at fixed draft lengths and plainly, timed
as `auto` times it, written into the cost profile (profiling.py) that auto lengths start from."""

from __future__ import annotations

from .engine import Engine
from .profiling import ProfileStore
from .tuning import Costs


def measure_costs(target, drafter, prompt_tokens: list[int], lengths=(1, 2, 3, 4, 6, 8), tokens: int = 48,
                  repeats: int = 2) -> Costs:
    """Run the real loop at fixed draft lengths (and plainly) on `prompt_tokens`; return the
    measured `tuning.Costs`, which also land in the profile cache that `auto` starts from
    (`specgguf profile`)."""
    spec = None if drafter is None else drafter.profile_id
    store = ProfileStore(target.info.path, spec, target.n_threads, target.n_gpu_layers,
                         drafter is not None and drafter.block, rpc_servers=target.rpc_servers,
                         kernels=target.kernels)
    costs = store.costs_for(0)
    costs.verify.clear()
    costs.draft_round = costs.draft_step = None
    costs.smoothing = 0.5
    runs = [(None, 1)] + [(drafter, n) for n in lengths if drafter is not None]
    for _ in range(repeats):
        for d, n in runs:
            gen = Engine(target, d, n).generate(prompt_tokens, tokens)
            for _tok in gen:
                pass
            # per round: the engine's own timings, as `auto` sees them
            rounds = gen.stats.rounds_detail
            if not rounds:
                continue
            width = round(sum(r[0] for r in rounds) / len(rounds))
            costs.observe_verify(width, gen.stats.verify_s / len(rounds))
            if d is not None:
                costs.observe_draft(max(width, 1), gen.stats.draft_s / len(rounds))
    store.save()
    return costs
