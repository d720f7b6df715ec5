"""Does the loaded llama.cpp build's AMX path work on this CPU? Decided before the first model load.

Intel Xeons since Sapphire Rapids (most cloud VMs) have AMX. llama-cpp-python's default pip
build compiles llama.cpp with GGML_NATIVE, so on such a CPU it builds the AMX backend, and GCC
before 13.2.1 miscompiles its `_tile_loadconfig` (the 64-byte tile configuration is passed as an
8-byte operand, the stores that fill it are dropped, `ldtilecfg` raises #GP): the first matrix
multiply kills the process with SIGSEGV, silently. docs/machines.md has the story and the fixes.

So, once per library build and CPU model, a child process loads a tiny Q8_0 model (shapes the AMX
kernels take) with the default buffers and decodes a few tokens. A child that dies by a signal,
fails or hangs is a bad verdict: every model of this process is then loaded with
`use_extra_bufts = false`, which keeps weights out of the AMX buffer type (and out of the CPU
repack buffers), and one line says so. The verdict is cached in the user cache, keyed by the
library files' SHA-256 and the CPU model, so later runs pay a stat and a JSON read.

No probe runs where it cannot matter: a CPU without `amx_tile`, or a build whose system info has
no `AMX_INT8`. `SPECGGUF_AMX=on` (trust the build) or `off` (always fall back), or
`specgguf --amx on|off`, skips the probe either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .paths import cache_dir, read_json, write_json

ENV = "SPECGGUF_AMX"
MODES = ("auto", "on", "off")
PROBE_TIMEOUT_S = 120.0  # a 1-layer model decodes in well under a second; a hang is a bad verdict
# Measured on a 2-core Xeon (Sapphire Rapids, AMX) with the embedded Gemma 3 270M: docs/machines.md.
FALLBACK_COST = "measured: no slower than a build without AMX"
FIX = ("For a build that uses AMX, build llama-cpp-python with GCC >= 13.2 or clang; with this "
       "compiler, `specgguf build-llama --cpu` (or the CMAKE_ARGS line in the README) builds one "
       "without AMX that needs no fallback")

# The probe child: the very library (LLAMA_CPP_LIB_PATH), default model params, a decode of
# 8 tokens (a batch: the AMX kernels take batches of 2+ rows), then 2 single-token decodes.
# Exit 0 when all of it ran.
_CHILD = """
import sys
from llama_cpp import llama_cpp as C
quiet = C.llama_log_callback(lambda *a: None)  # kept referenced: a collected callback is a dangling pointer
C.llama_log_set(quiet, None)
C.llama_backend_init()
m = C.llama_model_load_from_file(sys.argv[1].encode(), C.llama_model_default_params())
if not m:
    sys.exit(4)
cp = C.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_threads, cp.n_threads_batch = 64, 64, 2, 2
ctx = C.llama_init_from_model(m, cp)
if not ctx:
    sys.exit(5)
for toks in ([1, 2, 3, 4, 5, 6, 7, 8], [9], [10]):
    arr = (C.llama_token * len(toks))(*toks)
    if C.llama_decode(ctx, C.llama_batch_get_one(arr, len(toks))) != 0:
        sys.exit(6)
sys.exit(0)
"""


@dataclass
class Verdict:
    """What this process does about AMX, and why (`specgguf doctor` prints it)."""

    state: str  # no-amx-cpu | no-amx-build | works | crashes | forced-on | forced-off
    fallback: bool  # True: models load with use_extra_bufts = false
    detail: str
    probed: bool = False  # the probe ran in this process (not read from the cache)
    seconds: float = 0.0  # what deciding cost in this process

    def to_dict(self) -> dict:
        return asdict(self)


def mode() -> str:
    """auto (probe when it matters), on (trust the build) or off (always fall back)."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        from ..errors import UserError

        raise UserError(f"{ENV}={value!r} is not one of {', '.join(MODES)}: unset it or pick one", param=ENV)
    return value


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """True when the CPU reports AMX tiles (Linux /proc/cpuinfo `flags`)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return "amx_tile" in line.split(":", 1)[-1].split()
    return False


def cpu_model(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[-1].strip()
    return platform.processor() or platform.machine()


def build_has_amx(system_info: str) -> bool:
    """llama.cpp's own system info lists `AMX_INT8 = 1` in a build with the AMX backend."""
    return "AMX_INT8 = 1" in system_info


