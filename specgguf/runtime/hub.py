"""Hugging Face ids wherever a model path is taken: `org/repo[@REVISION][:QUANT]` or
`org/repo[@REVISION]/path/in/repo/file.gguf`, downloaded through huggingface_hub (its cache,
~/.cache/huggingface, and its progress bars).

- `org/repo:QUANT` picks the repo's GGUF whose name carries QUANT (case-insensitive, between
  separators: `Q4_K` does not pick `Q4_K_M`); no QUANT means Q4_K_M, as llama.cpp's `-hf`
  (or the repo's only GGUF when it has just one). A split GGUF (`-00001-of-0000N.gguf`) is
  downloaded whole and its first part's path returned, which is what llama.cpp loads.
- `org/repo/dir/file.gguf` names one file; `@REVISION` (a branch, tag or commit) pins it:
  `org/repo@v1.0:Q8_0`, `org/repo@0123abcd.../file.gguf`. `hf.co/` in front is accepted too
  (ollama's spelling).
- Offline (`HF_HUB_OFFLINE=1`, or `offline=True`: the CLI's `--offline`) reads only the local
  cache, never the network; so does an online run that cannot reach the Hub. A file or quant
  that is not there is one line that lists the quants that are.
- A string that exists as a local path is always that path; one that starts with `.`, `/` or
  `~`, or whose repo part ends in `.gguf`, is a path too.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

DEFAULT_QUANT = "Q4_K_M"

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SPEC = re.compile(rf"^(?P<repo>{_NAME}/{_NAME})(?:@(?P<rev>[A-Za-z0-9._-]+))?"
                   rf"(?:(?P<file>/[^:@]+)|:(?P<quant>[A-Za-z0-9._-]+))?$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# A quant named in a file name: Q4_K_M, IQ3_XXS, Q8_0, F16, BF16, MXFP4, TQ1_0 (UD-, i1- prefixes aside).
_QUANT_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Z0-9]{1,4})*|BF16|F16|FP16|F32|MXFP4(?:_MOE)?|TQ[12]_0)"
                            r"(?![A-Za-z0-9])", re.I)


@dataclass(frozen=True)
class HubRef:
    """A parsed Hugging Face id: repo, optional revision, and either a quant or a file."""

    repo_id: str
    revision: str | None = None
    quant: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        if self.filename:
            return f"{self.repo_id}{rev}/{self.filename}"
        return f"{self.repo_id}{rev}" + (f":{self.quant}" if self.quant else "")


def parse(spec) -> HubRef | None:
    """The Hub id `spec` spells, or None when it is (or can only be) a local path."""
    if not isinstance(spec, str) or not spec or os.path.exists(spec) or spec.startswith((".", "/", "~")):
        return None
    s = spec
    for prefix in ("https://huggingface.co/", "hf.co/", "huggingface.co/", "hf://"):
        if s.startswith(prefix):
            s = s[len(prefix):]
            break
    m = _SPEC.match(s)
    if m is None or m["repo"].lower().endswith(".gguf"):
        return None
    filename = m["file"][1:] if m["file"] else None
    if filename is not None and (not filename.lower().endswith(".gguf") or ".." in filename.split("/")):
        return None
    return HubRef(m["repo"], m["rev"], m["quant"], filename)


def is_offline(offline: bool | None = None) -> bool:
    """offline as given, else HF_HUB_OFFLINE (read now, not when huggingface_hub was imported)."""
    if offline is not None:
        return bool(offline)
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_cache_dir(cache_dir=None) -> str | None:
    """The Hub cache to use: cache_dir as given, else HF_HUB_CACHE / HF_HOME read now (None:
    huggingface_hub's own default)."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]
    if env.get("HF_HOME"):
        return os.path.join(env["HF_HOME"], "hub")
    return None


def resolve(spec, *, what: str = "model", offline: bool | None = None, cache_dir=None):
    """`spec` as a local GGUF path: a Hub id is downloaded (or found in the cache); anything
    else (a path, a Path) comes back unchanged for the caller to open and check."""
    ref = parse(spec)
    if ref is None:
        return spec
    try:
        return fetch_gguf(ref, what=what, offline=offline, cache_dir=cache_dir)
    except UserError as exc:
        if ref.filename is None:
            raise
        raise UserError(f"{what} {spec} is no local file, and as a Hugging Face id: {exc}", param=exc.param) from None


def resolve_draft(model, *, offline: bool | None = None, cache_dir=None):
    """A draft model's reference (a DraftSpec's `model`: a path or a Hub id) as a local GGUF path."""
    return resolve(model, what="draft", offline=offline, cache_dir=cache_dir)


# -- listing a repo ------------------------------------------------------------------------

@dataclass
class Listing:
    """A repo's files at one revision: from the Hub (online) or from the cache's snapshot."""

    ref: HubRef
    files: list[str]
    commit: str | None  # the snapshot's commit hash, when known
    cached: bool  # True: read from the local cache (offline, or the Hub out of reach)
    snapshot: Path | None = None  # the cache's snapshot folder (when cached)


def list_files(ref: HubRef, *, offline: bool | None = None, cache_dir=None) -> Listing:
    """The files of ref's repo at ref's revision; offline from the cache only."""
    hub = _hub()
    cache = hub_cache_dir(cache_dir)
    if not is_offline(offline):
        try:
            info = hub.HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=False)
            return Listing(ref, sorted(s.rfilename for s in info.siblings or ()), info.sha, cached=False)
        except (hub.errors.GatedRepoError, hub.errors.RepositoryNotFoundError,
                hub.errors.RevisionNotFoundError) as exc:
            raise UserError(_hub_error(ref, exc)) from None
        except Exception as exc:  # no network, a proxy, a timeout: fall back to the cache
            unreachable = exc
    else:
        unreachable = None
    snapshot = cached_snapshot(ref, cache_dir=cache)
    if snapshot is None:
        where = hub_cache_dir(cache_dir) or "the Hugging Face cache"
        if unreachable is not None:
            raise UserError(f"cannot reach the Hugging Face Hub for {ref.repo_id} "
                            f"({_first_line(unreachable)}) and it is not in {where}: connect, or download it "
                            "elsewhere and pass the file's path") from None
        raise UserError(f"{ref.repo_id}{'@' + ref.revision if ref.revision else ''} is not in {where} and "
                        "offline mode (--offline or HF_HUB_OFFLINE=1) forbids downloading it: run once "
                        "online, or pass a local path") from None
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*")
                   if p.is_file())  # is_file follows the blob links: a dangling one is not there
    return Listing(ref, files, snapshot.name, cached=True, snapshot=snapshot)


