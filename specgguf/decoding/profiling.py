"""Cost profiles: measured per (target, draft, backend, threads, context depth), cached on disk.

A profile is what `tuning.Costs` learned: V(n) by draft length and the draft's own costs;
the drafter's `tuning.Calibration` (its confidence -> acceptance) is kept beside it.
It is keyed by everything that changes them (the model files' identity, the llama.cpp
library, threads, GPU layers, a depth bucket), so a changed file or setting simply misses
the cache and is measured again, lazily, by the first rounds of a real generation.

The verify curve belongs to the target (and the machine), not to the draft: it is stored
apart, so what one drafter's runs measured (say `ngram`) seeds the next one (`suffix`, a
model draft). Drafters that read the target's layer inputs (eagle3, dflash, dspark) change
the target's pass, so their curve is keyed by the draft too.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from ..runtime.paths import cache_dir
from .calibration import Calibration
from .tuning import Costs

PROFILE_VERSION = 2


def depth_bucket(pos: int) -> int:
    """Context depth buckets: 0 (< 512 tokens), then one per doubling (512, 1024, 2048, ...)."""
    return 0 if pos < 512 else (pos // 512).bit_length()


def _file_identity(path) -> list:
    st = os.stat(path)
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


def _draft_identity(draft):
    """A draft file's identity, a kind's name (ngram, suffix), or both parts of a hybrid
    (Drafter.profile_id: a (lookup, draft) pair)."""
    if draft is None:
        return None
    if isinstance(draft, (tuple, list)):
        return [draft[0], _draft_identity(draft[1])]
    if os.path.isfile(draft):
        return _file_identity(draft)
    return draft


def profile_key(target_path, draft, n_threads: int, n_gpu_layers: int, bucket: int | str,
                rpc_servers: list[str] | None = None, kernels: str | None = None) -> str:
    """bucket: a depth bucket, or "calibration" (the drafter's confidence calibration, all depths).
    kernels: a non-default kernel choice that changes every cost ("batch-invariant")."""
    from ..runtime import native

    parts = {
        "v": PROFILE_VERSION,
        "target": _file_identity(target_path),
        "draft": _draft_identity(draft),
        "lib": _file_identity(native.library_path()),
        "threads": n_threads, "gpu_layers": n_gpu_layers, "bucket": bucket,
    }
    if rpc_servers:  # layers on other machines (README: Scale-out) cost what those machines take
        parts["rpc"] = list(rpc_servers)
    if kernels:
        parts["kernels"] = kernels
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _path(key: str) -> Path:
    d = cache_dir() / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{key}.json"


def load(key: str, kind=Costs):
    """A `kind` (Costs or Calibration) from the cache, or None."""
    try:
        return kind.from_dict(json.loads(_path(key).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def save(key: str, what) -> None:
    path = _path(key)
    tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")  # parallel slots save from threads
    tmp.write_text(json.dumps(what.to_dict()))
    os.replace(tmp, path)


class ProfileStore:
    """The costs of one (target, draft, settings) pair by depth bucket: loaded from the cache
    on first use of a bucket (else started from the nearest shallower one), saved after each
    generation. The verify curve is read from and written to the target's own profile unless
    `reads_features` (the draft changes the target's pass)."""

    def __init__(self, target_path, draft: str | None, n_threads: int, n_gpu_layers: int, block: bool = False,
                 reads_features: bool = False, rpc_servers: list[str] | None = None, kernels: str | None = None,
                 seed_kernels: str | None = None):
        """seed_kernels: where a bucket this key has never measured starts from instead of the
        prior (parallel sequences start from the one-sequence profile of the same target)."""
        self._key = lambda bucket: profile_key(target_path, draft, n_threads, n_gpu_layers, bucket, rpc_servers,
                                               kernels)
        self._seed = None if seed_kernels == kernels else \
            (lambda bucket: profile_key(target_path, draft, n_threads, n_gpu_layers, bucket, rpc_servers, seed_kernels))
        verify_draft = draft if reads_features else None
        self._verify_key = lambda bucket: profile_key(target_path, verify_draft, n_threads, n_gpu_layers, bucket,
                                                      rpc_servers, kernels)
        self.block = block
        self.buckets: dict[int, Costs] = {}
        self._dirty: set[int] = set()
        # parallel sequences share one store (decoding/sharedctx.py, decoding/slots.py): their threads save it, the
        # pass that measures it observes; one at a time
        self.lock = threading.RLock()
        self.calibration: Calibration | None = None  # set by `load_calibration`, saved with the costs

    def load_calibration(self, fresh: Calibration | None = None) -> Calibration:
        """A drafter's calibration as earlier runs left it (how often its confident drafts
        were right on this target): a new process starts where the last one ended instead
        of at `fresh` (the chooser's own, whose prior, not saved, belongs to the drafter kind)."""
        fresh = fresh or Calibration()
        self.calibration = load(self._key("calibration"), Calibration) or fresh
        self.calibration.doubt_power = fresh.doubt_power
        return self.calibration

    def _load(self, bucket: int) -> Costs | None:
        costs = load(self._key(bucket))
        shared = load(self._verify_key(bucket))
        if shared is not None and shared.verify:
            if costs is None:
                costs = Costs()
            costs.verify, costs.loaded = dict(shared.verify), dict(shared.verify)
        if (costs is None or not costs.verify) and self._seed is not None:
            seeded = load(self._seed(bucket))  # measured elsewhere: replaced as this key measures
            if seeded is not None and seeded.verify:
                costs = costs or Costs()
                costs.verify, costs.loaded = dict(seeded.verify), dict(seeded.verify)
        return costs

    def costs_for(self, pos: int) -> Costs:
        bucket = depth_bucket(pos)
        costs = self.buckets.get(bucket)
        if costs is None:
            with self.lock:
                return self._new_bucket(bucket)
        self._dirty.add(bucket)  # used this generation: saved after it
        return costs

    def _new_bucket(self, bucket: int) -> Costs:
        costs = self.buckets.get(bucket)
        if costs is None:
            costs = self._load(bucket)
            if costs is None:
                shallower = [b for b in self.buckets if b < bucket]
                costs = (Costs.from_dict(self.buckets[max(shallower)].to_dict()) if shallower
                         else Costs(block=self.block))
            costs.block = self.block
            self.buckets[bucket] = costs
        self._dirty.add(bucket)
        return costs

    def save(self) -> None:
        with self.lock:
            self._save()

    def _save(self) -> None:
        for bucket in list(self._dirty):
            costs = self.buckets[bucket]
            if costs.verify:
                try:
                    save(self._key(bucket), costs)
                    if self._verify_key(bucket) != self._key(bucket):
                        save(self._verify_key(bucket), Costs(dict(costs.verify)))
                except OSError:
                    pass  # a read-only cache only costs re-measuring next time
        self._dirty.clear()
        if self.calibration is not None:
            try:
                save(self._key("calibration"), self.calibration)
            except OSError:
                pass

