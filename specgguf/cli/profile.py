"""`specgguf profile`: the measured cost curve of a target/draft pair on this machine, and the
speedup it predicts by acceptance rate, so that users see why speculation does or does not
pay here. The measurement also seeds `--draft-max auto` (it lands in the profile cache)."""

from __future__ import annotations

import click

from ..decoding.measure import cost_curve, predicted_speedups
from .options import DEMO_PROMPT, model_options, open_model


@click.command("profile")
@model_options
@click.option("--tokens", type=int, default=48, show_default=True, help="Tokens per measurement run.")
def profile(tokens, **opts):
    """Measure what drafting costs on this machine and predict the speedup by acceptance rate."""
    opts["draft_max"] = "8"
    with open_model(**opts) as llm:
        costs = llm.measure_costs(llm.tokenize(DEMO_PROMPT), tokens=tokens)
        click.echo(f"target {llm.target.info.name}; draft "
                   f"{llm.drafter.describe() if llm.drafter else 'none'}; {llm.target.n_threads} threads, "
                   f"{llm.target.n_gpu_layers} GPU layers")
        click.echo(f"{'n':>3} {'verify ms':>10} {'draft ms':>9} {'round ms':>9} {'x plain pass':>12}")
        for row in cost_curve(costs):
            v, d = row["verify_s"], row["draft_s"]
            mark = "" if row["measured"] else "  (interpolated)"
            click.echo(f"{row['n']:>3} {1e3 * v:10.2f} {1e3 * d:9.2f} {1e3 * (v + d):9.2f} {row['x_plain']:12.2f}{mark}")
        click.echo("predicted speedup over plain decoding, best n, by per-token acceptance rate:")
        for p in predicted_speedups(costs):
            verdict = "drafting pays" if p["n"] else "plain decoding is faster"
            click.echo(f"  acceptance {p['acceptance']:.2f}: {p['speedup']:.2f}x with n = {p['n']} ({verdict})")
