"""The registry of released DeepSpec checkpoints (data in models/deepspec.json).

The data file lives in the repository's top-level models/ folder, one level above this
package's folder; this path works for the editable install that specgguf is used with.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

REGISTRY_PATH = Path(__file__).resolve().parent.parent / "models" / "deepspec.json"


@lru_cache(maxsize=1)
def entries() -> tuple[dict, ...]:
    try:
        data = json.loads(REGISTRY_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()  # a non-editable install without models/: conversions still work
    return tuple(data.get("checkpoints", ()))


def find(repo_id: str) -> dict | None:
    """The registry entry of a repo id (case-insensitive), or None."""
    key = repo_id.strip().rstrip("/").lower()
    return next((e for e in entries() if e["repo"].lower() == key), None)
