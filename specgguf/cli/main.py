"""The `specgguf` command group, and its generate, chat and inspect commands."""

from __future__ import annotations

import json
import sys

import click

from ..request import params
from ..errors import LlamaError, UserError
from .options import DEMO_PROMPT, flag_message, model_options, open_model, sampling_from, sampling_options
from .build import build_llama
from .doctor import doctor
from .profile import profile
from .serve import serve


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
            _fail(flag_message(exc))
        except KeyboardInterrupt:
            sys.exit(130)
        except BrokenPipeError:
            sys.exit(0)


def _fail(message: str) -> None:
    click.echo(f"error: {' '.join(message.split())}", err=True)
    sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specgguf")
@click.option("--amx", type=click.Choice(["auto", "on", "off"]), default=None,
              help="AMX CPUs: auto (probe once whether this llama.cpp build's AMX kernels work here, "
                   "fall back if not), on (trust the build), off (always fall back). Env: SPECGGUF_AMX.")
def main(amx):
    """Speculative decoding for GGUF models: same output as the target, fewer target passes."""
    if amx is not None:  # read by runtime/amx.py before the first model load (and by child processes)
        import os

        os.environ["SPECGGUF_AMX"] = amx


# -- generate ------------------------------------------------------------------------------

@main.command()
@model_options
@sampling_options
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
    sampling = sampling_from(opts)  # checked before a model is loaded
    prompt = DEMO_PROMPT if prompt is None else params.text_value(prompt, "prompt")
    with open_model(**opts) as llm:
        tokens = llm.tokenize(prompt, special=True)
        gen, text = llm.stream_tokens(tokens, max_tokens, list(stop), sampling)
        for chunk in text:
            if not as_json:
                click.echo(chunk, nl=False)
        if not as_json:
            click.echo()
        result = {"text": text.text, "tokens": gen.tokens,
                  "finish_reason": gen.finish_reason, "stats": gen.stats.to_dict()}
        plain = None
        if compare:
            plain_gen, plain_text = llm.stream_tokens(tokens, max_tokens, list(stop), sampling, speculate=False)
            "".join(plain_text)
            plain = {"tokens_per_second": plain_gen.stats.tokens_per_second,
                     "identical": plain_gen.tokens == gen.tokens, "stats": plain_gen.stats.to_dict()}
            result["plain"] = plain
        if as_json:
            click.echo(json.dumps(result))
            return
        if stats or compare:
            label = str(llm.draft_spec) if llm.draft_spec is not None else "plain"
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
@model_options
@sampling_options
@click.option("--system", default=None, help="A system message.")
@click.option("--max-tokens", "-n", type=int, default=512, show_default=True)
def chat(system, max_tokens, **opts):
    """Chat with TARGET (default: the embedded SmolLM2-135M-Instruct) in the terminal: /stats,
    /reset, /exit; Ctrl-C stops an answer."""
    from .repl import run_repl

    sampling = sampling_from(opts)
    with open_model(**opts, chat=True) as llm:
        run_repl(llm, system=system, max_tokens=max_tokens, sampling=sampling)


# -- inspect -------------------------------------------------------------------------------

@main.command()
@click.argument("file")
@click.option("--target", default=None, help="A target GGUF to check FILE against as a draft.")
def inspect(file, target):
    """Describe a GGUF: architecture, sizes, vocabulary, and which draft kinds it can serve."""
    from ..inspection import describe

    for line in describe(file, target):
        click.echo(line)


def _register_converters() -> None:
    """`convert` and `models` come from specgguf.converters when it provides them."""
    try:
        from ..converters import cli as conv
    except ImportError:
        return
    for name in ("convert_command", "models_command"):
        cmd = getattr(conv, name, None)
        if cmd is not None:
            main.add_command(cmd)


_register_converters()
main.add_command(serve)
main.add_command(profile)
main.add_command(build_llama)
main.add_command(doctor)
