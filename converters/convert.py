"""One conversion, end to end: locate, classify, check against the target, plan, write.

The CLI (cli.py) and the Python API both call `convert`; it prints nothing itself, so that
callers decide how progress and warnings look.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from specgguf.errors import UserError
from specgguf.runtime.ggufinfo import read_gguf

from . import registry
from .checkpoints import detect_kind, load_config, locate
from .deepspec import plan_dspark
from .deepspec_eagle3 import plan_deepspec_eagle3, refuse_backbone
from .eagle3 import plan_eagle3
from .safetensors import Weights
from .writer import OUT_TYPES, check_output_path, remove_stale_partials, write_draft

HEADS = ("shared", "own")


@dataclass
class Result:
    path: Path
    kind: str
    backbone: str
    target_layers: list
    block_size: int | None
    tensors: int
    types: dict
    size_bytes: int
    head: str
    cost_ratio: float | None  # weights read per draft step / per target step (estimate)
    summary: dict


def convert(checkpoint: str, target: str | Path, out: str | Path | None = None, out_type: str = "f16",
            head: str = "shared", *, progress: Callable[[int, int], None] | None = None,
            warn: Callable[[str], None] | None = None, offline: bool = False) -> Result:
    """Convert a DeepSpec DFlash/DSpark, a community DFlash/DSpark/DFlash 2 or a standard EAGLE-3
    checkpoint to a draft GGUF.

    `progress(done_bytes, total_bytes)` is called as tensors are written; `warn(text)` gets
    non-fatal findings. Bad input raises `UserError` and leaves no output file.
    """
    warn = warn or (lambda text: None)
    if out_type not in OUT_TYPES:
        raise _arg_error(f"unknown out_type {out_type!r}; use one of {', '.join(OUT_TYPES)}", "out_type")
    if head not in HEADS:
        raise _arg_error(f"unknown head {head!r}; use 'shared' or 'own'", "head")
    entry = registry.find(checkpoint)
    if entry is not None and entry["kind"] == "eagle3":
        from .checkpoints import Kind  # refuse before downloading gigabytes

        refuse_backbone(Kind("deepspec-eagle3", entry["backbone"], "deepspec-eagle3"))
    tgt = read_gguf(target, "target")
    if entry is not None and entry.get("target_archs") and tgt.arch not in entry["target_archs"]:
        raise UserError(f"{entry['repo']} is a {entry['backbone']} draft for {entry['target']}, but the target "
                        f"{tgt.path.name} has architecture {tgt.arch!r}: pair it with a "
                        f"{' or '.join(entry['target_archs'])} target GGUF")  # before downloading gigabytes
    if out is None:
        try:
            out = Path.cwd() / f"{_stem(checkpoint)}-{out_type}.gguf"
        except OSError:  # the current directory was deleted under us
            raise _arg_error("the current directory no longer exists; give the output path (out)", "out") from None
    out_path = check_output_path(Path(out), tgt.path)
    remove_stale_partials(out_path)  # left by a killed run; even if this one fails later

    directory = locate(checkpoint, offline=offline)
    config = load_config(directory)
    kind = detect_kind(config)
    if kind.family == "deepspec-eagle3":
        refuse_backbone(kind)
    config.setdefault("_name_or_path", entry["repo"] if entry else _stem(checkpoint))
    with Weights(directory) as weights:
        if kind.family in ("deepspec-dspark", "dflash"):  # DeepSpec's and the community layouts
            plan = plan_dspark(config, weights, kind, tgt, head, warn)
        elif kind.family == "deepspec-eagle3":
            plan = plan_deepspec_eagle3(config, weights, kind, tgt, head, warn)
        else:
            plan = plan_eagle3(config, weights, kind, tgt, head, warn)
        total, done = plan.source_bytes, 0

        def step(nbytes: int) -> None:
            nonlocal done
            done += nbytes
            if progress is not None:
                progress(done, total)

        stats = write_draft(plan, tgt, out_path, out_type, step)
    return Result(path=stats["path"], kind=kind.name, backbone=kind.backbone,
                  target_layers=plan.summary["target_layers"], block_size=plan.summary.get("block_size"),
                  tensors=stats["tensors"], types=stats["types"], size_bytes=stats["bytes"], head=head,
                  cost_ratio=_cost_ratio(stats["path"], tgt), summary=plan.summary)


def _arg_error(message: str, param: str) -> UserError:
    """A UserError about one argument: `param` is its Python name, which the CLI shows as its flag."""
    err = UserError(message)
    err.param = param
    return err


def _stem(checkpoint: str) -> str:
    name = Path(checkpoint.rstrip("/")).name or "draft"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


# Tensors read through get_rows (a few rows per token), not whole, in a forward pass.
_ROW_LOOKUPS = ("token_embd.weight", "markov_w1.weight", "per_layer_token_embd.weight")


def _cost_ratio(draft_path: Path, target) -> float | None:
    """Bytes of weights one draft step reads / bytes one target step reads (memory-bound)."""
    import gguf

    from specgguf.runtime.ggufinfo import read_gguf

    def weight_bytes(info) -> dict:
        out = {}
        for name, shape in info.tensors.items():
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[info.tensor_types[name]]]
            out[name] = int(np.prod(shape, dtype=np.int64)) // block * size
        return out

    try:
        tgt = weight_bytes(target)
        drf = weight_bytes(read_gguf(draft_path, "draft"))
    except Exception:  # an estimate only: never fail a finished conversion over it
        return None
    t_total = sum(v for k, v in tgt.items() if k not in _ROW_LOOKUPS)
    d_total = sum(v for k, v in drf.items() if k not in _ROW_LOOKUPS)
    if "output.weight" not in drf:  # the borrowed head is read by every draft step too
        d_total += tgt.get("output.weight", tgt.get("token_embd.weight", 0))
    return d_total / t_total if t_total else None
