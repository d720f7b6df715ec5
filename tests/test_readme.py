"""The README's promises that a test can keep: its test command is what CI runs, and its
Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^python3 -m venv .*$", _readme(), flags=re.M)
    assert len(commands) == 2, "the README's set-up is exactly two commands"
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_python_example_runs(gemma_path):
    block = re.search(r"### From Python\n\n```python\n(.*?)```", _readme(), flags=re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["result"].finish_reason in ("stop", "length")
    assert scope["result"].text
