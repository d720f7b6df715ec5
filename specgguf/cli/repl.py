"""The interactive `specgguf chat` loop (streaming answers, a stats line after each)."""

from __future__ import annotations

import click

from ..errors import UserError



def run_repl(llm, system: str | None = None, max_tokens: int = 512, sampling=None) -> None:
    fmt = llm.chat_format
    if fmt.is_fallback:
        click.echo(f"note: {llm.target.info.path.name} has no chat template; using the {fmt.name} "
                   "(a GGUF without one is usually a base model)", err=True)
    drafter = llm.drafter.describe() if llm.drafter else "none (plain decoding)"
    click.echo(f"specgguf chat: target {llm.target.info.name}, draft {drafter}. "
               "Commands: /stats /reset /exit; Ctrl-C stops an answer.", err=True)
    messages = [{"role": "system", "content": system}] if system else []
    base = len(messages)
    last_stats = None
    while True:
        try:
            line = click.prompt(">", prompt_suffix=" ", default="", show_default=False)
        except (EOFError, click.Abort):
            click.echo()
            return
        except UnicodeDecodeError as exc:  # bytes on stdin that are not UTF-8: refuse the line, go on
            click.echo(f"error: that line is not valid UTF-8 (byte {exc.start}); type it again", err=True)
            continue
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            return
        if cmd == "/reset":
            del messages[base:]
            click.echo("(conversation cleared)", err=True)
            continue
        if cmd == "/stats":
            click.echo(last_stats.summary() if last_stats else "(no answer yet)", err=True)
            continue
        messages.append({"role": "user", "content": line})
        try:
            prompt = llm.chat_prompt(messages)
        except UserError as exc:
            messages.pop()
            click.echo(f"error: {exc}", err=True)
            continue
        if len(prompt) + 1 >= llm.target.n_ctx:
            messages.pop()
            click.echo(f"error: the conversation ({len(prompt)} tokens) no longer fits the context "
                       f"({llm.target.n_ctx}); /reset or restart with a larger --ctx", err=True)
            continue
        gen, text = llm.stream_tokens(prompt, max_tokens, list(fmt.stop), sampling)
        try:
            for chunk in text:
                click.echo(chunk, nl=False)
        except KeyboardInterrupt:
            gen.close("interrupted")
            click.echo(" [stopped]", nl=False)
        click.echo()
        messages.append({"role": "assistant", "content": text.text.strip()})
        last_stats = gen.stats
        click.echo(f"[{gen.stats.summary()}]", err=True)