def cached_snapshot(ref: HubRef, cache_dir=None) -> Path | None:
    """The cache's snapshot folder of ref's repo at ref's revision (a branch or tag through its
    refs/ file, or a commit hash), without touching the network; None when absent."""
    hub = _hub()
    try:
        folder = hub.snapshot_download(ref.repo_id, revision=ref.revision, cache_dir=hub_cache_dir(cache_dir),
                                       local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and friends: not cached
        return None
    path = Path(folder)
    return path if path.is_dir() else None


# -- picking and fetching a GGUF -----------------------------------------------------------

def gguf_groups(files: list[str]) -> dict[str, list[str]]:
    """The repo's model GGUFs (no mmproj projectors), split parts grouped under the first
    part's name, each group's parts in order."""
    groups: dict[str, list[str]] = {}
    for f in files:
        name = f.rsplit("/", 1)[-1]
        if not name.lower().endswith(".gguf") or name.lower().startswith("mmproj"):
            continue
        m = _SPLIT.search(f)
        if m is None:
            groups[f] = [f]
            continue
        total = int(m[2])
        first = f[:m.start()] + f"-00001-of-{total:05d}.gguf"
        groups[first] = [f[:m.start()] + f"-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
    return groups


def quant_of(path: str) -> str | None:
    """The quant a GGUF's name carries (upper case), or None."""
    stem = _SPLIT.sub("", path.rsplit("/", 1)[-1])
    stem = re.sub(r"\.gguf$", "", stem, flags=re.I)
    found = _QUANT_IN_NAME.findall(stem)
    return found[-1].upper() if found else None


def pick(listing: Listing) -> list[str]:
    """The parts of the GGUF the listing's ref names: its file, or its quant (default Q4_K_M,
    or the repo's only GGUF)."""
    ref = listing.ref
    groups = gguf_groups(listing.files)
    if ref.filename is not None:
        first = next((g for g, parts in groups.items() if ref.filename in parts), None)
        if first is None:
            raise UserError(f"{ref.repo_id} has no file {ref.filename}{_where(listing)}; "
                            f"{_available(groups, listing)}")
        return groups[first] if ref.filename == first else [ref.filename]
    if not groups:
        raise UserError(f"{ref.repo_id} has no GGUF file{_where(listing)}: give a GGUF repo "
                        "(org/repo:QUANT) or a file (org/repo/file.gguf)")
    want = ref.quant
    if want is None and len(groups) == 1:
        return next(iter(groups.values()))
    want = want or DEFAULT_QUANT
    pat = re.compile(rf"(?<![A-Za-z0-9]){re.escape(want)}(?![A-Za-z0-9_])", re.I)
    hits = [g for g in groups if pat.search(_SPLIT.sub("", g.rsplit("/", 1)[-1]))]
    if not hits:
        default = "" if ref.quant else " (the default when no :QUANT is given)"
        raise UserError(f"{ref.repo_id} has no {want} GGUF{default}{_where(listing)}; "
                        f"{_available(groups, listing)}")
    if len(hits) > 1:
        raise UserError(f"{ref.repo_id} has {len(hits)} GGUFs for {want}: {', '.join(hits)}; "
                        f"name one as {ref.repo_id}/FILE.gguf")
    return groups[hits[0]]


def fetch_gguf(ref: HubRef, *, what: str = "model", offline: bool | None = None, cache_dir=None) -> Path:
    """The local path of the GGUF `ref` names (its first part for a split one), downloading
    every part not yet cached (huggingface_hub's progress bars); offline from the cache only."""
    return download_listed(ref, pick, offline, cache_dir)


def download(listing: Listing, files: list[str], *, what: str = "model", offline: bool | None = None,
             cache_dir=None, local_dir=None) -> list[Path]:
    """Local paths of `files` of the listed repo (at the listed commit), fetched if needed."""
    hub = _hub()
    ref = listing.ref
    revision = listing.commit or ref.revision
    local = listing.cached or is_offline(offline)
    missing = [f for f in files if f not in listing.files]
    if missing:
        raise UserError(f"{what} {ref}: {', '.join(missing)} missing{_where(listing)} (a split GGUF needs all "
                        "its parts): run once online to fetch them")
    if listing.snapshot is not None and local_dir is None:  # listed from the cache: the files are there
        return [listing.snapshot / f for f in files]
    out = []
    for f in files:
        try:
            path = hub.hf_hub_download(ref.repo_id, f, revision=revision, cache_dir=hub_cache_dir(cache_dir),
                                       local_dir=local_dir, local_files_only=local)
        except (hub.errors.GatedRepoError, hub.errors.RepositoryNotFoundError, hub.errors.RevisionNotFoundError,
                hub.errors.EntryNotFoundError) as exc:
            raise UserError(_hub_error(ref, exc)) from None
        except hub.errors.LocalEntryNotFoundError:
            raise UserError(f"{what} {ref}: {f} is not in the local cache{_where(listing)}; run once online, "
                            "or pass a local path") from None
        except OSError as exc:  # connection lost mid-way, disk full
            raise UserError(f"cannot download {f} from {ref.repo_id}: {_first_line(exc)}") from None
        out.append(Path(path))
    return out


def glob_files(listing: Listing, pattern: str) -> list[str]:
    """The listed files matching a glob (on the path, or on the file name alone)."""
    return [f for f in listing.files if fnmatch.fnmatch(f, pattern) or fnmatch.fnmatch(f.rsplit("/", 1)[-1], pattern)]


def from_pretrained(repo_id: str, filename: str | None = None, *, additional_files=None, local_dir=None,
                    cache_dir=None, offline: bool | None = None) -> Path:
    """llama_cpp.Llama.from_pretrained's file choice, but able to run offline: `filename` is a
    glob over the repo's files (None: what `repo_id` alone would pick, the default quant),
    `additional_files` globs fetched beside it (a split GGUF's parts are fetched whole anyway).
    repo_id may carry a revision, 'org/repo@REV'. Returns the model's local path."""
    ref = parse(repo_id) if isinstance(repo_id, str) else None
    if ref is None:
        raise UserError(f"repo_id must be a Hugging Face repo id like 'org/repo' (got {repo_id!r})", param="repo_id")
    if filename is None:
        return download_listed(ref, pick, offline, cache_dir, local_dir, additional_files)
    if not isinstance(filename, str) or not filename:
        raise UserError(f"filename must be a glob string like '*Q4_K_M.gguf' (got {filename!r})", param="filename")
    if ref.filename or ref.quant:
        raise UserError(f"give the file once: repo_id {repo_id!r} names one already, and so does filename",
                        param="filename")

    def by_glob(listing: Listing) -> list[str]:
        groups = gguf_groups(listing.files)
        hits = gguf_groups([f for f in glob_files(listing, filename) if f.lower().endswith(".gguf")])
        if not hits:
            raise UserError(f"no GGUF in {ref.repo_id} matches {filename!r}{_where(listing)}; "
                            f"{_available(groups, listing)}", param="filename")
        if len(hits) > 1:
            raise UserError(f"{filename!r} matches {len(hits)} GGUFs in {ref.repo_id}: {', '.join(hits)}; "
                            "give a narrower filename", param="filename")
        first = next(iter(hits))
        return groups.get(first, hits[first])

    return download_listed(ref, by_glob, offline, cache_dir, local_dir, additional_files)


def download_listed(ref: HubRef, choose, offline, cache_dir, local_dir=None, additional_files=None) -> Path:
    """List ref's repo, `choose(listing)` the GGUF's parts, add the `additional_files` globs,
    fetch them all; the chosen GGUF's (first) path."""
    listing = list_files(ref, offline=offline, cache_dir=cache_dir)
    parts = choose(listing)
    extra: list[str] = []
    for pattern in additional_files or ():
        hits = glob_files(listing, pattern)
        if not hits:
            raise UserError(f"no file in {ref.repo_id} matches additional_files {pattern!r}{_where(listing)}",
                            param="additional_files")
        extra += [h for h in hits if h not in parts and h not in extra]
    return download(listing, parts + extra, offline=offline, cache_dir=cache_dir, local_dir=local_dir)[0]


# -- messages ------------------------------------------------------------------------------

def _where(listing: Listing) -> str:
    rev = f"@{listing.ref.revision}" if listing.ref.revision else ""
    return f" in the local cache ({listing.ref.repo_id}{rev})" if listing.cached else ""


def _available(groups: dict[str, list[str]], listing: Listing) -> str:
    if not groups:
        return "it holds no GGUF" + (" yet (only files fetched before are cached)" if listing.cached else "")
    quants = sorted({q for q in map(quant_of, groups) if q})
    there = "cached" if listing.cached else "available"
    if quants:
        return f"quants {there}: {', '.join(quants)} (pick one as {listing.ref.repo_id}:QUANT)"
    return f"GGUFs {there}: {', '.join(sorted(groups))} (pick one as {listing.ref.repo_id}/FILE.gguf)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _hub_error(ref: HubRef, exc: BaseException) -> str:
    hub = _hub()
    if isinstance(exc, hub.errors.GatedRepoError):
        return (f"{ref.repo_id} is gated: accept its license on huggingface.co and log in (hf auth login), "
                "or pass a local file")
    if isinstance(exc, hub.errors.RevisionNotFoundError):
        return f"{ref.repo_id} has no revision {ref.revision!r}: check the branch, tag or commit after '@'"
    if isinstance(exc, hub.errors.EntryNotFoundError):
        return f"{ref.repo_id} has no such file ({_first_line(exc)})"
    return (f"no Hugging Face repo {ref.repo_id} (or it is private or gated: log in with `hf auth login`); "
            "check the id")


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.errors  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency of specgguf
        raise UserError("huggingface_hub is not installed: pip install huggingface_hub, or pass a local path") from None
    return huggingface_hub