def library_files(lib: str) -> list[Path]:
    """The files whose bytes decide the verdict: libllama and the ggml libraries beside it."""
    path = Path(lib).resolve()
    found = {path}
    for pattern in ("libggml*.so*", "libggml*.dylib", "ggml*.dll"):
        found.update(p.resolve() for p in path.parent.glob(pattern) if p.is_file())
    return sorted(found)


def cache_file() -> Path:
    return cache_dir(create=False) / "amx-verdicts.json"


def decide(lib: str, system_info: str, *, cpuinfo: str | None = None, child: list[str] | None = None,
           timeout: float = PROBE_TIMEOUT_S, notify=None) -> Verdict:
    """The verdict for library `lib` on this CPU. `child` replaces the probe's command line
    (tests: a child that dies by a signal, or hangs); `notify` gets the one-line notice
    (default: stderr)."""
    start = time.perf_counter()
    forced = mode()
    if forced == "on":
        return Verdict("forced-on", False, f"{ENV}=on: the build's AMX path is used without a probe")
    if forced == "off":
        return Verdict("forced-off", True, f"{ENV}=off: models load without AMX and CPU repack buffers")
    if not cpu_has_amx(cpuinfo):
        return Verdict("no-amx-cpu", False, "this CPU has no AMX: nothing to check")
    if not build_has_amx(system_info):
        return Verdict("no-amx-build", False, "this llama.cpp build has no AMX backend: nothing to check")
    key = _key(lib, cpu_model(cpuinfo))
    cache = _read_cache()
    entry = cache.get("verdicts", {}).get(key) if key else None
    if isinstance(entry, dict) and entry.get("state") in ("works", "crashes"):
        v = Verdict(entry["state"], entry["state"] == "crashes", str(entry.get("detail", "")))
        v.seconds = time.perf_counter() - start
        return v
    ok, why = _probe(child, lib, timeout)
    if ok:
        v = Verdict("works", False, "the build's AMX kernels ran a probe model on this CPU")
    else:
        v = Verdict("crashes", True, f"the build's AMX kernels fail on this CPU ({why}); models load "
                                     f"without AMX and CPU repack buffers")
        (notify or _stderr)(f"specgguf: this llama.cpp build {why} in its AMX kernels on this CPU "
                            f"(a known GCC < 13.2 miscompile); running without AMX and CPU weight repacking "
                            f"({FALLBACK_COST}). {FIX}. `specgguf doctor` shows it again.")
    v.probed = True
    v.seconds = time.perf_counter() - start
    if key:
        cache.setdefault("verdicts", {})[key] = {"state": v.state, "detail": v.detail, "cpu": cpu_model(cpuinfo),
                                                 "library": str(Path(lib).resolve())}
        _write_cache(cache)
    return v


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _probe(child: list[str] | None, lib: str, timeout: float) -> tuple[bool, str]:
    """(ran cleanly, what went wrong in words)."""
    with tempfile.TemporaryDirectory(prefix="specgguf-amx-") as tmp:
        cmd = child
        if cmd is None:
            model = _probe_model(Path(tmp))
            cmd = [sys.executable, "-c", _CHILD, str(model)]
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(Path(lib).resolve().parent), ENV: "on"}
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False, f"hangs (no answer in {timeout:.0f} s)"
        except OSError as exc:
            return False, f"could not be probed ({exc})"
    if proc.returncode == 0:
        return True, ""
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return False, f"crashes ({name})"
    return False, f"fails (probe exit code {proc.returncode})"


def _probe_model(folder: Path) -> Path:
    """A 1-layer qwen3 with Q8_0 matrices whose rows and columns the AMX kernels take
    (multiples of 32)."""
    from ..synthetic.qwen3 import QwenShape, write_qwen3

    shape = QwenShape(n_layer=1, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_merges=40)
    return write_qwen3(folder / "amx-probe.gguf", shape, quant="Q8_0")


def _key(lib: str, cpu: str) -> str | None:
    """SHA-256 of the library files and the CPU model. Hashes are remembered per (path, size,
    mtime), so an unchanged library is hashed once, not at every start."""
    try:
        files = library_files(lib)
        stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    except OSError:
        return None
    cache = _read_cache()
    memo = cache.get("hashes", {})
    stamp = json.dumps(stats)
    digest = memo.get(stamp)
    if digest is None:
        h = hashlib.sha256()
        for p in files:
            h.update(p.name.encode() + b"\0")
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        digest = h.hexdigest()
        cache["hashes"] = {stamp: digest}  # one library at a time is enough to skip rehashing
        _write_cache(cache)
    return f"{digest}|{cpu}"


def _read_cache() -> dict:
    return read_json(cache_file())


def _write_cache(data: dict) -> None:
    write_json(cache_file(), data)
