"""`specgguf profile`: the measured cost curve of a target/draft pair on this machine, and the
speedup it predicts by acceptance rate, so that users see why speculation does or does not
pay here. The measurement also seeds `--draft-max auto` (it lands in the profile cache)."""

from __future__ import annotations

import click

from .cli import DEMO_PROMPT, _model_options, _open
from .engine import Engine
from .profiling import ProfileStore
from .tuning import expected_tokens

LENGTHS = (1, 2, 3, 4, 6, 8)
RATES = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def measure(llm, lengths=LENGTHS, tokens: int = 48, repeats: int = 2):
    """Run the real loop at fixed lengths (and plainly) on a copy-heavy prompt; return Costs."""
    target, drafter = llm.target, llm.drafter
    block = getattr(drafter, "kind", "") in ("dflash", "dspark")
    info = getattr(drafter, "info", None)
    spec = None if drafter is None else (str(info.path) if info is not None else drafter.kind)
    store = ProfileStore(target.info.path, spec, target.n_threads, target.n_gpu_layers, block)
    costs = store.costs_for(0)
    costs.verify.clear()
    costs.draft_round = costs.draft_step = None
    costs.smoothing = 0.5
    prompt = target.tokenize(DEMO_PROMPT)
    runs = [(None, 1)] + [(drafter, n) for n in lengths if drafter is not None]
    for _ in range(repeats):
        for d, n in runs:
            gen = Engine(target, d, n).generate(prompt, tokens)
            for _tok in gen:
                pass
            # per round: the engine's own timings, as `auto` sees them
            rounds = gen.stats.rounds_detail
            if not rounds:
                continue
            per_round_verify = gen.stats.verify_s / len(rounds)
            per_round_draft = gen.stats.draft_s / len(rounds)
            width = round(sum(r[0] for r in rounds) / len(rounds))
            costs.observe_verify(width, per_round_verify)
            if d is not None:
                costs.observe_draft(max(width, 1), per_round_draft)
    store.save()
    return costs


@click.command("profile")
@_model_options
@click.option("--tokens", type=int, default=48, show_default=True, help="Tokens per measurement run.")
def profile(tokens, **opts):
    """Measure what drafting costs on this machine and predict the speedup by acceptance rate."""
    opts["draft_max"] = "8"
    with _open(**opts) as llm:
        costs = measure(llm, tokens=tokens)
        n_max = max(costs.verify)
        click.echo(f"target {llm.target.info.name}; draft "
                   f"{llm.drafter.describe() if llm.drafter else 'none'}; {llm.target.n_threads} threads, "
                   f"{llm.target.n_gpu_layers} GPU layers")
        v0 = costs.verify_cost(0)
        click.echo(f"{'n':>3} {'verify ms':>10} {'draft ms':>9} {'round ms':>9} {'x plain pass':>12}")
        for n in range(0, n_max + 1):
            v, d = costs.verify_cost(n), costs.draft_cost(n)
            mark = "" if n in costs.verify else "  (interpolated)"
            click.echo(f"{n:>3} {1e3 * v:10.2f} {1e3 * d:9.2f} {1e3 * (v + d):9.2f} {(v + d) / v0:12.2f}{mark}")
        click.echo("predicted speedup over plain decoding, best n, by per-token acceptance rate:")
        for a in RATES:
            best_n, best = 0, 1.0
            for n in range(1, n_max + 1):
                gain = expected_tokens([a] * n, n) * v0 / (costs.verify_cost(n) + costs.draft_cost(n))
                if gain > best:
                    best_n, best = n, gain
            verdict = "drafting pays" if best_n else "plain decoding is faster"
            click.echo(f"  acceptance {a:.2f}: {best:.2f}x with n = {best_n} ({verdict})")
