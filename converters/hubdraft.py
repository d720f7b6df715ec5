"""A draft checkpoint repo as a draft: `--draft deepseek-ai/dspark_qwen3_8b_block7` (or a standard
EAGLE-3 repo) is converted against the chosen target once and the GGUF reused afterwards.

A Hub id whose repo holds GGUFs is a GGUF draft (runtime/hub.py picks the file); one that holds
config.json and *.safetensors is a checkpoint, converted by `convert` (with all its checks) into
the specgguf cache, under drafts/<org>--<repo>-<commit>-<target fingerprint>.gguf: the same
checkpoint revision against the same target file finds it there and loads it without converting.
The commit comes from the Hub, or offline from the cache's snapshot (a branch through its refs/).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from specgguf.errors import UserError
from specgguf.runtime import hub
from specgguf.runtime.paths import cache_dir as specgguf_cache

_SAMPLE = 8 << 20  # bytes read from each end of the target for its fingerprint


def target_fingerprint(path) -> str:
    """A content fingerprint of a GGUF, cheap on a multi-GB file: its size, its first 8 MiB
    (the header: metadata, tokenizer, tensor table) and its last 8 MiB, hashed."""
    path = Path(path)
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_SAMPLE))
        if size > 2 * _SAMPLE:
            f.seek(size - _SAMPLE)
        h.update(f.read(_SAMPLE))
    return h.hexdigest()[:16]


def is_checkpoint(files: list[str]) -> bool:
    """config.json and safetensors weights at the top: what `convert` reads."""
    top = [f for f in files if "/" not in f]
    return "config.json" in top and any(f.endswith(".safetensors") for f in top)


def resolve_draft(spec, target_path, *, offline: bool | None = None, cache_dir=None, quiet: bool = False):
    """A draft model's reference (a DraftSpec's `model`: a path, a GGUF's Hub id, or a
    checkpoint repo's, which is converted against `target_path` once, or found converted in the
    specgguf cache) as a local GGUF path."""
    ref = hub.parse(spec)
    if ref is None or ref.quant is not None or ref.filename is not None:
        return hub.resolve_draft(spec, offline=offline, cache_dir=cache_dir)
    listing = hub.list_files(ref, offline=offline, cache_dir=cache_dir)
    if hub.gguf_groups(listing.files) or not is_checkpoint(listing.files):
        return os.fspath(hub.download(listing, hub.pick(listing), what="draft", offline=offline,
                                      cache_dir=cache_dir)[0])
    return os.fspath(converted(listing, target_path, offline=offline, cache_dir=cache_dir, quiet=quiet))


def converted_path(listing: hub.Listing, target_path) -> Path:
    """Where the conversion of this checkpoint revision for this target lives in the cache."""
    if not listing.commit:
        raise UserError(f"cannot tell which revision of {listing.ref.repo_id} this is (no commit): pass a converted "
                        "draft GGUF (specgguf convert)")
    name = listing.ref.repo_id.replace("/", "--")
    return specgguf_cache() / "drafts" / f"{name}-{listing.commit[:12]}-{target_fingerprint(target_path)}.gguf"


def converted(listing: hub.Listing, target_path, *, offline: bool | None = None, cache_dir=None,
              quiet: bool = False) -> Path:
    """The checkpoint converted against the target: from the cache, else converted now (once)."""
    out = converted_path(listing, target_path)
    if out.is_file():
        return out
    from .checkpoints import _ALLOW
    from .convert import convert

    hf = hub._hub()
    try:
        directory = hf.snapshot_download(listing.ref.repo_id, revision=listing.commit, allow_patterns=_ALLOW,
                                         cache_dir=hub.hub_cache_dir(cache_dir),
                                         local_files_only=listing.cached or hub.is_offline(offline))
    except Exception as exc:  # not cached offline, a broken connection, ...
        raise UserError(f"cannot fetch the checkpoint {listing.ref.repo_id}@{listing.commit[:12]}: "
                        f"{hub._first_line(exc)}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = None
    if not quiet:
        print(f"specgguf: converting {listing.ref.repo_id} for {Path(target_path).name} (once; cached as "
              f"{out.name})", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if quiet:
            return
        if bar is None:
            from tqdm.auto import tqdm  # the bars huggingface_hub's downloads show

            bar = tqdm(total=total, unit="B", unit_scale=True, desc="converting", file=sys.stderr)
        bar.update(done - bar.n)

    def warn(text: str) -> None:
        if not quiet:
            print(f"warning: {text}", file=sys.stderr)

    try:
        convert(os.fspath(directory), target_path, out, progress=progress, warn=warn, offline=True)
    finally:
        if bar is not None:
            bar.close()
    return out
