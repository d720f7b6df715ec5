"""The registries of draft checkpoints: DeepSpec's releases (models/deepspec.json, which
`convert` checks a repo id against before downloading) and drafters others report
(models/community.json, listed by `specgguf models`, never trusted for a conversion).

The repository's top-level models/ folder is installed as the data package specgguf.models
(see pyproject.toml), so the file is found the same way in editable and regular installs.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

REGISTRY = "deepspec.json"
COMMUNITY = "community.json"


def _registry_file(name: str = REGISTRY) -> Path:
    """specgguf.models is a data-only namespace package; its __path__ lists real folders
    (plus, in editable installs, a path-hook entry that importlib.resources trips over)."""
    import specgguf.models as pkg

    for folder in pkg.__path__:
        candidate = Path(folder) / name
        if candidate.is_file():
            return candidate
    raise OSError(f"{name} not found")


@lru_cache(maxsize=2)
def _load(name: str) -> tuple[dict, ...]:
    try:
        data = json.loads(_registry_file(name).read_text(encoding="utf-8"))
    except (OSError, ValueError, ImportError):
        return ()  # a broken install: conversions of local checkpoints still work
    return tuple(data.get("checkpoints", ()))


def entries() -> tuple[dict, ...]:
    """DeepSpec's released checkpoints."""
    return _load(REGISTRY)


def community() -> tuple[dict, ...]:
    """Drafters others report (repo, kind, target, layout, status, what this release runs)."""
    return _load(COMMUNITY)


def find(repo_id: str) -> dict | None:
    """The registry entry of a repo id (case-insensitive), or None."""
    key = repo_id.strip().rstrip("/").lower()
    return next((e for e in entries() if e["repo"].lower() == key), None)
