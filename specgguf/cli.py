"""The `specgguf` command line: generate, chat, inspect (and convert, models)."""

from __future__ import annotations

import json
import sys

import click

from .errors import LlamaError, UserError

DEMO_PROMPT = (
    "Copy the following list exactly, then stop.\n"
    "1. Preheat the oven to 200 degrees.\n2. Mix the flour, the sugar and the butter.\n"
    "3. Add two eggs and stir well.\n4. Pour the batter into a tin.\n5. Bake for thirty minutes.\n\n"
    "Copy:\n1. Preheat the oven to"
)


class _Group(click.Group):
    """Every failure a user can cause ends as one `error:` line on stderr and exit code 2."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
            return sys.exit(rv if isinstance(rv, int) else 0)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            sys.exit(130)
        except click.ClickException as exc:
            _fail(exc.format_message())
        except (UserError, LlamaError) as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(0)


def _fail(message: str) -> None:
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specgguf")
def main():
    """Speculative decoding for GGUF models: same output as the target, fewer target passes."""


# -- shared options ------------------------------------------------------------------------

def _model_options(f):
    options = [
        click.argument("target", required=False),
        click.option("--draft", "-d", help="A draft GGUF (same tokenizer as the target) or 'ngram' "
                                            "(prompt lookup). Omit for plain decoding."),
        click.option("--draft-max", default="auto", show_default=True,
                     help="Tokens drafted per round: a number, or auto (chosen each round from costs "
                          "measured on this machine and the acceptance so far; 0 when drafting does not pay)."),
        click.option("--draft-kind", type=click.Choice(["model", "ngram", "eagle3", "dflash", "dspark"]),
                     default=None, help="Override the kind detected from the draft GGUF (e.g. dspark slot "
                                        "rules for a DFlash file)."),
        click.option("--draft-p-min", type=float, default=0.0, show_default=True,
                     help="Stop drafting at a token whose draft confidence is below this (DSpark: its "
                          "confidence head; others: softmax over the top 10)."),
        click.option("--ctx", "n_ctx", type=int, default=4096, show_default=True, help="Context size in tokens."),
        click.option("--threads", "n_threads", type=int, default=None, help="CPU threads (default: all usable)."),
        click.option("--gpu-layers", "n_gpu_layers", type=int, default=0, show_default=True,
                     help="Layers offloaded to the GPU (CUDA/Metal builds; 99 = all)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's own log."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _parse_draft_max(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise UserError(f"--draft-max must be 'auto' or a whole number >= 1 (got {value!r})") from None
    if n < 1:
        raise UserError(f"--draft-max must be at least 1 (got {n}); omit --draft to decode without a draft")
    return n


def _open(target, draft, draft_max, n_ctx, n_threads, n_gpu_layers, verbose, draft_kind=None, draft_p_min=0.0,
          **_):
    from .api import SpecGGUF

    n = _parse_draft_max(draft_max)
    if n_ctx < 16:
        raise UserError(f"--ctx must be at least 16 tokens (got {n_ctx})")
    if n_threads is not None and n_threads < 1:
        raise UserError(f"--threads must be at least 1 (got {n_threads})")
    if not 0.0 <= draft_p_min <= 1.0:
        raise UserError(f"--draft-p-min must be within [0, 1] (got {draft_p_min})")
    if draft is None and draft_kind not in (None, "ngram"):
        raise UserError(f"--draft-kind {draft_kind} needs a --draft GGUF")
    if draft is None and draft_kind == "ngram":
        draft = "ngram"
    return SpecGGUF(target, draft=draft, draft_max=n, n_ctx=n_ctx, n_threads=n_threads,
                    n_gpu_layers=n_gpu_layers, verbose=verbose, kind=draft_kind, p_min=draft_p_min)


def _sampling_options(f):
    """Sampler settings (specgguf.sampling.SamplingParams); the defaults decode greedily."""
    options = [
        click.option("--temperature", "--temp", "temperature", type=float, default=0.0, show_default=True,
                     help="Sampling temperature; 0 = greedy (the target's own arg-max)."),
        click.option("--top-k", type=int, default=0, show_default=True,
                     help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=1.0, show_default=True,
                     help="Keep the most likely tokens up to this probability mass (1 = off)."),
        click.option("--min-p", type=float, default=0.0, show_default=True,
                     help="Drop tokens below this fraction of the top token's probability (0 = off)."),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True,
                     help="Penalise tokens seen in the last --penalty-last-n tokens (1 = off)."),
        click.option("--presence-penalty", type=float, default=0.0, show_default=True),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True),
        click.option("--penalty-last-n", type=int, default=64, show_default=True,
                     help="Tokens the penalties look back over (-1 = all, 0 = off)."),
        click.option("--seed", type=int, default=None, help="Random seed: the same seed, prompt and settings "
                                                             "give the same output."),
        click.option("--accept", type=click.Choice(["exact", "ratio"]), default=None,
                     help="Acceptance rule when sampling: exact (llama.cpp: sample the target, keep a draft "
                          "token on a match) or ratio (min(1, p/q), residual resampling; the default)."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _sampling(opts: dict):
    """SamplingParams from (and removed from) the command's options; bad values: one line."""
    from .sampling import SamplingParams

    names = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
             "frequency_penalty", "penalty_last_n", "seed")
    values = {n: opts.pop(n) for n in names}
    return SamplingParams(**values, accept=opts.pop("accept") or "auto")


