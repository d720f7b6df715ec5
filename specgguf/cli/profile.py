"""`specgguf profile`: the measured cost curve of a target/draft pair on this machine, and the
speedup it predicts by acceptance rate, so that users see why speculation does or does not
pay here. The measurement also seeds `--draft-max auto` (it lands in the profile cache)."""

from __future__ import annotations

import click

from ..decoding.tuning import expected_tokens
from .options import DEMO_PROMPT, model_options, open_model

RATES = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@click.command("profile")
@model_options
@click.option("--tokens", type=int, default=48, show_default=True, help="Tokens per measurement run.")
def profile(tokens, **opts):
    """Measure what drafting costs on this machine and predict the speedup by acceptance rate."""
    opts["draft_max"] = "8"
    with open_model(**opts) as llm:
        costs = llm.measure_costs(llm.tokenize(DEMO_PROMPT), tokens=tokens)
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
