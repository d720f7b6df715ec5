"""The registry of released DeepSpec checkpoints (data in models/deepspec.json).

The repository's top-level models/ folder is installed as the data package specgguf.models
(see pyproject.toml), so the file is found the same way in editable and regular installs.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

REGISTRY = "deepspec.json"


def _registry_file() -> Path:
    """specgguf.models is a data-only namespace package; its __path__ lists real folders
    (plus, in editable installs, a path-hook entry that importlib.resources trips over)."""
    import specgguf.models as pkg

    for folder in pkg.__path__:
        candidate = Path(folder) / REGISTRY
        if candidate.is_file():
            return candidate
    raise OSError(f"{REGISTRY} not found")


@lru_cache(maxsize=1)
def entries() -> tuple[dict, ...]:
    try:
        data = json.loads(_registry_file().read_text(encoding="utf-8"))
    except (OSError, ValueError, ImportError):
        return ()  # a broken install: conversions of local checkpoints still work
    return tuple(data.get("checkpoints", ()))


def find(repo_id: str) -> dict | None:
    """The registry entry of a repo id (case-insensitive), or None."""
    key = repo_id.strip().rstrip("/").lower()
    return next((e for e in entries() if e["repo"].lower() == key), None)
