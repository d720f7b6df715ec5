"""Where specgguf keeps what it makes: one user cache (models assembled from packages,
profiles, probe verdicts, converted drafts)."""

from __future__ import annotations

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