def _stream(llm, tokens, max_tokens, stop, sampling):
    """(generation, text chunks) like SpecGGUF.stream_tokens, with SamplingParams passed to the
    engine as they are."""
    from .textstream import TextStream

    gen = llm.engine.generate(tokens, max_tokens, sampling=sampling)
    return gen, TextStream(gen, llm.target.model, stop)


# -- generate ------------------------------------------------------------------------------

@main.command()
@_model_options
@_sampling_options
@click.option("--prompt", "-p", default=None, help="Prompt text (default: a short demo prompt).")
@click.option("--max-tokens", "-n", type=int, default=128, show_default=True)
@click.option("--stop", multiple=True, help="Stop at this string (repeatable).")
@click.option("--stats/--no-stats", default=True, show_default=True, help="Print statistics on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, finish_reason, stats.")
@click.option("--compare", is_flag=True, help="Also decode plainly and print both runs' speed side by side.")
def generate(prompt, max_tokens, stop, stats, as_json, compare, **opts):
    """Generate a completion of PROMPT with TARGET (default: the embedded Gemma 3 270M)."""
    if max_tokens < 0:
        raise UserError(f"--max-tokens must be >= 0 (got {max_tokens})")
    sampling = _sampling(opts)  # checked before a model is loaded
    prompt = DEMO_PROMPT if prompt is None else prompt
    with _open(**opts) as llm:
        tokens = llm.tokenize(prompt)
        gen, text = _stream(llm, tokens, max_tokens, list(stop), sampling)
        for chunk in text:
            if not as_json:
                click.echo(chunk, nl=False)
        if not as_json:
            click.echo()
        result = {"text": text.text, "tokens": gen.tokens,
                  "finish_reason": gen.finish_reason, "stats": gen.stats.to_dict()}
        plain = None
        if compare:
            llm.engine.drafter, saved = None, llm.engine.drafter
            try:
                plain_gen, plain_text = _stream(llm, tokens, max_tokens, list(stop), sampling)
                "".join(plain_text)
            finally:
                llm.engine.drafter = saved
            plain = {"tokens_per_second": plain_gen.stats.tokens_per_second,
                     "identical": plain_gen.tokens == gen.tokens, "stats": plain_gen.stats.to_dict()}
            result["plain"] = plain
        if as_json:
            click.echo(json.dumps(result))
            return
        if stats or compare:
            label = opts.get("draft") or "plain"
            click.echo(f"[{label}] {gen.stats.summary()}; finish: {gen.finish_reason}", err=True)
        if plain is not None:
            ps = plain_gen.stats
            speed = gen.stats.tokens_per_second / ps.tokens_per_second if ps.tokens_per_second else 0.0
            click.echo(f"[plain] {ps.summary()}", err=True)
            note = {"ratio": " (ratio sampling keeps the distribution, not the tokens)",
                    "exact": "" if sampling.seed is not None else " (give --seed to compare token for token)"}
            click.echo(f"speedup {speed:.2f}x; output identical to plain decoding: "
                       f"{'yes' if plain['identical'] else 'NO'}{note.get(sampling.rule, '')}", err=True)


# -- chat ----------------------------------------------------------------------------------

@main.command()
@_model_options
@_sampling_options
@click.option("--system", default=None, help="A system message.")
@click.option("--max-tokens", "-n", type=int, default=512, show_default=True)
def chat(system, max_tokens, **opts):
    """Chat with TARGET in the terminal: /stats, /reset, /exit; Ctrl-C stops an answer."""
    from .chatrepl import run_repl

    sampling = _sampling(opts)
    with _open(**opts) as llm:
        run_repl(llm, system=system, max_tokens=max_tokens, sampling=sampling)


# -- inspect -------------------------------------------------------------------------------

@main.command()
@click.argument("file")
@click.option("--target", default=None, help="A target GGUF to check FILE against as a draft.")
def inspect(file, target):
    """Describe a GGUF: architecture, sizes, vocabulary, and which draft kinds it can serve."""
    from .inspection import describe

    for line in describe(file, target):
        click.echo(line)


def _register_converters() -> None:
    """`convert` and `models` come from specgguf.converters when it provides them."""
    try:
        from .converters import cli as conv
    except ImportError:
        return
    for name in ("convert_command", "models_command"):
        cmd = getattr(conv, name, None)
        if cmd is not None:
            main.add_command(cmd)


_register_converters()
from .servecli import serve  # noqa: E402  (it reuses this module's options; its HTTP deps load when it runs)
main.add_command(serve)

from .profilecmd import profile  # noqa: E402  (it reuses this module's options)
main.add_command(profile)
