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


RATES = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)  # per-token acceptance rates the predictions are shown for


def cost_curve(costs: Costs) -> list[dict]:
    """The verify and draft cost of a round by draft length n = 0..the widest measured, in
    seconds, and whether n was measured or interpolated (`specgguf profile`'s table)."""
    n_max = max(costs.verify, default=0)
    v0 = costs.verify_cost(0)
    rows = []
    for n in range(0, n_max + 1):
        v, d = costs.verify_cost(n), costs.draft_cost(n)
        if v is None or d is None:
            continue
        rows.append({"n": n, "verify_s": v, "draft_s": d, "x_plain": (v + d) / v0 if v0 else None,
                     "measured": n in costs.verify})
    return rows


def predicted_speedups(costs: Costs, rates=RATES) -> list[dict]:
    """For each per-token acceptance rate, the draft length with the best expected tokens per
    second and its speedup over plain decoding (1.0 with n = 0: plain decoding is faster)."""
    from .tuning import expected_tokens

    n_max = max(costs.verify, default=0)
    v0 = costs.verify_cost(0)
    if v0 is None:
        return []  # nothing measured yet
    out = []
    for a in rates:
        best_n, best = 0, 1.0
        for n in range(1, n_max + 1):
            gain = expected_tokens([a] * n, n) * v0 / (costs.verify_cost(n) + costs.draft_cost(n))
            if gain > best:
                best_n, best = n, gain
        out.append({"acceptance": a, "n": best_n, "speedup": best})
    return out


def report(store) -> dict:
    """What a cost profile (an engine's ProfileStore; None with a fixed draft length) knows at
    the shallowest depth: `curve` (cost_curve) and `predicted` (predicted_speedups), as
    `specgguf profile` prints them; both empty before anything is measured."""
    costs = store.costs_for(0) if store is not None else None
    if costs is None:
        return {"curve": [], "predicted": []}
    return {"curve": cost_curve(costs), "predicted": predicted_speedups(costs)}
