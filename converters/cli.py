"""click commands `convert` and `models`; the `specgguf` group adds them.

Bad input is raised as `UserError`; the group prints it as one line and exits 2. SIGINT,
SIGTERM and SIGHUP during a conversion end it with one line and exit 128 + the signal number
(130, 143, 129) after the partial output files are removed (the writer removes them while the
exception unwinds).
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from contextlib import contextmanager

import click

from specgguf.errors import UserError

from . import registry
from .writer import OUT_TYPES


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class _Signalled(BaseException):
    """SIGINT or SIGTERM arrived: unwinds like KeyboardInterrupt, so every cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_unwind():
    """Turn SIGINT, SIGTERM and SIGHUP into `_Signalled` (the last two would otherwise kill the
    process without cleanup); a second signal during the cleanup is ignored so that it completes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())

    def handler(signum, frame):
        for s in sigs:
            signal.signal(s, signal.SIG_IGN)
        raise _Signalled(signum)

    old = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# Python argument of convert() -> the flag that sets it: the API's errors name the argument.
FLAGS = {"out_type": "--type", "head": "--head", "out": "-o", "target": "--target"}


def _flag_message(exc: UserError) -> str:
    message, param = str(exc), getattr(exc, "param", None)
    if param in FLAGS:
        message = re.sub(rf"(?<![\w-])'?{re.escape(param)}'?(?!\w)", FLAGS[param], message)
    return message


@click.command("convert")
@click.argument("checkpoint")
@click.option("--target", "target", required=True, type=click.Path(dir_okay=False),
              help="The target model's GGUF: its tokenizer is copied and the draft is checked against it.")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Output file (default: <checkpoint>-<type>.gguf in the current directory).")
@click.option("--type", "out_type", type=click.Choice(OUT_TYPES, case_sensitive=False), default="f16",
              show_default=True, help="Weight type of the draft; 1-D tensors always stay F32.")
@click.option("--head", type=click.Choice(["shared", "own"]), default="shared", show_default=True,
              help="shared: borrow the target's embeddings and output head at run time (smaller file); "
                   "own: write both into the draft.")
@click.option("--offline", is_flag=True, help="Use only the Hugging Face cache, never the network.")
def convert_command(checkpoint, target, output, out_type, head, offline):
    """Convert a draft CHECKPOINT (directory or HF repo id) to a GGUF draft for TARGET.

    Handles DeepSpec DFlash and DSpark checkpoints (Qwen3, Gemma 4) and standard EAGLE-3
    exports. Example:

        specgguf convert deepseek-ai/dspark_qwen3_8b_block7 --target Qwen3-8B-Q4_K_M.gguf
    """
    from .convert import convert

    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=max(total, 1), label="writing", file=click.get_text_stream("stderr"))
            bar.__enter__()
        bar.update(done - bar.pos)

    def warn(text: str) -> None:
        click.echo(f"warning: {text}", err=True)

    signalled = None
    try:
        with _signals_unwind():
            result = convert(checkpoint, target, output, out_type.lower(), head, progress=progress,
                             warn=warn, offline=offline)
    except _Signalled as sig:
        signalled = sig.signum
    except UserError as exc:
        if getattr(exc, "param", None) not in FLAGS:
            raise
        raise UserError(_flag_message(exc)) from None
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
            if signalled is not None or getattr(bar, "hidden", getattr(bar, "is_hidden", False)):
                click.echo("", err=True)  # end the bar's line (or the bare label off a terminal)
    if signalled is not None:
        name = signal.Signals(signalled).name
        click.echo(f"error: interrupted by {name}; partial files removed, any older output left as it was",
                   err=True)
        sys.exit(128 + signalled)
    s = result.summary
    extra = []
    if s.get("markov_rank"):
        extra.append(f"Markov head rank {s['markov_rank']}")
    if s.get("confidence_head"):
        extra.append("confidence head")
    if s.get("draft_vocab"):
        extra.append(f"draft vocabulary {s['draft_vocab']}")
    types = ", ".join(f"{k} {v}" for k, v in sorted(result.types.items()))
    click.echo(f"wrote {result.path}")
    if s.get("selector"):
        extra.append(f"top-{s['selector']['top_k']} selector rank {s['selector']['rank']}")
    if s.get("layout"):
        extra.append(f"{s['layout']} layout")
    click.echo(f"  kind           {result.kind} ({result.backbone})" + (f", {', '.join(extra)}" if extra else ""))
    layers = f"{result.target_layers}"
    if s.get("deepspec_layers") is not None:
        who = "checkpoint" if s.get("layout") else "DeepSpec"
        layers += f" ({who} ids {s['deepspec_layers']} + 1)"
    click.echo(f"  target layers  {layers}")
    if result.block_size:
        drafts = result.block_size if s.get("sample_from_anchor", True) else result.block_size - 1
        click.echo(f"  block size     {result.block_size} (drafts up to {drafts} tokens per step)")
    click.echo(f"  tensors        {result.tensors} ({types})")
    own = s.get("head", result.head) == "own"
    head_note = "own token_embd + output" if own else "shared with the target at run time"
    click.echo(f"  head           {head_note}")
    click.echo(f"  size on disk   {_size(result.size_bytes)}")
    if result.cost_ratio is not None:
        click.echo(f"  draft cost     ~{result.cost_ratio:.1%} of a target step (weights read per step)")
    if s.get("runtime"):
        click.echo(f"  runs           {s['runtime']}")


@click.command("models")
def models_command():
    """List the released DeepSpec checkpoints that `specgguf convert` knows, and the drafters
    others report for Qwen3.5/3.6/3.8, Nemotron and LFM2 targets."""
    entries = registry.entries()
    if not entries:
        click.echo("no registry found (models/deepspec.json is missing from this install)")
        return
    width = max(len(e["repo"]) for e in entries)
    click.echo(f"{'checkpoint':<{width}}  {'kind':<7} {'build':<8} {'target':<22} {'layers (gguf)':<22} block")
    for e in entries:
        layers = ",".join(str(i) for i in e["gguf_target_layers"])
        block = str(e["block_size"]) if e.get("block_size") else "-"
        build = e.get("build") or "-"  # stock, or patched (specgguf build-llama --patched)
        click.echo(f"{e['repo']:<{width}}  {e['kind']:<7} {build:<8} {e['target']:<22} {layers:<22} {block}")
        click.echo(f"{'':<{width}}  {e['note']}")
    reported = registry.community()
    if reported:
        click.echo("")
        click.echo("reported by others (not downloaded or checked here; specgguf convert reads these layouts):")
        width = max(len(e["repo"]) for e in reported)
        click.echo(f"{'checkpoint':<{width}}  {'kind':<7} {'target':<18} layout")
        for e in reported:
            click.echo(f"{e['repo']:<{width}}  {e['kind']:<7} {e['target']:<18} {e['layout']}")
            click.echo(f"{'':<{width}}  {e['status']}; runs: {e['runs']}")
