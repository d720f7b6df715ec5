"""Where specgguf keeps what it makes: one user cache (models assembled from packages,
profiles, probe verdicts, converted drafts)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir(create: bool = True) -> Path:
    """$SPECGGUF_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/specgguf."""
    root = os.environ.get("SPECGGUF_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "specgguf")
    path = Path(root)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def read_json(path: Path) -> dict:
    """A cache file's JSON object; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    """Best effort, atomic (a reader never sees half a file): a read-only home only costs the
    work the cache would have saved."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
