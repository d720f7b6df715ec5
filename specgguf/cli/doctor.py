"""`specgguf doctor`: the report to paste into a bug report (specgguf/runtime/doctor.py)."""

from __future__ import annotations

import json

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def doctor(as_json):
    """What this install runs on: versions, llama.cpp's backends and CPU features, devices, the
    AMX check, the Eagle3 patches, cache paths, and a one-line verdict with the next step."""
    from ..runtime import doctor as report

    r = report.report()
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    for line in report.lines(r):
        click.echo(line)
