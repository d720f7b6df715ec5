"""Cost profiles: measured per (target, draft, backend, threads, context depth), cached on disk.

A profile is what `tuning.Costs` learned: V(n) by draft length and the draft's own costs.
It is keyed by everything that changes them (the model files' identity, the llama.cpp
library, threads, GPU layers, a depth bucket), so a changed file or setting simply misses
the cache and is measured again, lazily, by the first rounds of a real generation.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .defaults import cache_dir
from .tuning import Costs

PROFILE_VERSION = 1


def depth_bucket(pos: int) -> int:
    """Context depth buckets: 0 (< 512 tokens), then one per doubling (512, 1024, 2048, ...)."""
    return 0 if pos < 512 else (pos // 512).bit_length()


def _file_identity(path) -> list:
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def profile_key(target_path, draft: str | None, n_threads: int, n_gpu_layers: int, bucket: int) -> str:
    from . import native

    parts = {
        "v": PROFILE_VERSION,
        "target": _file_identity(target_path),
        "draft": None if draft is None else (draft if draft == "ngram" else _file_identity(draft)),
        "lib": _file_identity(native.library_path()),
        "threads": n_threads, "gpu_layers": n_gpu_layers, "bucket": bucket,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _path(key: str) -> Path:
    d = cache_dir() / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{key}.json"


def load(key: str) -> Costs | None:
    try:
        return Costs.from_dict(json.loads(_path(key).read_text()))
    except (OSError, ValueError):
        return None


def save(key: str, costs: Costs) -> None:
    path = _path(key)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(costs.to_dict()))
    os.replace(tmp, path)
